"""The group mapping applied at a login (sso.services.login_apply_groups), on the real
database: what a person's groups make them, and what a login leaves alone."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError
from django.test import Client

from shares.models import Membership
from sso.models import TEAM_NOT_FOR_ADMIN, TEAM_REQUIRED, GroupMapping, LoginRecord
from sso.services import login_apply_groups

pytestmark = pytest.mark.django_db


def roles_of(user) -> list[tuple[str, str]]:
    return sorted(user.memberships.values_list("team__slug", "role"))


def test_a_lead_group_wins_over_a_member_group_of_the_same_team(oscar, vision_team):
    GroupMapping.objects.create(group="vision-all", team=vision_team, role="MEMBER")
    GroupMapping.objects.create(group="vision-leads", team=vision_team, role="LEAD")
    record = login_apply_groups(user=oscar, groups=["vision-all", "vision-leads"], subject="s")
    assert roles_of(oscar) == [("vision", "LEAD")]
    assert record.memberships == {"vision": "LEAD"}
    assert record.changes == ["joined vision as lead"]


def test_a_role_that_changes_is_updated_and_recorded(carol, vision_team):
    """carol leads vision by hand; her groups now make her a member: the login says so."""
    GroupMapping.objects.create(group="vision-all", team=vision_team, role="MEMBER")
    record = login_apply_groups(user=carol, groups=["vision-all"], subject="s")
    assert roles_of(carol) == [("vision", "MEMBER")]
    assert record.changes == ["vision: lead → member"]


def test_groups_no_mapping_names_change_nothing_and_a_login_without_changes_says_so(
    bob, research_team
):
    """bob is a member of ML Research by hand and no mapping names it: his login keeps it."""
    record = login_apply_groups(user=bob, groups=["unknown-group"], subject="s")
    assert roles_of(bob) == [("ml-research", "MEMBER")]
    assert record.changes == [] and record.groups == ["unknown-group"]
    assert record.outcome == LoginRecord.Outcome.LOGGED_IN


def test_admin_rights_follow_the_groups_only_while_an_admin_mapping_exists(root, oscar):
    """Without any admin mapping the admin's rights are the admin's business: root stays one.
    Once a mapping exists, root without the group is no admin after the login."""
    login_apply_groups(user=root, groups=[], subject="r")
    root.refresh_from_db()
    assert root.is_superuser
    GroupMapping.objects.create(group="portal-admins", role="ADMIN")
    record = login_apply_groups(user=root, groups=[], subject="r")
    root.refresh_from_db()
    assert not root.is_superuser and not root.is_staff
    assert record.changes == ["no longer an admin"] and not record.admin
    login_apply_groups(user=oscar, groups=["portal-admins"], subject="o")
    oscar.refresh_from_db()
    assert oscar.is_staff and oscar.is_superuser


def test_a_mapping_names_a_team_unless_it_makes_admins(vision_team):
    with pytest.raises(ValidationError) as error:
        GroupMapping(group="g", role="LEAD").full_clean()
    assert error.value.message_dict["team"] == [TEAM_REQUIRED]
    with pytest.raises(ValidationError) as error:
        GroupMapping(group="g", role="ADMIN", team=vision_team).full_clean()
    assert error.value.message_dict["team"] == [TEAM_NOT_FOR_ADMIN]
    with pytest.raises(IntegrityError):  # the database holds the rule too
        GroupMapping.objects.create(group="g", role="MEMBER")


def test_deleting_a_team_deletes_its_mappings_not_its_members_memberships_elsewhere(
    alice, vision_team, research_team
):
    GroupMapping.objects.create(group="vision-leads", team=vision_team, role="LEAD")
    Membership.objects.filter(team=vision_team).delete()
    vision_team.delete()
    assert not GroupMapping.objects.exists()
    assert roles_of(alice) == [("ml-research", "LEAD")]


def test_the_admin_edits_the_mapping_table(root, vision_team):
    """The admin adds a mapping in the admin site; one without the team it needs is refused
    with the rule."""
    client = Client()
    client.force_login(root)
    response = client.post(
        "/admin/sso/groupmapping/add/",
        {"group": "vision-leads", "team": vision_team.pk, "role": "LEAD"},
    )
    assert response.status_code == 302
    assert str(GroupMapping.objects.get()) == "vision-leads → lead of Vision"
    response = client.post("/admin/sso/groupmapping/add/", {"group": "x", "role": "MEMBER"})
    assert response.status_code == 200 and TEAM_REQUIRED in response.content.decode()
    assert client.get("/admin/sso/loginrecord/").status_code == 200

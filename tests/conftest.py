"""Personas shared by the tests: carol leads the lender team vision, alice leads the borrower
team ml-research, bob is a member of ml-research, oscar is an outsider, root is the admin."""

from __future__ import annotations

import pytest

from shares.models import Membership, QuotaShare, ShareChange, Team
from shares.services import share_create


@pytest.fixture
def root(django_user_model):
    return django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-1234")


@pytest.fixture
def vision_team(db) -> Team:
    return Team.objects.create(name="Vision", slug="vision")


@pytest.fixture
def research_team(db) -> Team:
    return Team.objects.create(name="ML Research", slug="ml-research")


@pytest.fixture
def carol(django_user_model, vision_team):
    user = django_user_model.objects.create_user("carol", password="pw-carol-1234")
    Membership.objects.create(team=vision_team, user=user, role=Membership.Role.LEAD)
    return user


@pytest.fixture
def alice(django_user_model, research_team):
    user = django_user_model.objects.create_user("alice", password="pw-alice-1234")
    Membership.objects.create(team=research_team, user=user, role=Membership.Role.LEAD)
    return user


@pytest.fixture
def bob(django_user_model, research_team):
    user = django_user_model.objects.create_user("bob", password="pw-bob-1234")
    Membership.objects.create(team=research_team, user=user, role=Membership.Role.MEMBER)
    return user


@pytest.fixture
def oscar(django_user_model):
    return django_user_model.objects.create_user("oscar", password="pw-oscar-1234")


@pytest.fixture
def vision_share(vision_team) -> QuotaShare:
    """The lender: 8 h100, LEND."""
    return share_create(
        name="vision",
        team=vision_team,
        capacity_limits={"h100": 8},
        strategy=QuotaShare.Strategy.LEND,
        source=ShareChange.Source.COMMAND,
    )


@pytest.fixture
def research_share(research_team) -> QuotaShare:
    """The borrower: 8 h100, LEND_AND_BORROW, no borrow cap."""
    return share_create(
        name="research",
        team=research_team,
        capacity_limits={"h100": 8},
        strategy=QuotaShare.Strategy.LEND_AND_BORROW,
        source=ShareChange.Source.COMMAND,
    )

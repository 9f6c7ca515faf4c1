"""The admin site: the first thing an admin sees."""

from __future__ import annotations

import pytest
from django.urls import reverse

from scheduler.models import Job, Node
from shares.models import MAX_GPUS_POSITIVE, QuotaShare, ShareChange
from shares.selectors import NO_NODES, OVERPROMISED


@pytest.fixture
def admin_client(client, root):
    client.force_login(root)
    return client


def share_form(team, **overrides) -> dict:
    data = {
        "name": "speech",
        "team": team.pk,
        "state": "ENABLED",
        "strategy": "LEND_AND_BORROW",
        "borrow_limit": "-1",
        "weight": "1.0",
        "in_share_preemption": "",
        "grace_seconds": "120",
        "min_runtime_seconds": "0",
        "capacity_limits-TOTAL_FORMS": "1",
        "capacity_limits-INITIAL_FORMS": "0",
        "capacity_limits-MIN_NUM_FORMS": "1",
        "capacity_limits-MAX_NUM_FORMS": "5",
        "capacity_limits-0-gpu_type": "h100",
        "capacity_limits-0-max_gpus": "8",
        "capacity_limits-0-lend_limit": "",
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v != ""}


@pytest.mark.django_db
class TestShareAdmin:
    def test_list_shows_limits_and_settings(self, admin_client, vision_share, research_share):
        response = admin_client.get(reverse("admin:shares_quotashare_changelist"))
        assert response.status_code == 200
        page = response.content.decode()
        for text in ("vision", "research", "h100: 8", "LEND_AND_BORROW", "unlimited", "all idle"):
            assert text in page

    def test_list_filters_by_strategy(self, admin_client, vision_share, research_share):
        url = reverse("admin:shares_quotashare_changelist") + "?strategy__exact=LEND"
        page = admin_client.get(url).content.decode()
        assert f'href="/admin/shares/quotashare/{vision_share.pk}/change/' in page
        assert f"/admin/shares/quotashare/{research_share.pk}/change/" not in page

    def test_add_a_share_with_its_limits_records_history(self, admin_client, vision_team, root):
        response = admin_client.post(
            reverse("admin:shares_quotashare_add"), share_form(vision_team)
        )
        assert response.status_code == 302, response.content.decode()[:2000]
        share = QuotaShare.objects.get(name="speech")
        assert share.limits == {"h100": 8}
        assert share.changes.filter(field="capacity_limits", changed_by=root).exists()
        assert share.changes.first().source == ShareChange.Source.ADMIN

    def test_an_invalid_save_shows_the_rule(self, admin_client, vision_team):
        response = admin_client.post(
            reverse("admin:shares_quotashare_add"),
            share_form(vision_team, strategy="LEND", borrow_limit="50"),
        )
        assert response.status_code == 200
        assert "only a LEND_AND_BORROW share may borrow" in response.content.decode()
        assert not QuotaShare.objects.filter(name="speech").exists()

    def test_a_limit_of_no_gpus_is_refused_once_naming_the_rule(self, admin_client, vision_team):
        response = admin_client.post(
            reverse("admin:shares_quotashare_add"),
            share_form(vision_team, **{"capacity_limits-0-max_gpus": "0"}),
        )
        assert response.status_code == 200
        errors = response.context["inline_admin_formsets"][0].formset.errors
        assert errors == [{"max_gpus": [MAX_GPUS_POSITIVE]}]
        assert not QuotaShare.objects.filter(name="speech").exists()

    def test_a_share_needs_a_capacity_limit(self, admin_client, vision_team):
        response = admin_client.post(
            reverse("admin:shares_quotashare_add"),
            share_form(
                vision_team,
                **{"capacity_limits-TOTAL_FORMS": "0", "capacity_limits-0-gpu_type": ""},
            ),
        )
        assert response.status_code == 200
        assert not QuotaShare.objects.filter(name="speech").exists()

    def test_change_records_who_changed_what(self, admin_client, vision_share, root):
        limit = vision_share.capacity_limits.get()
        data = share_form(
            vision_share.team,
            name="vision",
            strategy="LEND",
            grace_seconds="45",
            **{
                "capacity_limits-INITIAL_FORMS": "1",
                "capacity_limits-0-id": str(limit.pk),
                "capacity_limits-0-share": str(vision_share.pk),
                "capacity_limits-0-max_gpus": "6",
            },
        )
        response = admin_client.post(
            reverse("admin:shares_quotashare_change", args=[vision_share.pk]), data
        )
        assert response.status_code == 302, response.content.decode()[:3000]
        changes = {c.field: c for c in vision_share.changes.filter(changed_by=root)}
        assert changes["grace_seconds"].new_value == "45"
        assert changes["capacity_limits"].old_value == "h100: 8"
        assert changes["capacity_limits"].new_value == "h100: 6"
        page = admin_client.get(
            reverse("admin:shares_quotashare_change", args=[vision_share.pk])
        ).content.decode()
        assert "share-history" in page and "h100: 6" in page

    def test_disable_action_records_the_change(self, admin_client, vision_share, root):
        admin_client.post(
            reverse("admin:shares_quotashare_changelist"),
            {"action": "disable", "_selected_action": [vision_share.pk]},
        )
        vision_share.refresh_from_db()
        assert vision_share.state == QuotaShare.State.DISABLED
        assert vision_share.changes.filter(field="state", new_value="DISABLED").exists()

    def test_warns_when_shares_promise_more_than_nodes_have(
        self, admin_client, vision_share, research_share
    ):
        """h100: 16 promised, 8 in READY nodes (the DRAINING one does not count)."""
        Node.objects.create(name="a", gpu_type="h100", gpus=8)
        Node.objects.create(name="b", gpu_type="h100", gpus=8, state=Node.State.DRAINING)
        page = admin_client.get(reverse("admin:shares_quotashare_changelist")).content.decode()
        assert OVERPROMISED.format(gpu_type="h100", promised=16, capacity=8) in page

    def test_warns_when_a_type_has_no_nodes(self, admin_client, vision_share):
        page = admin_client.get(reverse("admin:shares_quotashare_changelist")).content.decode()
        assert NO_NODES.format(gpu_type="h100", promised=8) in page

    def test_no_warning_when_nodes_cover_the_shares(self, admin_client, vision_share):
        Node.objects.create(name="a", gpu_type="h100", gpus=8)
        page = admin_client.get(reverse("admin:shares_quotashare_changelist")).content.decode()
        assert "shares promise" not in page.lower()


@pytest.mark.django_db
class TestOtherAdminPages:
    def test_team_page_with_memberships(self, admin_client, alice, research_team):
        response = admin_client.get(reverse("admin:shares_team_change", args=[research_team.pk]))
        assert response.status_code == 200
        assert "alice" in response.content.decode()

    def test_drain_and_undrain_nodes(self, admin_client):
        node = Node.objects.create(name="a", gpu_type="h100", gpus=8)
        url = reverse("admin:scheduler_node_changelist")
        admin_client.post(url, {"action": "drain", "_selected_action": [node.pk]})
        node.refresh_from_db()
        assert node.state == Node.State.DRAINING
        admin_client.post(url, {"action": "undrain", "_selected_action": [node.pk]})
        node.refresh_from_db()
        assert node.state == Node.State.READY

    def test_jobs_are_read_only_and_can_be_cancelled(self, admin_client, research_share, alice):
        job = Job.objects.create(
            share=research_share, submitted_by=alice, gpu_type="h100", gpus=1,
            command="true", state=Job.State.RUNNABLE,
        )  # fmt: skip
        url = reverse("admin:scheduler_job_changelist")
        page = admin_client.get(url + "?state__exact=RUNNABLE").content.decode()
        assert "RUNNABLE" in page
        assert admin_client.get(reverse("admin:scheduler_job_add")).status_code == 403
        admin_client.post(url, {"action": "cancel", "_selected_action": [job.pk]})
        job.refresh_from_db()
        assert job.state == Job.State.CANCELLED
        assert job.events.filter(to_state=Job.State.CANCELLED).exists()

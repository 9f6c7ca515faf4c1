"""Odd edits in the admin: a node's identity and state, a share's name and its deletion. The
admin changes what the services let it change, and nothing a running job relies on."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from scheduler.cycle.run import cycle_run
from scheduler.jobs.selectors import held_off
from scheduler.models import (
    CHURN_WINDOW_RANGE,
    MAX_CHURN_WINDOW_SECONDS,
    ClusterSettings,
    Job,
    JobAttempt,
    Node,
)
from shares.models import QuotaShare, Team
from tests.conftest import make_node, place_a_borrower
from tests.shares.test_admin import share_form


@pytest.fixture
def admin_client(client, root):
    client.force_login(root)
    return client


def node_form(node: Node, **overrides) -> dict:
    data = {
        "name": node.name,
        "gpu_type": node.gpu_type,
        "gpus": str(node.gpus),
        "state": node.state,
        "labels": "{}",
        "state_reason": node.state_reason,
    }
    data.update(overrides)
    return data


def share_change_form(share: QuotaShare, **overrides) -> dict:
    """The change page of `share` as it shows it, with `overrides`."""
    limits = list(share.capacity_limits.all())
    data = share_form(
        share.team,
        name=share.name,
        strategy=share.strategy,
        grace_seconds=str(share.grace_seconds),
        **{
            "capacity_limits-TOTAL_FORMS": str(len(limits)),
            "capacity_limits-INITIAL_FORMS": str(len(limits)),
        },
    )
    for i, limit in enumerate(limits):
        data[f"capacity_limits-{i}-id"] = str(limit.pk)
        data[f"capacity_limits-{i}-share"] = str(share.pk)
        data[f"capacity_limits-{i}-gpu_type"] = limit.gpu_type
        data[f"capacity_limits-{i}-max_gpus"] = str(limit.max_gpus)
    data.update(overrides)
    return {k: v for k, v in data.items() if v != ""}


@pytest.fixture
def cycle_requests(monkeypatch) -> list[str]:
    """The cycles the share services asked for (one entry each)."""
    asked: list[str] = []
    monkeypatch.setattr("shares.services.request_cycle", lambda: asked.append("cycle"))
    return asked


@pytest.mark.django_db
class TestNodeChangePage:
    def test_a_node_marked_down_by_hand_still_loses_its_jobs_when_silent(
        self, admin_client, world, settings
    ):
        """The change form does not set a node's state (drain and undrain do): a node set DOWN
        there would be skipped by the heartbeat check, so its silent agent's jobs would hold
        their GPUs and never end. Here the silent node's attempt ends NODE_LOST."""
        make_node("a")
        make_node("b")
        job, attempt = place_a_borrower(world)
        node = Node.objects.get(name=attempt.allocations[0]["node"])
        url = reverse("admin:scheduler_node_change", args=[node.pk])
        response = admin_client.post(url, node_form(node, state="DOWN"))
        assert response.status_code == 302
        node.refresh_from_db()
        assert node.state == Node.State.READY

        silent = timedelta(seconds=settings.NODE_HEARTBEAT_TIMEOUT_SECONDS + 5)
        Node.objects.filter(pk=node.pk).update(last_heartbeat=node.last_heartbeat - silent)
        Node.objects.exclude(pk=node.pk).update(last_heartbeat=node.last_heartbeat)
        cycle_run(force=True)
        attempt.refresh_from_db()
        assert attempt.outcome == JobAttempt.Outcome.NODE_LOST
        assert Job.objects.get(pk=job.pk).state != Job.State.SCHEDULED

    def test_a_node_keeps_the_name_type_and_gpus_its_agent_registered(self, admin_client, world):
        """Running attempts name their node and its GPU indices: renaming the node (its agent
        re-registers under the old name, a second node on the same GPUs), changing its GPU type
        or lowering its GPUs below the indices held would double-book GPUs. The change form
        leaves them as the agent registered them."""
        make_node("a")
        make_node("b")
        _, attempt = place_a_borrower(world)
        node = Node.objects.get(name=attempt.allocations[0]["node"])
        url = reverse("admin:scheduler_node_change", args=[node.pk])
        edits = {"name": "renamed", "gpu_type": "a100", "gpus": "2", "asks_to_start": "on"}
        response = admin_client.post(url, node_form(node, **edits))
        assert response.status_code == 302
        kept = Node.objects.get(pk=node.pk)
        assert (kept.name, kept.gpu_type, kept.gpus, kept.asks_to_start) == (
            node.name, "h100", 8, False,
        )  # fmt: skip
        assert admin_client.get(url).status_code == 200

    def test_a_node_added_by_hand_gets_its_name_type_and_gpus(self, admin_client):
        """Only a node that exists keeps what its agent registered: adding one takes them."""
        response = admin_client.post(
            reverse("admin:scheduler_node_add"),
            {"name": "spare", "gpu_type": "l4", "gpus": "4", "labels": "{}"},
        )
        assert response.status_code == 302, response.content.decode()[:2000]
        node = Node.objects.get(name="spare")
        assert (node.gpu_type, node.gpus, node.state) == ("l4", 4, Node.State.READY)


@pytest.mark.django_db
class TestShareChangePage:
    def test_a_share_keeps_its_name(self, admin_client, research_share):
        """Jobs, clients and the usage history know a share by its name, and the services never
        rename one (nor would its history record it): the change form keeps the name."""
        url = reverse("admin:shares_quotashare_change", args=[research_share.pk])
        response = admin_client.post(
            url, share_change_form(research_share, name="Research", grace_seconds="30")
        )
        assert response.status_code == 302, response.content.decode()[:2000]
        research_share.refresh_from_db()
        assert (research_share.name, research_share.grace_seconds) == ("research", 30)
        assert not research_share.changes.filter(field="name").exists()

    def test_deleting_a_share_asks_for_a_cycle(self, admin_client, vision_share, cycle_requests):
        """A share deleted in the admin goes through the service: its GPUs join the free pool,
        and a cycle is asked for so queued jobs may use them."""
        url = reverse("admin:shares_quotashare_delete", args=[vision_share.pk])
        response = admin_client.post(url, {"post": "yes"})
        assert response.status_code == 302
        assert not QuotaShare.objects.filter(name="vision").exists()
        assert cycle_requests == ["cycle"]

    def test_deleting_shares_in_bulk_asks_for_a_cycle(
        self, admin_client, vision_share, research_share, cycle_requests
    ):
        response = admin_client.post(
            reverse("admin:shares_quotashare_changelist"),
            {
                "action": "delete_selected",
                "_selected_action": [vision_share.pk, research_share.pk],
                "post": "yes",
            },
        )
        assert response.status_code == 302
        assert not QuotaShare.objects.exists()
        assert cycle_requests == ["cycle", "cycle"]

    def test_a_share_with_jobs_is_not_deleted(self, admin_client, world):
        """Its jobs would be lost: the admin names them instead of deleting."""
        make_node("a")
        make_node("b")
        place_a_borrower(world)
        url = reverse("admin:shares_quotashare_delete", args=[world.research.pk])
        response = admin_client.post(url, {"post": "yes"})
        assert response.status_code == 200
        assert QuotaShare.objects.filter(name="research").exists()
        assert Job.objects.filter(share=world.research).count() == 2


@pytest.mark.django_db
class TestClusterSettingsPage:
    def settings_form(self, window: str) -> dict:
        return {"agent_join_token": "join-me", "churn_preemptions": "3",
                "churn_window_seconds": window}  # fmt: skip

    @pytest.mark.parametrize("window", ["9223372036854775807", str(MAX_CHURN_WINDOW_SECONDS + 1)])
    def test_a_churn_window_beyond_any_date_is_refused_naming_the_field(self, admin_client, window):
        """A held-off job's pages and metrics show when its window ends: a window of 2**63 s
        made them fail. The form says which field and what range instead."""
        ClusterSettings.load()
        url = reverse("admin:scheduler_clustersettings_change", args=[1])
        response = admin_client.post(url, self.settings_form(window))
        assert response.status_code == 200
        assert response.context["adminform"].form.errors == {
            "churn_window_seconds": [CHURN_WINDOW_RANGE]
        }
        assert ClusterSettings.load().churn_window_seconds == 3600

    def test_the_longest_churn_window_still_shows_when_a_held_off_job_may_borrow(
        self, admin_client, research_share, alice
    ):
        ClusterSettings.load()
        url = reverse("admin:scheduler_clustersettings_change", args=[1])
        response = admin_client.post(url, self.settings_form(str(MAX_CHURN_WINDOW_SECONDS)))
        assert response.status_code == 302
        job = Job.objects.create(
            share=research_share, submitted_by=alice, gpu_type="h100", gpus=1, command="true",
            state=Job.State.RUNNABLE, preemption_count=3,
        )  # fmt: skip
        for number in (1, 2, 3):
            JobAttempt.objects.create(
                job=job, number=number, outcome=JobAttempt.Outcome.PREEMPTED,
                ended_at=timezone.now(),
            )  # fmt: skip
        assert job.pk in held_off()
        assert admin_client.get(reverse("dashboards:queue")).status_code == 200


@pytest.mark.django_db
class TestUserPickers:
    """The user fields that search as one types (a team's members, a provider identity)."""

    @pytest.mark.parametrize("user", ["abc", "1.5", "99999999999999999999999"])
    def test_a_member_that_is_no_user_is_refused_naming_the_field(self, admin_client, alice, user):
        response = admin_client.post(
            reverse("admin:shares_team_add"),
            {
                "name": "Speech", "slug": "speech",
                "memberships-TOTAL_FORMS": "1", "memberships-INITIAL_FORMS": "0",
                "memberships-0-user": user, "memberships-0-role": "MEMBER",
            },
        )  # fmt: skip
        assert response.status_code == 200
        (formset,) = response.context["inline_admin_formsets"]
        assert "user" in formset.formset.errors[0]
        assert not Team.objects.filter(slug="speech").exists()

    @pytest.mark.parametrize("user", ["abc", "99999999999999999999999"])
    def test_an_identity_for_no_user_is_refused_naming_the_field(self, admin_client, user):
        response = admin_client.post(
            reverse("admin:sso_provideridentity_add"),
            {"user": user, "issuer": "https://login.example.com", "subject": "s-1"},
        )
        assert response.status_code == 200
        assert "user" in response.context["adminform"].form.errors

    def test_a_posted_member_is_shown_again_with_another_fields_error(self, admin_client, alice):
        response = admin_client.post(
            reverse("admin:shares_team_add"),
            {
                "name": "Speech", "slug": "not a slug",
                "memberships-TOTAL_FORMS": "1", "memberships-INITIAL_FORMS": "0",
                "memberships-0-user": str(alice.pk), "memberships-0-role": "MEMBER",
            },
        )  # fmt: skip
        assert response.status_code == 200
        assert f'<option value="{alice.pk}" selected>alice</option>' in response.content.decode()

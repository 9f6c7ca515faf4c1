"""A drained or undrained node says who did it and why: its state reason, which the admin's node
list, the nodes API and the overview page show, names the admin and the reason they gave."""

from __future__ import annotations

import pytest
from django.urls import reverse

from scheduler.cycle.housekeeping import HEARTBEAT_LOST
from scheduler.models import ClusterSettings, Node
from scheduler.nodes.services import (
    MAX_NODE_REASON,
    NODE_REASON_TOO_LONG,
    node_register,
    node_set_state,
)
from tests.conftest import make_node


@pytest.fixture
def node(db) -> Node:
    return make_node("gpu-1")


def state_of(name: str) -> tuple[str, str]:
    node = Node.objects.get(name=name)
    return node.state, node.state_reason


@pytest.mark.django_db
class TestOverTheApi:
    def test_a_drain_records_the_admin_and_the_reason_for_everyone_to_see(self, world, node):
        """Root drains with a reason; bob, who may only look, sees who drained it and why."""
        response = world.client("root").post(
            "/api/v1/nodes/gpu-1/drain/", {"reason": "ECC errors on GPU 3"}, format="json"
        )
        assert response.status_code == 200, response.content
        assert response.json()["state_reason"] == "drained by root: ECC errors on GPU 3"
        seen = world.client("bob").get("/api/v1/nodes/gpu-1/").json()
        assert (seen["state"], seen["state_reason"]) == (
            "DRAINING", "drained by root: ECC errors on GPU 3",
        )  # fmt: skip

    def test_an_undrain_replaces_the_drain_s_reason_with_its_own(self, world, node):
        root = world.client("root")
        root.post("/api/v1/nodes/gpu-1/drain/", {"reason": "fan swap"}, format="json")
        response = root.post("/api/v1/nodes/gpu-1/undrain/", {"reason": "fan swapped"})
        assert response.status_code == 200, response.content
        assert state_of("gpu-1") == ("READY", "undrained by root: fan swapped")

    def test_a_drain_without_a_body_still_names_the_admin(self, world, node):
        """The reason is optional: clients of an earlier release send no body."""
        assert world.client("root").post("/api/v1/nodes/gpu-1/drain/").status_code == 200
        assert state_of("gpu-1") == ("DRAINING", "drained by root")

    def test_a_reason_too_long_is_refused_naming_the_field_and_the_node_stays(self, world, node):
        response = world.client("root").post(
            "/api/v1/nodes/gpu-1/drain/", {"reason": "x" * (MAX_NODE_REASON + 1)}, format="json"
        )
        assert response.status_code == 400
        assert response.json() == {"reason": [NODE_REASON_TOO_LONG]}
        assert state_of("gpu-1") == ("READY", "")

    def test_a_reason_that_is_not_text_is_refused_naming_the_field(self, world, node):
        response = world.client("root").post(
            "/api/v1/nodes/gpu-1/drain/", {"reason": ["fan"]}, format="json"
        )
        assert response.status_code == 400
        assert list(response.json()) == ["reason"]
        assert response.json()["reason"][0].startswith("reason: ")
        assert state_of("gpu-1") == ("READY", "")


@pytest.mark.django_db
class TestInTheAdmin:
    def drain(self, client, node: Node, action: str = "drain", **fields):
        data = {"action": action, "_selected_action": [node.pk], **fields}
        return client.post(reverse("admin:scheduler_node_changelist"), data, follow=True)

    def test_the_drain_action_records_the_admin_and_the_reason_shown_in_the_list(
        self, client, root, node
    ):
        client.force_login(root)
        response = self.drain(client, node, reason="  PSU  replaced\ntomorrow ")
        assert response.status_code == 200
        assert state_of("gpu-1") == ("DRAINING", "drained by root: PSU replaced tomorrow")
        assert "drained by root: PSU replaced tomorrow" in response.content.decode()

    def test_the_undrain_action_records_its_own_reason(self, client, root, node):
        client.force_login(root)
        self.drain(client, node, reason="fan swap")
        self.drain(client, node, action="undrain", reason="fan swapped")
        assert state_of("gpu-1") == ("READY", "undrained by root: fan swapped")

    def test_a_reason_too_long_is_shown_as_the_rule_and_no_node_changes(self, client, root, node):
        client.force_login(root)
        other = make_node("gpu-2")
        data = {"action": "drain", "_selected_action": [node.pk, other.pk],
                "reason": "x" * (MAX_NODE_REASON + 1)}  # fmt: skip
        url = reverse("admin:scheduler_node_changelist")
        response = client.post(url, data, follow=True)
        assert NODE_REASON_TOO_LONG in [str(m) for m in response.context["messages"]]
        assert state_of("gpu-1") == state_of("gpu-2") == ("READY", "")


def test_the_portal_s_own_state_change_says_what_it_did(node):
    """A change with no acting user (a script, a test) still records what it did."""
    node_set_state(node=node, state=Node.State.DRAINING)
    assert state_of("gpu-1") == ("DRAINING", "drained")


def test_a_node_down_for_its_silent_agent_loses_that_reason_when_the_agent_registers_again(db):
    """An agent that was silent (its node DOWN, "no heartbeat ...") and registers again makes
    its node READY; the node must not go on saying it has no heartbeat."""
    ClusterSettings.objects.update_or_create(pk=1, defaults={"agent_join_token": "join"})
    make_node("gpu-1", state=Node.State.DOWN, state_reason=HEARTBEAT_LOST)
    node_register(join_token="join", name="gpu-1", gpu_type="h100", gpus=8, gpu_details=[])
    assert state_of("gpu-1") == ("READY", "")

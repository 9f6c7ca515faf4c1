"""The join token a new portal makes for itself: agents are given it on their command line
(`gpu-agent --join-token T`, as `make run` starts its demo agents)."""

from __future__ import annotations

import pytest

from scheduler.models import ClusterSettings

pytestmark = pytest.mark.django_db


def test_a_new_portals_join_token_never_begins_with_a_dash(settings):
    """One in 64 random tokens began with "-", which the agent's command line read as an option
    ("argument --join-token: expected one argument"), and `make run`'s agents exited."""
    settings.AGENT_JOIN_TOKEN = ""
    tokens = set()
    for _ in range(500):
        ClusterSettings.objects.all().delete()
        tokens.add(ClusterSettings.load().agent_join_token)
    assert len(tokens) == 500
    assert not [token for token in tokens if token.startswith("-")]


def test_a_join_token_from_the_environment_is_kept_as_given(settings):
    settings.AGENT_JOIN_TOKEN = "-chosen-by-the-admin"
    assert ClusterSettings.load().agent_join_token == "-chosen-by-the-admin"

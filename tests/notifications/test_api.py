"""The subscriptions API: each user manages their own; bad input is a 400 naming the field
and the rule; another user's subscription is not found. Schemathesis checks the new
endpoints against the schema with real objects."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

from notifications import services
from notifications.models import Kind, Subscription
from portal.wsgi import application

pytestmark = pytest.mark.django_db

URL = "/api/v1/notifications/subscriptions/"
# Webhook targets are public addresses as IP literals: creating a subscription checks what its
# host resolves to (notifications.targets), without DNS, and connects to nothing.


def create(client, **body):
    return client.post(URL, body, format="json")


def test_a_member_subscribes_to_a_share_of_their_team_and_sees_the_secret_once(world):
    client = world.client("bob")
    answer = create(
        client, scope="share", share="research", kinds=["share.lent", "job.failed"],
        channel="webhook", target="https://93.184.215.14/portal",
    )  # fmt: skip
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert body["share"] == "research" and body["kinds"] == ["share.lent", "job.failed"]
    assert body["signed"] is True and len(body["secret"]) >= 16
    assert answer["Location"] == f"{URL}{body['id']}/"
    listed = client.get(URL).json()["results"]
    assert [s["id"] for s in listed] == [body["id"]]
    assert "secret" not in listed[0]
    assert "secret" not in client.get(f"{URL}{body['id']}/").json()


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (
            {"scope": "share", "share": "vision", "kinds": ["share.lent"], "channel": "slack",
             "target": "https://93.184.215.14/slack"},
            "share",
            services.SHARE_NOT_YOURS.format(name="vision"),
        ),
        (
            {"scope": "share", "kinds": ["share.lent"], "channel": "slack",
             "target": "https://93.184.215.14/slack"},
            "share",
            services.SHARE_NEEDED,
        ),
        (
            {"scope": "own_jobs", "kinds": ["share.changed"], "channel": "webhook",
             "target": "https://93.184.215.14/h"},
            "kinds",
            services.KIND_NOT_FOR_OWN_JOBS.format(kind="share.changed"),
        ),
        (
            {"scope": "own_jobs", "kinds": ["job.started"], "channel": "webhook",
             "target": "ftp://example.com/h"},
            "target",
            services.URL_INVALID.format(target="ftp://example.com/h"),
        ),
        (
            {"scope": "own_jobs", "kinds": ["job.started"], "channel": "email"},
            "target",
            services.EMAIL_NEEDED,
        ),
        (
            {"scope": "own_jobs", "kinds": ["job.started"], "channel": "email",
             "target": "not-an-address"},
            "target",
            services.EMAIL_INVALID.format(target="not-an-address"),
        ),
        (
            {"scope": "own_jobs", "kinds": ["job.started"], "channel": "slack",
             "target": "https://93.184.215.14/slack", "secret": "s" * 20},
            "secret",
            services.SECRET_ONLY_WEBHOOK.format(channel="slack"),
        ),
        (
            {"scope": "own_jobs", "kinds": ["job.started"], "channel": "webhook",
             "target": "https://93.184.215.14/h", "secret": "short"},
            "secret",
            services.SECRET_LENGTH,
        ),
    ],
)  # fmt: skip
def test_bad_input_is_a_400_naming_the_field_and_the_rule(world, body, field, message):
    """bob (a member of ml-research, with no e-mail address) asks for subscriptions that
    break one rule each."""
    answer = create(world.client("bob"), **body)
    assert answer.status_code == 400
    assert answer.json() == {field: [message]}
    assert not Subscription.objects.exists()


def test_an_unknown_event_scope_or_channel_is_a_400_naming_what_it_may_be(world):
    answer = create(
        world.client("bob"), scope="mine", kinds=["job.started", "job_started"],
        channel="pigeon", target="https://93.184.215.14/h",
    )  # fmt: skip
    assert answer.status_code == 400
    assert answer.json() == {
        "scope": ['scope: "mine" is none of own_jobs, share.'],
        "kinds": {"1": ['kinds: "job_started" is none of job.started, job.preempted, '
                        "job.failed, job.finished, share.lent, share.reclaimed, share.changed."]},
        "channel": ['channel: "pigeon" is none of email, webhook, slack.'],
    }  # fmt: skip


def test_an_admin_may_subscribe_to_any_share(world):
    answer = create(
        world.client("root"), scope="share", share="vision", kinds=[Kind.SHARE_CHANGED],
        channel="email", target="ops@example.com",
    )  # fmt: skip
    assert answer.status_code == 201 and answer.json()["secret"] == ""


def test_another_users_subscription_is_not_found_and_stays(world):
    mine = services.subscription_create(
        user=world.bob, scope="own_jobs", kinds=["job.started"], channel="webhook",
        target="https://93.184.215.14/h",
    )  # fmt: skip
    oscar = world.client("oscar")
    assert oscar.get(f"{URL}{mine.pk}/").status_code == 404
    assert oscar.delete(f"{URL}{mine.pk}/").status_code == 404
    assert oscar.get(URL).json()["results"] == []
    assert world.client("bob").delete(f"{URL}{mine.pk}/").status_code == 204
    assert not Subscription.objects.exists()


def test_deliveries_list_only_ones_own(world):
    assert world.client("bob").get("/api/v1/notifications/deliveries/").json()["results"] == []
    answer = world.client("bob").get("/api/v1/notifications/deliveries/?state=NOPE")
    assert answer.status_code == 400
    assert answer.json()["state"][0].startswith('state: "NOPE" is none of ')


def test_anonymous_callers_get_401(world):
    assert world.client(None).get(URL).status_code == 401


# --- The schema -------------------------------------------------------------------------------

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application).include(
    path_regex="^/api/v1/notifications/"
)


@pytest.fixture(autouse=True)
def keep_the_test_connection():
    """As tests/api/test_schema.py: the WSGI app must not close the test's connection."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def test_the_schema_has_the_notifications_endpoints():
    assert {
        "/api/v1/notifications/subscriptions/",
        "/api/v1/notifications/subscriptions/{subscription_id}/",
        "/api/v1/notifications/deliveries/",
    } <= set(schema.raw_schema["paths"])


@schema.parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_the_endpoints_never_fail_and_match_their_schema(case, world):
    """As bob, with a path parameter naming his real subscription: no 5xx, and every answer
    matches the schema."""
    mine = Subscription.objects.filter(user=world.bob).first() or services.subscription_create(
        user=world.bob, scope="share", share_name="research", kinds=["share.lent"],
        channel="webhook", target="https://93.184.215.14/h",
    )  # fmt: skip
    if case.path_parameters and "subscription_id" in case.path_parameters:
        case.path_parameters["subscription_id"] = mine.pk
    case.call_and_validate(
        headers={"Authorization": f"Token {world.tokens['bob']}"},
        checks=[not_a_server_error, response_schema_conformance, content_type_conformance],
    )

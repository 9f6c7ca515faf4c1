"""Webhook and Slack targets are guarded against server-side request forgery: a host that
resolves to a loopback, private, link-local or other non-public address is refused when the
subscription is made (a 400 on `target`) and again at each send, unless an admin allowed its
network (NOTIFICATIONS_WEBHOOK_ALLOWED_NETS). Redirects are not followed. The sends go to the
real receiver on 127.0.0.1 (tests/notifications/conftest.py); nothing is mocked."""

from __future__ import annotations

import socket

import pytest

from notifications.apps import check_allowed_nets
from notifications.channels import REFUSED
from notifications.models import Delivery, Kind, Subscription
from notifications.services import deliveries_send, dispatch, subscription_create
from notifications.targets import ADDRESS_REFUSED, HOST_UNRESOLVED, PORT_INVALID
from shares.services import share_update
from tests.notifications.conftest import LOOPBACK, free_port

pytestmark = pytest.mark.django_db

URL = "/api/v1/notifications/subscriptions/"
# What `localhost` resolves to first here: 127.0.0.1, or ::1 where /etc/hosts says so.
LOCALHOST = socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)[0][4][0]


def create(world, target: str, channel: str = "webhook"):
    return world.client("bob").post(
        URL,
        {"scope": "own_jobs", "kinds": ["job.started"], "channel": channel, "target": target},
        format="json",
    )


@pytest.mark.parametrize(
    ("target", "host", "address", "kind"),
    [
        (f"http://127.0.0.1:{free_port()}/hook", "127.0.0.1", "127.0.0.1", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254", "169.254.169.254",
         "link-local"),
        ("https://10.1.2.3/hook", "10.1.2.3", "10.1.2.3", "private"),
        ("https://192.168.0.10/hook", "192.168.0.10", "192.168.0.10", "private"),
        ("http://[::1]:8080/hook", "::1", "::1", "loopback"),
        ("http://[::ffff:127.0.0.1]/hook", "::ffff:127.0.0.1", "::ffff:127.0.0.1", "loopback"),
        ("https://[fd00::5]/hook", "fd00::5", "fd00::5", "private"),
        ("http://0.0.0.0/hook", "0.0.0.0", "0.0.0.0", "unspecified"),
        ("https://100.64.0.1/hook", "100.64.0.1", "100.64.0.1", "non-public"),
        ("http://localhost:8000/hook", "localhost", LOCALHOST, "loopback"),
    ],
)  # fmt: skip
def test_a_target_on_an_internal_address_is_a_400_on_target(world, target, host, address, kind):
    """Without NOTIFICATIONS_WEBHOOK_ALLOWED_NETS, bob cannot point a webhook at loopback (by
    address or by a name that resolves to it), the metadata address, a private network, or any
    other address that is not public."""
    answer = create(world, target)
    assert answer.status_code == 400
    message = ADDRESS_REFUSED.format(host=host, address=address, kind=kind)
    assert answer.json() == {"target": [message]}
    assert not Subscription.objects.exists()


def test_a_slack_target_is_guarded_too(world):
    answer = create(world, "https://10.0.0.1/services/x", channel="slack")
    assert answer.status_code == 400
    refused = ADDRESS_REFUSED.format(host="10.0.0.1", address="10.0.0.1", kind="private")
    assert answer.json() == {"target": [refused]}


def test_a_host_that_does_not_resolve_is_a_400_on_target(world):
    answer = create(world, "https://no-such-host.invalid/hook")
    assert answer.status_code == 400
    assert answer.json() == {"target": [HOST_UNRESOLVED.format(host="no-such-host.invalid")]}


def test_a_port_out_of_range_is_a_400_on_target(world):
    answer = create(world, "https://93.184.215.14:99999/hook")
    assert answer.status_code == 400
    assert answer.json() == {
        "target": [PORT_INVALID.format(target="https://93.184.215.14:99999/hook")]
    }


def test_an_allowed_network_may_be_reached_and_only_it(world, settings):
    """An admin allows the office's 10.20.0.0/16 (and loopback): a target there is accepted;
    one elsewhere in 10/8 is still refused."""
    settings.NOTIFICATIONS_WEBHOOK_ALLOWED_NETS = f"10.20.0.0/16, {LOOPBACK}, ::1/128"
    assert create(world, "https://10.20.3.4/hook").status_code == 201
    assert create(world, "http://localhost/hook").status_code == 201
    refused = create(world, "https://10.21.0.1/hook")
    assert refused.json() == {
        "target": [ADDRESS_REFUSED.format(host="10.21.0.1", address="10.21.0.1", kind="private")]
    }


def test_a_target_allowed_at_subscription_is_refused_at_send_once_no_longer_allowed(
    world, receiver, settings
):
    """alice subscribes to the receiver on 127.0.0.1 while loopback is allowed; then the admin
    removes the setting. The next send connects nowhere: the delivery is recorded as failed at
    once (a configuration error is not retried), with the rule that refused it."""
    subscription_create(
        user=world.alice, scope=Subscription.Scope.SHARE, share_name="research",
        kinds=[Kind.SHARE_CHANGED], target=receiver.url("/a"), channel="webhook",
    )  # fmt: skip
    settings.NOTIFICATIONS_WEBHOOK_ALLOWED_NETS = ""
    share_update(share=world.research, actor=world.root, source="api", grace_seconds=60)
    dispatch()

    assert receiver.requests == []
    delivery = Delivery.objects.get()
    assert delivery.state == Delivery.State.FAILED and delivery.attempts == 1
    reason = ADDRESS_REFUSED.format(host="127.0.0.1", address="127.0.0.1", kind="loopback")
    assert delivery.last_error == REFUSED.format(reason=reason)
    assert delivery.tries[0]["ok"] is False and delivery.tries[0]["detail"] == delivery.last_error
    assert deliveries_send(delivery.next_attempt_at) == 0  # given up: never due again


def test_a_redirect_is_not_followed(world, receiver):
    """The webhook answers 302 to another address: the portal does not go there; the try is a
    failure that says so."""
    receiver.status["/moved"] = 302
    receiver.location["/moved"] = receiver.url("/elsewhere")
    subscription_create(
        user=world.alice, scope=Subscription.Scope.SHARE, share_name="research",
        kinds=[Kind.SHARE_CHANGED], target=receiver.url("/moved"), channel="webhook",
    )  # fmt: skip
    share_update(share=world.research, actor=world.root, source="api", grace_seconds=60)
    dispatch()

    assert [r.path for r in receiver.requests] == ["/moved"]
    delivery = Delivery.objects.get()
    assert delivery.state == Delivery.State.PENDING and delivery.attempts == 1
    assert delivery.last_error == (
        f"HTTP 302 ok (redirect to {receiver.url('/elsewhere')!r} not followed)"
    )


def test_allowed_networks_that_do_not_parse_fail_the_system_check(settings):
    settings.NOTIFICATIONS_WEBHOOK_ALLOWED_NETS = "10.0.0.0/8, ten"
    (error,) = check_allowed_nets()
    assert error.id == "notifications.E001" and "'ten'" in error.msg
    settings.NOTIFICATIONS_WEBHOOK_ALLOWED_NETS = "10.0.0.0/8, fd00::/8"
    assert check_allowed_nets() == []

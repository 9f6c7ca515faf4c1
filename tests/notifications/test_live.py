"""Notifications from the real Celery worker and its beat (tests/live.py): beat runs the
dispatch on its schedule, and the worker e-mails through the SMTP server the environment names
and posts to the webhook, while the test only writes a share change."""

from __future__ import annotations

import pytest

from notifications.models import Delivery, Kind, Subscription
from notifications.services import subscription_create
from shares.services import share_update
from tests.live import wait_for

pytestmark = pytest.mark.live


def test_the_worker_sends_a_share_change_by_email_and_webhook(
    live, world, smtp_server, receiver, settings
):
    system = live(
        EMAIL_HOST="127.0.0.1", EMAIL_PORT=str(settings.EMAIL_PORT),
        DEFAULT_FROM_EMAIL="portal@example.com", NOTIFICATIONS_POLL_SECONDS="0.5",
        NOTIFICATIONS_WEBHOOK_ALLOWED_NETS=settings.NOTIFICATIONS_WEBHOOK_ALLOWED_NETS,
    )  # fmt: skip
    for channel, target in (("email", "alice@example.com"), ("webhook", receiver.url("/a"))):
        subscription_create(
            user=world.alice, scope=Subscription.Scope.SHARE, share_name="research",
            kinds=[Kind.SHARE_CHANGED], channel=channel, target=target,
        )  # fmt: skip
    system.start_worker()
    share_update(share=world.research, actor=world.root, source="api", grace_seconds=60)

    wait_for(lambda: receiver.to("/a") and smtp_server.messages, what="both messages")
    assert receiver.to("/a")[0].json["changes"] == [
        {"field": "grace_seconds", "old": "2", "new": "60"}
    ]
    (email,) = smtp_server.messages
    assert email["Subject"] == "[gpu-portal] share.changed · share research"
    assert email["From"] == "portal@example.com" and email["To"] == "alice@example.com"
    wait_for(
        lambda: Delivery.objects.filter(state=Delivery.State.SENT).count() == 2,
        what="both deliveries recorded as sent",
    )

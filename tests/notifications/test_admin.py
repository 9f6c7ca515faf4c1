"""The admin lists subscriptions and every delivery (read-only), and tries a given-up delivery
again."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from notifications.models import Delivery, Kind, Subscription
from notifications.services import subscription_create
from tests.conftest import password_of

pytestmark = pytest.mark.django_db


def test_an_admin_sees_the_records_and_tries_a_failed_delivery_again(world):
    subscription = subscription_create(
        user=world.alice, scope=Subscription.Scope.OWN_JOBS, kinds=[Kind.JOB_FAILED],
        channel="webhook", target="https://93.184.215.14/h",
    )  # fmt: skip
    failed = Delivery.objects.create(
        subscription=subscription, kind=Kind.JOB_FAILED, source=Delivery.Source.JOB_EVENT,
        source_id=1, payload={"text": "job 1 failed"}, state=Delivery.State.FAILED,
        attempts=3, next_attempt_at=timezone.now(), last_error="HTTP 500",
    )  # fmt: skip
    client = Client()
    assert client.login(username="root", password=password_of("root"))
    for page in ("subscription", "delivery"):
        answer = client.get(f"/admin/notifications/{page}/")
        assert answer.status_code == 200, page
    shown = client.get(f"/admin/notifications/subscription/{subscription.pk}/change/")
    assert shown.status_code == 200 and subscription.secret not in shown.content.decode()
    assert "HTTP 500" not in client.get("/admin/notifications/delivery/").content.decode()
    detail = client.get(f"/admin/notifications/delivery/{failed.pk}/change/")
    assert detail.status_code == 200 and "HTTP 500" in detail.content.decode()
    answer = client.post(
        "/admin/notifications/delivery/",
        {"action": "retry_now", "_selected_action": [failed.pk]},
    )
    assert answer.status_code == 302
    failed.refresh_from_db()
    assert failed.state == Delivery.State.PENDING and failed.next_attempt_at <= timezone.now()

"""The subscription page in a real browser (Playwright + Debian's Chromium, the fixtures of
tests/dashboards/test_dashboard_browser.py) against the live server: a member subscribes,
sees a bad URL refused with the rule, gets a webhook's secret once, sees the delivery that a
dispatch sent, and unsubscribes."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from notifications.channels import SIGNATURE_HEADER
from notifications.models import Delivery, Subscription
from notifications.services import URL_INVALID, dispatch
from scheduler.jobs.services import job_submit
from scheduler.models import Job
from scheduler.transitions import job_transition
from tests.conftest import make_node, password_of
from tests.dashboards.test_dashboard_browser import SCREENSHOTS, browser_page  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PAGE = "/dash/notifications/"


def test_a_member_subscribes_sees_the_delivery_and_unsubscribes(
    live_server,
    browser_page,  # noqa: F811
    world,
    receiver,
):
    page = browser_page
    page.goto(f"{live_server.url}/dash/login/?next={PAGE}")
    page.fill("input[name=username]", "bob")
    page.fill("input[name=password]", password_of("bob"))
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}{PAGE}")
    assert "No subscriptions yet." in page.inner_text("table.subscriptions")

    def fill(target: str) -> None:
        page.select_option("select[name=scope]", "own_jobs")
        page.check('input[name=kinds][value="job.failed"]')
        page.select_option("select[name=channel]", "webhook")
        page.fill("input[name=target]", target)
        page.click("form.subscribe button[type=submit]")

    fill("ftp://example.com/hook")
    assert URL_INVALID.format(target="ftp://example.com/hook") in page.inner_text(".field-target")
    assert not Subscription.objects.exists()

    fill(receiver.url("/bob"))
    secret = page.inner_text("#secret")
    rows = page.locator("table.subscriptions tr").all_inner_texts()
    assert len(rows) == 2 and "my own jobs" in rows[1] and "job.failed" in rows[1]
    page.screenshot(path=str(SCREENSHOTS / "notifications-subscribed.png"), full_page=True)

    make_node("node-0")
    job, _ = job_submit(user=world.bob, share_name="research", gpu_type="h100", gpus=8,
                        command="true", name="bobs-job")  # fmt: skip
    job_transition(job=Job.objects.get(pk=job.pk), to_state=Job.State.FAILED, reason="broken")
    dispatch()
    (request,) = receiver.to("/bob")
    expected = "sha256=" + hmac.new(secret.encode(), request.body, hashlib.sha256).hexdigest()
    assert request.headers[SIGNATURE_HEADER] == expected

    page.goto(f"{live_server.url}{PAGE}")
    (delivery,) = page.locator("table.deliveries tr").all_inner_texts()[1:]
    assert "job.failed" in delivery and Delivery.State.SENT in delivery
    assert f"job {job.pk} (bobs-job) of share research failed: broken" in delivery
    page.screenshot(path=str(SCREENSHOTS / "notifications-delivered.png"), full_page=True)

    page.click("table.subscriptions button[type=submit]")
    page.wait_for_url(f"{live_server.url}{PAGE}")
    assert "No subscriptions yet." in page.inner_text("table.subscriptions")
    assert not Subscription.objects.exists()

"""Notifications end to end, in process: the real cycle and node services make the job events
(as in tests/cycle), one `dispatch()` call is one beat of the notifications' task, and the
messages reach a real SMTP server and a real HTTP receiver. Nothing is mocked."""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta

import pytest
from django.utils import timezone

from notifications.channels import SIGNATURE_HEADER
from notifications.models import Delivery, Kind, OutboxCursor, Subscription
from notifications.services import NOT_TRIED, deliveries_send, dispatch, subscription_create
from notifications.tasks import dispatch as dispatch_task
from portal.celery import app
from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobAttempt, Node
from scheduler.nodes.attempts import END_EXIT, attempt_exited
from shares.models import Membership
from shares.services import share_update
from tests.conftest import make_node
from tests.conftest import start_latest_attempt as run

pytestmark = pytest.mark.django_db


def submit(user, share: str, gpus: int = 8, **fields) -> Job:
    job, _ = job_submit(
        user=user, share_name=share, gpu_type="h100", gpus=gpus, command="true", **fields
    )
    return job


def attempt_of(job: Job) -> JobAttempt:
    return JobAttempt.objects.filter(job=job).order_by("-number").first()


def exit_(job: Job, *, exit_code: int = 0, signalled: bool = False) -> None:
    attempt = attempt_of(job)
    node = Node.objects.get(name=attempt.allocations[0]["node"])
    attempt_exited(
        node=node, attempt_id=attempt.pk, end=END_EXIT, exit_code=exit_code, signalled=signalled
    )


def subscribe(user, kinds, channel="webhook", share="", **fields) -> Subscription:
    scope = Subscription.Scope.SHARE if share else Subscription.Scope.OWN_JOBS
    return subscription_create(
        user=user, scope=scope, share_name=share, kinds=list(kinds), channel=channel, **fields
    )


def verify(request, secret: str) -> bool:
    expected = "sha256=" + hmac.new(secret.encode(), request.body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(request.headers[SIGNATURE_HEADER], expected)


@pytest.fixture
def two_nodes(world):
    return make_node("node-0"), make_node("node-1")


def test_a_member_hears_by_email_that_their_job_started_and_finished(
    world, two_nodes, smtp_server, settings
):
    """bob subscribes to his own jobs by e-mail (his account's address); his job starts and
    succeeds: two e-mails reach the SMTP server, each saying what happened to which job, with
    a link to the job's page."""
    settings.NOTIFICATIONS_PORTAL_URL = "https://gpu.example.com"
    world.bob.email = "bob@example.com"
    world.bob.save()
    subscribe(world.bob, [Kind.JOB_STARTED, Kind.JOB_FINISHED], channel="email")
    job = submit(world.bob, "research", name="bobs-train")
    cycle_run(force=True)
    run(job)
    exit_(job)
    assert dispatch()

    subjects = [m["Subject"] for m in smtp_server.messages]
    assert subjects == [
        "[gpu-portal] job.started · share research",
        "[gpu-portal] job.finished · share research",
    ]
    assert all(m["To"] == "bob@example.com" for m in smtp_server.messages)
    started = smtp_server.messages[0].get_content()
    assert f"job {job.pk} (bobs-train) of share research started (attempt 1)" in started
    assert f"The job's page: https://gpu.example.com/dash/jobs/{job.pk}/" in started
    assert set(Delivery.objects.values_list("state", flat=True)) == {Delivery.State.SENT}
    # Read once: a second beat sends nothing again.
    dispatch()
    assert len(smtp_server.messages) == 2


def test_a_reclaim_tells_both_shares_and_the_borrower_who_took_its_gpus_and_what_was_lost(
    world, two_nodes, receiver, settings
):
    """alice's two borrowers fill both nodes: carol (vision) hears that her share lends. carol
    submits: she hears that vision reclaimed, and research's Slack channel hears it too. When
    the victim has stopped, alice's webhook hears that her job was preempted for carol's job,
    why, and the GPU time lost since its last checkpoint; every message is signed."""
    settings.NOTIFICATIONS_PORTAL_URL = "https://gpu.example.com"
    lender = subscribe(
        world.carol, [Kind.SHARE_LENT, Kind.SHARE_RECLAIMED], share="vision",
        target=receiver.url("/carol"),
    )  # fmt: skip
    subscribe(
        world.alice, [Kind.SHARE_RECLAIMED], channel="slack", share="research",
        target=receiver.url("/slack"),
    )  # fmt: skip
    owner_hook = subscribe(world.alice, [Kind.JOB_PREEMPTED], target=receiver.url("/alice"))
    borrowers = [submit(world.alice, "research", name=f"sweep-{n}") for n in range(2)]
    cycle_run(force=True)
    for job in borrowers:
        run(job)
    dispatch()
    (lent,) = receiver.to("/carol")
    assert lent.json["event"] == "share.lent"
    assert lent.json["lender_share"] == "vision" and lent.json["borrower_share"] == "research"
    assert lent.json["lent_now"] == 8 and lent.headers["X-Portal-Event"] == "share.lent"
    assert verify(lent, lender.secret)

    owner = submit(world.carol, "vision", name="detector")
    cycle_run(force=True)
    victim = next(j for j in borrowers if Job.objects.get(pk=j.pk).state == Job.State.PREEMPTING)
    dispatch()
    reclaimed = receiver.to("/carol")[1].json
    assert reclaimed["event"] == "share.reclaimed"
    assert (reclaimed["owner_share"], reclaimed["borrower_share"]) == ("vision", "research")
    assert reclaimed["for_job"]["id"] == owner.pk and reclaimed["job"]["id"] == victim.pk
    (slack,) = receiver.to("/slack")
    assert slack.json == {
        "text": f"share vision reclaimed 8 h100 from share research: job {victim.pk} "
        f"(sweep-{borrowers.index(victim)}) stops for job {owner.pk} (detector)"
        f"\n<https://gpu.example.com/dash/jobs/{victim.pk}/|the job's page>"
    }
    assert receiver.to("/alice") == []  # not until the victim has stopped

    # It ran an hour and saved a checkpoint half an hour ago, then stopped with SIGTERM.
    now = timezone.now()
    JobAttempt.objects.filter(pk=attempt_of(victim).pk).update(
        started_at=now - timedelta(hours=1), last_checkpoint_at=now - timedelta(minutes=30)
    )
    exit_(victim, signalled=True)
    dispatch()
    (preempted,) = receiver.to("/alice")
    assert verify(preempted, owner_hook.secret)
    body = preempted.json
    attempt = attempt_of(victim)
    lost = (attempt.ended_at - attempt.last_checkpoint_at).total_seconds()
    assert body["event"] == "job.preempted" and body["job"]["id"] == victim.pk
    assert body["preemption"]["by_job"]["id"] == owner.pk
    assert body["preemption"]["by_share"] == "vision"
    assert body["preemption"]["kind"] == "reclaim"
    assert body["preemption"]["why"] == f"reclaimed by share vision for job {owner.pk}"
    assert body["preemption"]["seconds_lost"] == round(lost, 3)
    assert body["preemption"]["gpu_hours_lost"] == round(8 * lost / 3600, 4)
    assert (
        f"it lost {lost / 60:.0f} min on 8 GPUs ({8 * lost / 3600:.2f} GPU-hours)" in body["text"]
    )


def test_a_failed_job_is_told_with_its_reason(world, two_nodes, receiver):
    subscribe(world.bob, [Kind.JOB_FAILED], target=receiver.url("/bob"))
    job = submit(world.bob, "research")
    cycle_run(force=True)
    run(job)
    exit_(job, exit_code=3)
    dispatch()
    (failed,) = receiver.to("/bob")
    assert failed.json["event"] == "job.failed" and failed.json["state"] == "FAILED"
    assert failed.json["reason"] == Job.objects.get(pk=job.pk).reason


def test_a_share_edit_is_one_notification_naming_who_changed_what(world, receiver):
    """root changes two settings of research in one edit: alice, subscribed to its settings,
    gets one message with both changes, and who made them."""
    subscribe(world.alice, [Kind.SHARE_CHANGED], share="research", target=receiver.url("/a"))
    share_update(
        share=world.research, actor=world.root, source="api", borrow_limit=50, grace_seconds=60
    )
    dispatch()
    (changed,) = receiver.to("/a")
    body = changed.json
    assert body["event"] == "share.changed" and body["changed_by"] == "root"
    assert {(c["field"], c["old"], c["new"]) for c in body["changes"]} == {
        ("borrow_limit", "-1", "50"),
        ("grace_seconds", "2", "60"),
    }


def test_a_member_who_left_the_team_hears_no_more_of_its_share(world, receiver):
    subscribe(world.bob, [Kind.SHARE_CHANGED], share="research", target=receiver.url("/b"))
    Membership.objects.filter(user=world.bob).delete()
    share_update(share=world.research, actor=world.root, source="api", grace_seconds=60)
    dispatch()
    assert receiver.requests == [] and not Delivery.objects.exists()


def test_a_failing_endpoint_is_retried_with_backoff_then_given_up(world, receiver):
    """A webhook answering 500 is tried again after 30 s, then 60 s, and given up after its
    third try (NOTIFICATIONS_MAX_ATTEMPTS); every try is recorded with its answer."""
    receiver.status["/down"] = 500
    subscribe(world.alice, [Kind.SHARE_CHANGED], share="research", target=receiver.url("/down"))
    share_update(share=world.research, actor=world.root, source="api", grace_seconds=60)
    dispatch()
    delivery = Delivery.objects.get()
    delays = []
    while delivery.state == Delivery.State.PENDING:
        tried = timezone.datetime.fromisoformat(delivery.tries[-1]["at"])
        delays.append((delivery.next_attempt_at - tried).total_seconds())
        # Not due yet: nothing is sent.
        assert deliveries_send(delivery.next_attempt_at - timedelta(seconds=1)) == 0
        deliveries_send(delivery.next_attempt_at)
        delivery.refresh_from_db()
    assert delays == [30.0, 60.0]
    assert delivery.state == Delivery.State.FAILED and delivery.attempts == 3
    assert len(receiver.to("/down")) == 3
    assert [t["ok"] for t in delivery.tries] == [False, False, False]
    assert delivery.last_error.startswith("HTTP 500")


def test_an_endpoint_that_recovers_gets_its_message(world, receiver):
    receiver.status["/flaky"] = [503, 200]
    subscribe(world.alice, [Kind.SHARE_CHANGED], share="research", target=receiver.url("/flaky"))
    share_update(share=world.research, actor=world.root, source="api", grace_seconds=60)
    dispatch()
    delivery = Delivery.objects.get()
    deliveries_send(delivery.next_attempt_at)
    delivery.refresh_from_db()
    assert delivery.state == Delivery.State.SENT and delivery.attempts == 2
    assert [t["ok"] for t in delivery.tries] == [False, True]
    assert delivery.sent_at is not None and delivery.last_error == ""


def test_a_dead_endpoint_delays_only_its_own_deliveries(world, receiver, dead_url, hanging_url):
    """Three messages to an endpoint that never answers, three to one that refuses
    connections, one to a healthy one: the healthy one gets its message in the same dispatch;
    each dead endpoint is asked once (its timeout or refusal is one try), and its other
    deliveries are recorded as not tried, due with the failed one's retry."""
    hanging = subscribe(world.alice, [Kind.SHARE_CHANGED], share="research", target=hanging_url)
    refusing = subscribe(world.carol, [Kind.SHARE_CHANGED], share="vision", target=dead_url)
    subscribe(world.bob, [Kind.SHARE_CHANGED], share="research", target=receiver.url("/ok"))
    for grace in (10, 20, 30):
        share_update(share=world.research, actor=world.root, source="api", grace_seconds=grace)
        share_update(share=world.vision, actor=world.root, source="api", grace_seconds=grace)
    dispatch()

    assert len(receiver.to("/ok")) == 3
    for subscription in (hanging, refusing):
        first, *rest = Delivery.objects.filter(subscription=subscription).order_by("pk")
        assert first.attempts == 1 and first.state == Delivery.State.PENDING
        for delivery in rest:
            assert delivery.attempts == 1
            assert delivery.last_error == NOT_TRIED.format(detail=first.last_error)
            assert delivery.next_attempt_at == first.next_attempt_at
    assert "Timeout" in Delivery.objects.filter(subscription=hanging).first().last_error


def test_beat_runs_the_dispatch_task_which_sends(world, receiver, settings):
    """Beat's schedule has the dispatch every NOTIFICATIONS_POLL_SECONDS; the Celery task
    (run here by Celery's own apply) sends what is due."""
    app.loader.import_default_modules()
    app.finalize()
    app.on_after_finalize.send(sender=app)
    entry = app.conf.beat_schedule["notifications_dispatch"]
    assert entry["task"] == "notifications.tasks.dispatch"
    assert entry["schedule"] == settings.NOTIFICATIONS_POLL_SECONDS

    subscribe(world.alice, [Kind.SHARE_CHANGED], share="research", target=receiver.url("/a"))
    share_update(share=world.research, actor=world.root, source="api", grace_seconds=60)
    dispatch_task.apply()
    assert len(receiver.to("/a")) == 1


def test_of_two_dispatches_at_once_one_sends(world, receiver):
    """While one dispatch holds the lease, another sends nothing; after it, the next does."""
    subscribe(world.alice, [Kind.SHARE_CHANGED], share="research", target=receiver.url("/a"))
    share_update(share=world.research, actor=world.root, source="api", grace_seconds=60)
    OutboxCursor.objects.update_or_create(
        name="dispatch", defaults={"busy_until": timezone.now() + timedelta(minutes=5)}
    )
    assert dispatch() is False and receiver.requests == []
    OutboxCursor.objects.filter(name="dispatch").update(busy_until=None)
    assert dispatch() is True and len(receiver.to("/a")) == 1

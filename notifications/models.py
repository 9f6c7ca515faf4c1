"""Who wants to hear about what (Subscription), every message sent or being tried (Delivery),
and how far the outbox has read the job events and share changes (OutboxCursor)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from shares.models import QuotaShare


class Kind(models.TextChoices):
    """What happened: the words of the payloads' `event` and of the subscription form."""

    JOB_STARTED = "job.started", "a job started"
    JOB_PREEMPTED = "job.preempted", "a job was preempted"
    JOB_FAILED = "job.failed", "a job failed"
    JOB_FINISHED = "job.finished", "a job finished"
    SHARE_LENT = "share.lent", "the share lent GPUs"
    SHARE_RECLAIMED = "share.reclaimed", "the share's GPUs were reclaimed"
    SHARE_CHANGED = "share.changed", "the share's settings changed"


JOB_KINDS = (Kind.JOB_STARTED, Kind.JOB_PREEMPTED, Kind.JOB_FAILED, Kind.JOB_FINISHED)
SHARE_KINDS = (Kind.SHARE_LENT, Kind.SHARE_RECLAIMED, Kind.SHARE_CHANGED)


class Subscription(models.Model):
    """A user hears of `kinds` of events about their own jobs, or about one share of their
    teams (its jobs, its lending and reclaims, its settings), on one channel."""

    class Scope(models.TextChoices):
        OWN_JOBS = "own_jobs", "my own jobs"
        SHARE = "share", "a share"

    class Channel(models.TextChoices):
        EMAIL = "email", "e-mail"
        WEBHOOK = "webhook", "webhook (JSON, signed)"
        SLACK = "slack", "Slack incoming webhook"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="subscriptions"
    )
    scope = models.CharField(max_length=10, choices=Scope.choices)
    share = models.ForeignKey(
        QuotaShare,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="subscriptions",
        help_text="The share, for scope 'share'.",
    )
    kinds = models.JSONField(help_text="The events to hear of: a list of Kind values.")
    channel = models.CharField(max_length=10, choices=Channel.choices)
    target = models.CharField(
        max_length=2000, help_text="The e-mail address, or the webhook's http(s) URL."
    )
    # HMAC-SHA256 key of a webhook's signature header; shown to its owner once, at creation.
    secret = models.CharField(max_length=128, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user", "id"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(scope="share") & Q(share__isnull=False))
                | (Q(scope="own_jobs") & Q(share__isnull=True)),
                name="subscription_share_with_share_scope",
            )
        ]

    def __str__(self) -> str:
        about = self.share.name if self.share_id else "own jobs"
        return f"{self.user} · {about} · {self.get_channel_display()} {self.target}"


class Delivery(models.Model):
    """One notification for one subscription: its payload, and each try to send it."""

    class State(models.TextChoices):
        PENDING = "PENDING", "Pending (due at next_attempt_at)"
        SENT = "SENT", "Sent"
        FAILED = "FAILED", "Failed (given up)"

    class Source(models.TextChoices):
        JOB_EVENT = "job_event", "Job event"
        SHARE_CHANGE = "share_change", "Share change"

    subscription = models.ForeignKey(
        Subscription, on_delete=models.CASCADE, related_name="deliveries"
    )
    kind = models.CharField(max_length=20, choices=Kind.choices)
    # What it tells of: a JobEvent's or the first ShareChange's id.
    source = models.CharField(max_length=12, choices=Source.choices)
    source_id = models.BigIntegerField()
    payload = models.JSONField()
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True)
    # Every try: [{"at": ISO time, "ok": bool, "detail": the answer or the error}].
    tries = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"
        constraints = [
            # The outbox may read an event twice (two dispatches, a retried read): one delivery.
            models.UniqueConstraint(
                fields=["subscription", "source", "source_id", "kind"], name="delivery_once"
            )
        ]
        indexes = [
            # The dispatch's due deliveries: WHERE state = 'PENDING' AND next_attempt_at <= now.
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(state="PENDING"),
                name="delivery_due",
            ),
            # Pruning: WHERE created_at < cutoff AND state IN ('SENT', 'FAILED').
            models.Index(fields=["created_at"], name="delivery_created"),
        ]
        # The unique constraint's index (subscription, ...) serves a user's deliveries.

    def __str__(self) -> str:
        return f"{self.kind} → {self.subscription.target} ({self.state})"


class OutboxCursor(models.Model):
    """How far the outbox has read one source table: every id up to `position` has been read,
    except those in `gaps` ([[first id, last id, epoch seconds when first missed], ...]): ids
    that later ids overtook, of transactions that had not committed yet, looked for again until
    NOTIFICATIONS_OUTBOX_SETTLE_SECONDS have passed. The row named "dispatch" is the dispatch's
    lease instead (`busy_until`), so two beats never send at once."""

    name = models.CharField(max_length=32, unique=True)
    position = models.BigIntegerField(default=0)
    gaps = models.JSONField(default=list)
    busy_until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} at {self.position} ({len(self.gaps)} gaps)"

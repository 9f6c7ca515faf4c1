"""Writes of notifications: subscriptions (made and removed by their users) and the dispatch,
which turns new events into deliveries and sends those that are due (`dispatch`, one step:
beat's task calls it, tests call it)."""

from __future__ import annotations

import logging
import secrets
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from notifications import channels, targets
from notifications.models import JOB_KINDS, Delivery, Kind, OutboxCursor, Subscription
from notifications.outbox import outbox_start, outbox_step
from shares.selectors import shares_visible_to

logger = logging.getLogger(__name__)

MAX_SUBSCRIPTIONS_PER_USER = 50
SECRET_LENGTHS = (16, 128)
# Messages that tests assert: each names the field and the rule.
SHARE_NEEDED = "share: a subscription to a share names the share."
SHARE_NOT_YOURS = (
    "share: no share named {name!r} among your teams' shares (it does not exist, or you are "
    "not a member of the team that owns it)."
)
SHARE_WITH_OWN_JOBS = "share: a subscription to your own jobs names no share."
KINDS_EMPTY = "kinds: name at least one event: " + ", ".join(Kind.values) + "."
KIND_UNKNOWN = "kinds: unknown event {kind!r}; the events are " + ", ".join(Kind.values) + "."
KIND_NOT_FOR_OWN_JOBS = (
    "kinds: {kind!r} is about a share; a subscription to your own jobs hears of "
    + ", ".join(JOB_KINDS)
    + "."
)
EMAIL_NEEDED = "target: give an e-mail address (your account has none)."
EMAIL_INVALID = "target: {target!r} is not an e-mail address."
URL_INVALID = targets.URL_INVALID
SECRET_ONLY_WEBHOOK = "secret: only a webhook signs its messages; {channel} takes no secret."
SECRET_LENGTH = (
    f"secret: between {SECRET_LENGTHS[0]} and {SECRET_LENGTHS[1]} characters (empty: the portal "
    "makes one)."
)
NOT_TRIED = "not tried: its endpoint was down ({detail})"
TOO_MANY = f"subscriptions: at most {MAX_SUBSCRIPTIONS_PER_USER} per user; delete one first."

DISPATCH = "dispatch"
# A dispatch holds its lease this long at most; one that died is replaced after it. Claimed
# deliveries are not due again before it either, so two dispatches never send one twice.
LEASE = timedelta(minutes=10)


# --- Subscriptions ----------------------------------------------------------------------------


def subscription_create(
    *,
    user,
    scope: str,
    kinds: list[str],
    channel: str,
    target: str = "",
    share_name: str = "",
    secret: str = "",
) -> Subscription:
    """A subscription of `user`, checked: a share of their teams (admins: any), known events
    that fit the scope, a target that fits the channel (a URL whose host the network rule of
    `notifications.targets` allows). A webhook without a secret gets one."""
    errors: dict[str, str] = {}
    share = None
    if scope == Subscription.Scope.SHARE:
        if not share_name:
            errors["share"] = SHARE_NEEDED
        else:
            share = shares_visible_to(user).filter(name=share_name).first()
            if share is None:
                errors["share"] = SHARE_NOT_YOURS.format(name=share_name)
    elif share_name:
        errors["share"] = SHARE_WITH_OWN_JOBS
    kinds = list(dict.fromkeys(kinds))  # once each, in the order given
    if not kinds:
        errors["kinds"] = KINDS_EMPTY
    for kind in kinds:
        if kind not in Kind.values:
            errors["kinds"] = KIND_UNKNOWN.format(kind=kind)
        elif scope == Subscription.Scope.OWN_JOBS and kind not in JOB_KINDS:
            errors["kinds"] = KIND_NOT_FOR_OWN_JOBS.format(kind=kind)
    target = target.strip()
    if channel == Subscription.Channel.EMAIL:
        target = target or (user.email or "")
        if not target:
            errors["target"] = EMAIL_NEEDED
        else:
            try:
                validate_email(target)
            except ValidationError:
                errors["target"] = EMAIL_INVALID.format(target=target)
    else:
        try:
            targets.check_target(target)
        except targets.TargetRefused as error:
            errors["target"] = str(error)
    if channel == Subscription.Channel.WEBHOOK:
        if secret and not SECRET_LENGTHS[0] <= len(secret) <= SECRET_LENGTHS[1]:
            errors["secret"] = SECRET_LENGTH
        secret = secret or secrets.token_urlsafe(32)
    elif secret:
        errors["secret"] = SECRET_ONLY_WEBHOOK.format(channel=channel)
    if Subscription.objects.filter(user=user).count() >= MAX_SUBSCRIPTIONS_PER_USER:
        errors["subscriptions"] = TOO_MANY
    if errors:
        raise ValidationError(errors)
    subscription = Subscription(
        user=user, scope=scope, share=share, kinds=kinds, channel=channel, target=target,
        secret=secret,
    )  # fmt: skip
    subscription.full_clean()
    with transaction.atomic():
        outbox_start()
        subscription.save()
    return subscription


def subscription_delete(*, subscription: Subscription) -> None:
    """Remove the subscription, with its deliveries (those not sent yet are not sent)."""
    subscription.delete()


# --- The dispatch -----------------------------------------------------------------------------


def dispatch(now: datetime | None = None) -> bool:
    """One dispatch: new events become deliveries (`notifications.outbox`), the due ones are
    sent, old records pruned. Of two concurrent calls one does the work (a lease); returns
    whether this one did. Runs in beat's task, never in a request or in the cycle."""
    now = now or timezone.now()
    OutboxCursor.objects.get_or_create(name=DISPATCH)
    claimed = OutboxCursor.objects.filter(
        Q(busy_until__isnull=True) | Q(busy_until__lt=now), name=DISPATCH
    ).update(busy_until=now + LEASE)
    if not claimed:
        return False
    try:
        for _ in range(10):  # a backlog is read a few batches at a time, sends in between
            if not outbox_step(now):
                break
        deliveries_send(now)
        deliveries_prune(now)
    finally:
        OutboxCursor.objects.filter(name=DISPATCH).update(busy_until=None)
    return True


def retry_delay(attempts: int) -> timedelta:
    """How long after its `attempts`-th failed try a delivery is tried again."""
    seconds = settings.NOTIFICATIONS_RETRY_BASE_SECONDS * 2 ** max(0, attempts - 1)
    return timedelta(seconds=min(seconds, settings.NOTIFICATIONS_RETRY_MAX_SECONDS))


def _endpoint(subscription: Subscription) -> str:
    """Deliveries that share an endpoint are sent in order on one thread: all e-mail goes to
    the one SMTP server; webhooks to their URL's host."""
    if subscription.channel == Subscription.Channel.EMAIL:
        return "smtp"
    return urlsplit(subscription.target).netloc.lower()


def _claim(now: datetime) -> list[Delivery]:
    """The due deliveries, claimed: not due again until the lease has passed."""
    with transaction.atomic():
        due = list(
            Delivery.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(state=Delivery.State.PENDING, next_attempt_at__lte=now)
            .order_by("next_attempt_at", "pk")[: settings.NOTIFICATIONS_BATCH]
        )
        Delivery.objects.filter(pk__in=[d.pk for d in due]).update(next_attempt_at=now + LEASE)
    subscriptions = Subscription.objects.in_bulk({d.subscription_id for d in due})
    due = [d for d in due if d.subscription_id in subscriptions]  # not one deleted meanwhile
    for delivery in due:
        delivery.subscription = subscriptions[delivery.subscription_id]
    return due


def deliveries_send(now: datetime | None = None) -> int:
    """Send the due deliveries, each endpoint on a thread of its own (at most
    NOTIFICATIONS_SEND_THREADS at once), and record every try. An endpoint found down fails the
    delivery being sent, and its later ones in this dispatch are not tried but recorded as
    failed with it: a dead endpoint costs one timeout per retry, and delays only its own
    deliveries. Returns how many were sent."""
    now = now or timezone.now()
    due = _claim(now)
    if not due:
        return 0
    groups: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in due:
        groups[_endpoint(delivery.subscription)].append(delivery)
    messages = {
        endpoint: [
            channels.Message(
                delivery_id=d.pk,
                channel=d.subscription.channel,
                target=d.subscription.target,
                secret=d.subscription.secret,
                kind=d.kind,
                payload=d.payload,
            )
            for d in deliveries
        ]
        for endpoint, deliveries in groups.items()
    }
    threads = max(1, min(settings.NOTIFICATIONS_SEND_THREADS, len(groups)))
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="notify") as pool:
        results = dict(zip(messages, pool.map(channels.send_group, messages.values()), strict=True))
    sent = 0
    for endpoint, deliveries in groups.items():
        sent += _record(deliveries, results[endpoint])
    return sent


def _record(deliveries: list[Delivery], outcomes: list[channels.Outcome | None]) -> int:
    """Write what became of one endpoint's deliveries. One not tried because its endpoint was
    down counts that failure as a try of its own: the endpoint's deliveries are retried, and
    given up, together."""
    now = timezone.now()
    down: channels.Outcome | None = None
    sent = 0
    for delivery, outcome in zip(deliveries, outcomes, strict=True):
        if outcome is None:
            outcome = channels.Outcome(False, NOT_TRIED.format(detail=down.detail), True)
        elif outcome.endpoint_down:
            down = outcome
        delivery.attempts += 1
        delivery.tries = [
            *delivery.tries,
            {"at": now.isoformat(), "ok": outcome.ok, "detail": outcome.detail},
        ]
        if outcome.ok:
            delivery.state, delivery.sent_at, delivery.last_error = Delivery.State.SENT, now, ""
            sent += 1
            continue
        delivery.last_error = outcome.detail
        if outcome.give_up or delivery.attempts >= settings.NOTIFICATIONS_MAX_ATTEMPTS:
            delivery.state = Delivery.State.FAILED
            logger.warning("delivery %s given up: %s", delivery.pk, outcome.detail)
        else:
            delivery.next_attempt_at = now + retry_delay(delivery.attempts)
    Delivery.objects.bulk_update(
        deliveries, ["state", "attempts", "next_attempt_at", "last_error", "tries", "sent_at"]
    )
    return sent


def delivery_retry(*, delivery: Delivery) -> None:
    """Try a delivery again at the next dispatch (an admin's action), also one given up."""
    Delivery.objects.filter(pk=delivery.pk).exclude(state=Delivery.State.SENT).update(
        state=Delivery.State.PENDING, next_attempt_at=timezone.now()
    )


def deliveries_prune(now: datetime | None = None) -> int:
    """Drop sent and given-up deliveries older than NOTIFICATIONS_RETENTION_DAYS."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.NOTIFICATIONS_RETENTION_DAYS)
    deleted, _ = Delivery.objects.filter(
        created_at__lt=cutoff, state__in=(Delivery.State.SENT, Delivery.State.FAILED)
    ).delete()
    return deleted

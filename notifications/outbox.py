"""The outbox: job events and share changes become deliveries, read after the fact from the
tables the scheduler and the services already write (nothing is added to the request's or the
cycle's transaction, and nothing runs there).

Each step reads the rows after a stored cursor in a transaction of its own, turns them into
notices (`notifications.events`), matches them with subscriptions and writes one Delivery per
notice and subscription, and moves the cursor, all or nothing: a crash leaves the rows to read
again, and reading one twice writes no second delivery (a unique constraint).

Ids are handed out when rows are inserted, not when their transactions commit: a row with a
lower id may become visible after a higher one was read. So the cursor also keeps the ids it
skipped ("gaps") and looks for them again at each step, until they show up or
NOTIFICATIONS_OUTBOX_SETTLE_SECONDS have passed (a transaction that rolled back leaves gaps
that never fill)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import models, transaction
from django.db.models import Max, Q
from django.utils import timezone

from notifications.events import INTERESTING, Notice, job_event_notices, share_change_notices
from notifications.models import Delivery, OutboxCursor, Subscription
from scheduler.models import JobEvent
from shares.models import Membership, QuotaShare, ShareChange
from shares.selectors import is_admin

# A pathological run of skipped ids (a huge rolled-back cycle) is looked for as ranges; beyond
# this many ranges the oldest are given up early rather than making every read slower.
MAX_GAP_RANGES = 200


@dataclass(frozen=True)
class Source:
    name: str
    model: type[models.Model]
    # Rows worth loading in full (the others only move the cursor), and how to load them.
    interesting: Q
    load: Callable[[Sequence[int]], list]
    notices: Callable[[list], list[Notice]]


def _load_events(ids: Sequence[int]) -> list[JobEvent]:
    return list(
        JobEvent.objects.filter(pk__in=ids)
        .select_related("job__share", "job__submitted_by")
        .order_by("pk")
    )


def _load_changes(ids: Sequence[int]) -> list[ShareChange]:
    return list(
        ShareChange.objects.filter(pk__in=ids).select_related("share", "changed_by").order_by("pk")
    )


SOURCES = (
    Source("job_event", JobEvent, INTERESTING, _load_events, job_event_notices),
    Source("share_change", ShareChange, Q(), _load_changes, share_change_notices),
)


def outbox_step(now: datetime | None = None) -> bool:
    """Read one batch of each source into deliveries. Returns whether a source has more."""
    more = False
    for source in SOURCES:
        more |= _read(source, now or timezone.now())
    return more


def outbox_start() -> None:
    """Create the cursors that do not exist yet, after the rows already there: what happened
    before the first subscription is not notified (the first subscription calls this)."""
    for source in SOURCES:
        if not OutboxCursor.objects.filter(name=source.name).exists():
            latest = source.model.objects.aggregate(latest=Max("pk"))["latest"] or 0
            OutboxCursor.objects.get_or_create(name=source.name, defaults={"position": latest})


def _cursor(source: Source) -> OutboxCursor:
    """The source's cursor, locked."""
    outbox_start()
    return OutboxCursor.objects.select_for_update().get(name=source.name)


def _read(source: Source, now: datetime) -> bool:
    limit = settings.NOTIFICATIONS_BATCH
    with transaction.atomic():
        cursor = _cursor(source)
        subscriptions = list(Subscription.objects.all())
        if not subscriptions:
            # Nobody listens: nothing to look for, now or later.
            latest = source.model.objects.aggregate(latest=Max("pk"))["latest"] or 0
            cursor.position, cursor.gaps = max(cursor.position, latest), []
            cursor.save(update_fields=["position", "gaps"])
            return False
        wanted = Q(pk__gt=cursor.position)
        for first, last, _noticed in cursor.gaps:
            wanted |= Q(pk__gte=first, pk__lte=last)
        rows = list(
            source.model.objects.filter(wanted).order_by("pk").values_list("pk", flat=True)[:limit]
        )
        interesting = set(
            source.model.objects.filter(source.interesting, pk__in=rows).values_list(
                "pk", flat=True
            )
        ) if source.interesting else set(rows)  # fmt: skip
        notices = source.notices(source.load(sorted(interesting)))
        deliveries_create(notices, subscriptions, now=now)
        cursor.position, cursor.gaps = _advance(cursor.position, cursor.gaps, rows, now)
        cursor.save(update_fields=["position", "gaps"])
    return len(rows) == limit


def _advance(
    position: int, gaps: list, rows: Sequence[int], now: datetime
) -> tuple[int, list[list]]:
    """The cursor after reading `rows` (ids, ascending): found gap ids leave their ranges, ids
    skipped past the old position become ranges, ranges older than the settle time go."""
    found = [row for row in rows if row <= position]
    ranges: list[list] = []
    for first, last, noticed in gaps:
        start = first
        for row in found:
            if first <= row <= last:
                if row > start:
                    ranges.append([start, row - 1, noticed])
                start = row + 1
        if start <= last:
            ranges.append([start, last, noticed])
    stamp = now.timestamp()
    expected = position + 1
    for row in rows:
        if row <= position:
            continue
        if row > expected:
            ranges.append([expected, row - 1, stamp])
        expected = row + 1
    settle = settings.NOTIFICATIONS_OUTBOX_SETTLE_SECONDS
    ranges = [r for r in ranges if stamp - r[2] < settle]
    ranges.sort(key=lambda r: r[0])
    return expected - 1, ranges[-MAX_GAP_RANGES:]


def deliveries_create(
    notices: Sequence[Notice], subscriptions: Sequence[Subscription], *, now: datetime
) -> int:
    """One PENDING delivery, due now, per notice and subscription that wants it: a
    subscription to own jobs hears of its user's jobs; one to a share of that share, while its
    user is still on the share's team (or an admin). Returns how many were written."""
    if not notices:
        return 0
    by_owner: dict[int, list[Subscription]] = defaultdict(list)
    by_share: dict[int, list[Subscription]] = defaultdict(list)
    for subscription in subscriptions:
        if subscription.scope == Subscription.Scope.OWN_JOBS:
            by_owner[subscription.user_id].append(subscription)
        else:
            by_share[subscription.share_id].append(subscription)
    allowed = _share_members(by_share)
    rows = []
    for notice in notices:
        matched = list(by_owner.get(notice.owner_id, ())) if notice.owner_id else []
        for share_id in notice.shares:
            matched += [s for s in by_share.get(share_id, ()) if (s.user_id, share_id) in allowed]
        for subscription in matched:
            if notice.kind in subscription.kinds:
                rows.append(
                    Delivery(
                        subscription=subscription,
                        kind=notice.kind,
                        source=notice.source,
                        source_id=notice.source_id,
                        payload=notice.payload,
                        next_attempt_at=now,
                    )
                )
    Delivery.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def _share_members(by_share: dict[int, list[Subscription]]) -> set[tuple[int, int]]:
    """(user id, share id) of the share subscriptions whose users may still see the share."""
    users = {s.user_id for subs in by_share.values() for s in subs}
    if not users:
        return set()
    admins = {user.pk for user in get_user_model().objects.filter(pk__in=users) if is_admin(user)}
    teams = defaultdict(set)
    for user_id, team_id in Membership.objects.filter(user_id__in=users).values_list(
        "user_id", "team_id"
    ):
        teams[user_id].add(team_id)
    share_team = dict(QuotaShare.objects.filter(pk__in=by_share).values_list("pk", "team_id"))
    return {
        (s.user_id, share_id)
        for share_id, subs in by_share.items()
        for s in subs
        if s.user_id in admins or share_team.get(share_id) in teams[s.user_id]
    }

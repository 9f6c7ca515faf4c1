"""Skipping idle cycles: a cycle whose fingerprint (everything a plan depends on, and the count
of commits that asked for a cycle) is the last one's would plan the same, so it skips the
engine. Without Redis every cycle is a full one."""

from __future__ import annotations

import hashlib
import logging
import time
from functools import cache
from typing import NamedTuple

from django.conf import settings
from django.db import connection

from portal.db.sql import prepared_cursor
from portal.redis import redis_client
from scheduler.models import GpuAssignment, Job, JobAttempt, JobEvent, Node
from shares.models import QuotaShare, ShareChange

logger = logging.getLogger(__name__)

FINGERPRINT_KEY = "portal:cycle:fingerprint:{db}"
# Counts the commits that asked for a cycle (`note_change`): a cycle that saw the count change
# since the last one started does not skip, even if the data it reads looks the same.
CHANGES_KEY = "portal:cycle:changes:{db}"
# The count of changes the last committed cycle had seen before its snapshot: a cycle asked for
# by a change up to it has nothing left to do (a request queued while a cycle ran, or behind a
# cycle that started after it).
COVERED_KEY = "portal:cycle:covered:{db}"
# Stands while a published cycle has not started reading the database (`cycle_started`).
QUEUED_KEY = "portal:cycle:queued:{db}"


# The jobs a plan depends on: those waiting and those holding GPUs.
_ACTIVE_STATES = (Job.State.RUNNABLE, *Job.PLACED_STATES)


def fingerprint(changes: int | None) -> str:
    """A digest of everything the plan depends on, and of the count of commits that asked for
    a cycle. Equal digests: the plan would be the same."""
    with prepared_cursor() as cursor:
        cursor.execute(_fingerprint_sql(), [*_ACTIVE_STATES, False])
        totals = cursor.fetchone()
        cursor.execute(_fingerprint_nodes_sql())
        nodes = cursor.fetchall()
    text = repr((totals, nodes, changes, settings.BORROW_ORDER))
    return hashlib.sha256(text.encode()).hexdigest()


@cache
def _fingerprint_sql() -> str:
    """One row: active jobs (count, last update, priorities), GPUs held (count, last id), open
    attempts (count, stopping), shares (count, last update), last share change, last job
    event. Every table's part is served by an index or a small table."""
    table = {
        model: connection.ops.quote_name(model._meta.db_table)
        for model in (Job, GpuAssignment, JobAttempt, QuotaShare, ShareChange, JobEvent)
    }
    states = ", ".join(["%s"] * len(_ACTIVE_STATES))
    return (
        "SELECT * FROM "
        f"(SELECT COUNT(id), MAX(updated_at), SUM(priority) FROM {table[Job]} "
        f"WHERE state IN ({states})) AS jobs, "
        f"(SELECT COUNT(id), MAX(id) FROM {table[GpuAssignment]} WHERE released = %s) AS held, "
        f"(SELECT COUNT(id), COUNT(stop_requested_at), MAX(last_checkpoint_at) "
        f"FROM {table[JobAttempt]} WHERE ended_at IS NULL) AS attempts, "
        f"(SELECT COUNT(id), MAX(updated_at) FROM {table[QuotaShare]}) AS shares, "
        f"(SELECT MAX(id) FROM {table[ShareChange]}) AS share_changes, "
        f"(SELECT MAX(id) FROM {table[JobEvent]}) AS events"
    )


@cache
def _fingerprint_nodes_sql() -> str:
    return (
        "SELECT id, state, gpus, gpu_type, outside_gpus "
        f"FROM {connection.ops.quote_name(Node._meta.db_table)} "
        "ORDER BY id"
    )


class Change(NamedTuple):
    number: int | None  # None without Redis
    publish: bool  # no queued cycle will see it: the request publishes one


def note_change() -> Change:
    """After a commit that asks for a cycle: count it (see CHANGES_KEY), and mark a cycle
    queued unless one is (see QUEUED_KEY), in one round trip to Redis. `publish`: no queued
    cycle will read the database after this commit, so the request publishes one. The mark
    expires on its own (CYCLE_INTERVAL_SECONDS), so a worker that died with the message taken
    holds nothing up for long; beat runs cycles meanwhile."""
    db = connection.settings_dict["NAME"]
    ttl_ms = max(1000, int(settings.CYCLE_INTERVAL_SECONDS * 1000))
    try:
        pipe = redis_client().pipeline(transaction=False)
        pipe.incr(CHANGES_KEY.format(db=db))
        pipe.set(QUEUED_KEY.format(db=db), "1", nx=True, px=ttl_ms)
        number, marked = pipe.execute()
    except Exception:  # noqa: BLE001 — without Redis nothing is skipped (no fingerprint kept)
        logger.warning("could not count a change for the cycle", exc_info=True)
        return Change(None, True)
    return Change(int(number), bool(marked))


def cycle_started() -> None:
    """A cycle holds the lock and is about to read the database: requests from now on are not
    covered by it, and publish the next one."""
    try:
        redis_client().delete(QUEUED_KEY.format(db=connection.settings_dict["NAME"]))
    except Exception:  # noqa: BLE001 — the mark expires by itself
        logger.warning("could not clear the queued cycle's mark", exc_info=True)


def covered(change: int) -> bool:
    """Whether a committed cycle already saw the change numbered `change` (`note_change`): it
    read the count after that change's commit, and before its snapshot (see `cover`)."""
    try:
        value = redis_client().get(COVERED_KEY.format(db=connection.settings_dict["NAME"]))
    except Exception:  # noqa: BLE001 — not known: the cycle runs
        return False
    return value is not None and int(value) >= change


def cover(changes: int | None) -> None:
    """After a cycle's commit: the changes counted up to `changes` (the count it read before
    its snapshot) are planned for."""
    if changes is None:
        return
    try:
        redis_client().set(
            COVERED_KEY.format(db=connection.settings_dict["NAME"]),
            changes,
            ex=max(1, int(settings.CYCLE_FULL_EVERY_SECONDS)),
        )
    except Exception:  # noqa: BLE001
        logger.warning("could not store the changes a cycle covered", exc_info=True)


def changes_seen() -> int | None:
    try:
        value = redis_client().get(CHANGES_KEY.format(db=connection.settings_dict["NAME"]))
    except Exception:  # noqa: BLE001
        return None
    return int(value) if value else 0


def _fingerprint_key() -> str:
    return FINGERPRINT_KEY.format(db=connection.settings_dict["NAME"])


def unchanged(changes: int | None) -> bool:
    """Whether nothing a plan depends on changed since the last cycle remembered its
    fingerprint (`remember`), `changes` being the count of commits that asked for a cycle now.
    While commits keep asking (a busy queue), the count alone says so: the fingerprint, which
    reads every active job, is not computed."""
    try:
        value = redis_client().get(_fingerprint_key())
    except Exception:  # noqa: BLE001 — without Redis every cycle is a full one
        return False
    if not value:
        return False
    last_changes, _, rest = value.decode().partition(":")
    last_digest, _, wake_at = rest.partition(":")
    if last_changes != repr(changes) or not last_digest:
        return False
    if wake_at and time.time() >= float(wake_at):
        return False  # time alone may let the plan decide otherwise (Plan.wake_at)
    return fingerprint(changes) == last_digest


def remember(changes: int | None, *, changed: bool, wake_at: float | None = None) -> None:
    """Remember what this cycle leaves, with `changes` (the count it read before its snapshot),
    for the next cycle's `unchanged`: its fingerprint, unless the cycle `changed` what a
    fingerprint reads (it placed, preempted, rejected, stopped or lost jobs). Then the next
    cycle with no new change plans once more and remembers the fingerprint of what that one
    leaves: a busy queue's cycles, which change something nearly every time, do not each read
    every active job for a fingerprint no cycle will use. `wake_at` (the plan's): from then on
    the same fingerprint no longer means the same plan (a minimum runtime or a churn hold
    ends), so the first cycle after it plans."""
    digest = "" if changed else fingerprint(changes)
    wake = "" if wake_at is None else repr(wake_at)
    try:
        redis_client().set(
            _fingerprint_key(),
            f"{changes!r}:{digest}:{wake}",
            ex=max(1, int(settings.CYCLE_FULL_EVERY_SECONDS)),
        )
    except Exception:  # noqa: BLE001
        logger.warning("could not store the cycle fingerprint", exc_info=True)

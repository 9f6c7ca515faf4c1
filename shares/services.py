"""Writes to teams and shares. Every change to a share is recorded in its history."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from scheduler.cycle.trigger import request_cycle
from scheduler.models import Job
from shares.models import (
    CAPACITY_LIMITS_COUNT,
    MAX_GPU_TYPES_PER_SHARE,
    CapacityLimit,
    QuotaShare,
    ShareChange,
    Team,
)

LEND_LIMIT_UNKNOWN_TYPE = "lend_limit: GPU type {gpu_type} has no capacity limit in this share."
NOT_A_SETTING = "{field}: not a share setting."

SHARE_FIELDS = (
    "team",
    "strategy",
    "borrow_limit",
    "in_share_preemption",
    "grace_seconds",
    "min_runtime_seconds",
    "state",
    "weight",
    "strict_fifo",
)


def describe_limits(limits: Mapping[str, int], lend_limits: Mapping[str, int]) -> str:
    """'a100-80g: 8, h100: 16 (lends at most 4)' — how history shows a capacity map."""
    parts = []
    for gpu_type in sorted(limits):
        part = f"{gpu_type}: {limits[gpu_type]}"
        if gpu_type in lend_limits:
            part += f" (lends at most {lend_limits[gpu_type]})"
        parts.append(part)
    return ", ".join(parts)


def share_state(share: QuotaShare) -> dict[str, str]:
    """The share's settings as text, field by field, for its change history."""
    state = {name: str(getattr(share, name)) for name in SHARE_FIELDS}
    # Read the limits afresh: a prefetched set would predate the inline formsets' save.
    limits = CapacityLimit.objects.filter(share=share)
    state["capacity_limits"] = describe_limits(
        {limit.gpu_type: limit.max_gpus for limit in limits},
        {limit.gpu_type: limit.lend_limit for limit in limits if limit.lend_limit is not None},
    )
    return state


def share_record_changes(
    *,
    share: QuotaShare,
    before: Mapping[str, str],
    actor: AbstractBaseUser | None,
    source: str,
) -> list[ShareChange]:
    """Record one ShareChange per field whose value differs from `before` (empty `before`:
    the share was created, every field is recorded from '')."""
    after = share_state(share)
    changes = [
        ShareChange(
            share=share,
            changed_by=actor if actor is not None and actor.is_authenticated else None,
            source=source,
            field=name,
            old_value=before.get(name, ""),
            new_value=value,
        )
        for name, value in after.items()
        if before.get(name, "") != value
    ]
    ShareChange.objects.bulk_create(changes)
    if changes:
        # A share change can let queued jobs run (or make running ones reclaimable) now.
        request_cycle()
    return changes


def validate_capacity_limits(capacity_limits: Mapping[str, Any]) -> None:
    if not 1 <= len(capacity_limits) <= MAX_GPU_TYPES_PER_SHARE:
        raise ValidationError({"capacity_limits": CAPACITY_LIMITS_COUNT})


def _normalise_lend_limit(
    lend_limit: int | Mapping[str, int] | None, gpu_types: list[str]
) -> dict[str, int]:
    # DESIGN §2: a plain number means the same lend limit for every type.
    if lend_limit is None:
        return {}
    if isinstance(lend_limit, int):
        return dict.fromkeys(gpu_types, lend_limit)
    return dict(lend_limit)


def _write_limits(
    share: QuotaShare, capacity_limits: Mapping[str, int], lend_limits: Mapping[str, int]
) -> None:
    validate_capacity_limits(capacity_limits)
    unknown = sorted(set(lend_limits) - set(capacity_limits))
    if unknown:
        raise ValidationError({"lend_limit": LEND_LIMIT_UNKNOWN_TYPE.format(gpu_type=unknown[0])})
    share.capacity_limits.all().delete()
    for gpu_type, max_gpus in sorted(capacity_limits.items()):
        limit = CapacityLimit(
            share=share, gpu_type=gpu_type, max_gpus=max_gpus, lend_limit=lend_limits.get(gpu_type)
        )
        limit.full_clean(exclude=["share"])
        limit.save()


@transaction.atomic
def share_create(
    *,
    name: str,
    team: Team,
    capacity_limits: Mapping[str, int],
    strategy: str = QuotaShare.Strategy.LEND_AND_BORROW,
    lend_limit: int | Mapping[str, int] | None = None,
    actor: AbstractBaseUser | None = None,
    source: str = ShareChange.Source.COMMAND,
    **settings: Any,
) -> QuotaShare:
    """Create a share with its limits; raises ValidationError naming the field and the rule."""
    unknown = sorted(set(settings) - set(SHARE_FIELDS))
    if unknown:
        raise ValidationError({unknown[0]: NOT_A_SETTING.format(field=unknown[0])})
    validate_capacity_limits(capacity_limits)
    share = QuotaShare(name=name, team=team, strategy=strategy, **settings)
    share.full_clean()
    share.save()
    _write_limits(share, capacity_limits, _normalise_lend_limit(lend_limit, list(capacity_limits)))
    share_record_changes(share=share, before={}, actor=actor, source=source)
    return share


@transaction.atomic
def share_update(
    *,
    share: QuotaShare,
    actor: AbstractBaseUser | None,
    source: str,
    capacity_limits: Mapping[str, int] | None = None,
    lend_limit: int | Mapping[str, int] | None = None,
    **changes: Any,
) -> QuotaShare:
    """Change a share's settings and record each changed field. `capacity_limits` replaces the
    whole map. Lowering a limit preempts nothing by itself: the share's jobs above the new limit
    become borrowers, preemptible by a reclaim."""
    unknown = sorted(set(changes) - set(SHARE_FIELDS))
    if unknown:
        raise ValidationError({unknown[0]: NOT_A_SETTING.format(field=unknown[0])})
    share = QuotaShare.objects.select_for_update().get(pk=share.pk)
    before = share_state(share)
    for name, value in changes.items():
        setattr(share, name, value)
    share.full_clean()
    share.save()
    if capacity_limits is not None or lend_limit is not None:
        limits = capacity_limits if capacity_limits is not None else share.limits
        lend_limits = (
            _normalise_lend_limit(lend_limit, list(limits))
            if lend_limit is not None
            else {t: v for t, v in share.lend_limits.items() if t in limits}
        )
        _write_limits(share, limits, lend_limits)
    share_record_changes(share=share, before=before, actor=actor, source=source)
    return share


def share_set_state(
    *, share: QuotaShare, state: str, actor: AbstractBaseUser | None, source: str
) -> QuotaShare:
    """Enable or disable a share. A DISABLED share refuses new jobs; its queued and running
    jobs carry on."""
    return share_update(share=share, actor=actor, source=source, state=state)


SHARE_HAS_UNFINISHED = (
    "quota share {name} has {count} job(s) that have not finished: cancel them or let them end "
    "first."
)
SHARE_HAS_HISTORY = (
    "quota share {name} keeps the records of {count} finished job(s): disable it (state "
    "DISABLED) instead, which refuses new jobs and keeps the history."
)


@transaction.atomic
def share_delete(*, share: QuotaShare) -> None:
    """Delete a share that has no job: one with jobs not finished is refused (they would be
    lost), and so is one with finished jobs, whose records the portal keeps (disable it)."""
    share = QuotaShare.objects.select_for_update().get(pk=share.pk)
    unfinished = share.jobs.exclude(state__in=Job.FINAL_STATES).count()
    if unfinished:
        raise ValidationError({"share": SHARE_HAS_UNFINISHED.format(name=share.name,
                                                                   count=unfinished)})  # fmt: skip
    finished = share.jobs.count()
    if finished:
        raise ValidationError({"share": SHARE_HAS_HISTORY.format(name=share.name, count=finished)})
    share.delete()
    request_cycle()

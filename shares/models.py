"""Teams and their quota shares (DESIGN §2): who may use how many GPUs of each type, and how
idle GPUs are lent and borrowed."""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from scheduler.engine.snapshot import ShareView
from scheduler.limits import GPU_TYPE_PATTERN

MAX_GPU_TYPES_PER_SHARE = 5
MAX_GRACE_SECONDS = 86400
MAX_MIN_RUNTIME_SECONDS = 7 * 86400

# Messages that tests assert: each names the field and the rule.
BORROW_LIMIT_ONLY_WITH_LEND_AND_BORROW = (
    "borrow_limit: only a LEND_AND_BORROW share may borrow; use -1 (no borrowing cap) for "
    "RESERVE and LEND shares."
)
BORROW_LIMIT_RANGE = "borrow_limit: must be -1 (no cap beyond the cluster) or a percent ≥ 0."
GRACE_SECONDS_RANGE = (
    f"grace_seconds: must be a whole number between 0 and {MAX_GRACE_SECONDS} seconds."
)
MIN_RUNTIME_RANGE = (
    f"min_runtime_seconds: must be a whole number between 0 and {MAX_MIN_RUNTIME_SECONDS} seconds."
)
WEIGHT_POSITIVE = "weight: must be greater than 0."
MAX_GPUS_POSITIVE = "max_gpus: a capacity limit must be at least 1 GPU."
LEND_LIMIT_ABOVE_LIMIT = "lend_limit: cannot lend more than the limit ({max_gpus} {gpu_type} GPUs)."
LEND_LIMIT_NEGATIVE = "lend_limit: must be 0 or more GPUs."
CAPACITY_LIMITS_COUNT = (
    f"capacity_limits: a share needs between 1 and {MAX_GPU_TYPES_PER_SHARE} GPU types."
)
CAPACITY_LIMITS_DUPLICATE = "capacity_limits: GPU type {gpu_type} is listed twice."
GPU_TYPE_FORMAT = (
    "gpu_type: use lowercase letters, digits and dashes, like h100 or a100-80g (got {value!r})."
)


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=50, unique=True)
    description = models.TextField(blank=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="teams"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        LEAD = "LEAD", "Team lead"
        MEMBER = "MEMBER", "Member"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="membership_once_per_team")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.get_role_display()})"


class QuotaShare(models.Model):
    """A team's quota share: capacity limits per GPU type and a sharing strategy."""

    class Strategy(models.TextChoices):
        RESERVE = "RESERVE", "Reserve (never lend, never borrow)"
        LEND = "LEND", "Lend idle GPUs, never borrow"
        LEND_AND_BORROW = "LEND_AND_BORROW", "Lend idle GPUs and borrow"

    class State(models.TextChoices):
        ENABLED = "ENABLED", "Enabled"
        DISABLED = "DISABLED", "Disabled (rejects new jobs)"

    name = models.SlugField(max_length=63, unique=True)
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="shares")
    strategy = models.CharField(
        max_length=20, choices=Strategy.choices, default=Strategy.LEND_AND_BORROW
    )
    borrow_limit = models.IntegerField(
        default=-1,
        help_text="Extra GPUs a LEND_AND_BORROW share may borrow, as a percent of each limit "
        "(rounded down); -1: no cap beyond the cluster.",
    )
    in_share_preemption = models.BooleanField(
        default=False,
        help_text="A job may preempt strictly lower-priority jobs of its own share.",
    )
    grace_seconds = models.PositiveIntegerField(
        default=120,
        validators=[MaxValueValidator(MAX_GRACE_SECONDS)],
        help_text="Time between SIGTERM and SIGKILL when a job is preempted, to checkpoint.",
    )
    min_runtime_seconds = models.PositiveIntegerField(
        default=0,
        validators=[MaxValueValidator(MAX_MIN_RUNTIME_SECONDS)],
        help_text="A job of this share is no victim of a preemption (reclaim or in-share) "
        "before it has run this long; the owner's wait for a reclaim stays within it plus the "
        "grace period.",
    )
    state = models.CharField(max_length=10, choices=State.choices, default=State.ENABLED)
    weight = models.FloatField(
        default=1.0, help_text="Share of idle capacity among borrowers when borrow order is fair."
    )
    strict_fifo = models.BooleanField(
        default=False,
        help_text="The first job that cannot be placed blocks the share's later jobs of its type.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(borrow_limit__gte=-1), name="share_borrow_limit_at_least_minus_one"
            ),
            models.CheckConstraint(
                condition=Q(strategy="LEND_AND_BORROW") | Q(borrow_limit=-1),
                name="share_borrow_limit_only_with_lend_and_borrow",
            ),
            models.CheckConstraint(
                condition=Q(grace_seconds__lte=MAX_GRACE_SECONDS), name="share_grace_seconds_range"
            ),
            models.CheckConstraint(condition=Q(weight__gt=0), name="share_weight_positive"),
            models.CheckConstraint(
                condition=Q(min_runtime_seconds__lte=MAX_MIN_RUNTIME_SECONDS),
                name="share_min_runtime_seconds_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.borrow_limit is not None:
            if self.borrow_limit < -1:
                errors["borrow_limit"] = BORROW_LIMIT_RANGE
            elif self.borrow_limit != -1 and self.strategy != self.Strategy.LEND_AND_BORROW:
                errors["borrow_limit"] = BORROW_LIMIT_ONLY_WITH_LEND_AND_BORROW
        if self.grace_seconds is not None and not 0 <= self.grace_seconds <= MAX_GRACE_SECONDS:
            errors["grace_seconds"] = GRACE_SECONDS_RANGE
        if self.weight is not None and self.weight <= 0:
            errors["weight"] = WEIGHT_POSITIVE
        if self.min_runtime_seconds is not None and not (
            0 <= self.min_runtime_seconds <= MAX_MIN_RUNTIME_SECONDS
        ):
            errors["min_runtime_seconds"] = MIN_RUNTIME_RANGE
        if errors:
            raise ValidationError(errors)

    @property
    def limits(self) -> dict[str, int]:
        """{gpu_type: max_gpus}."""
        return {limit.gpu_type: limit.max_gpus for limit in self.capacity_limits.all()}

    @property
    def lend_limits(self) -> dict[str, int]:
        """{gpu_type: lend_limit} for the types that set one."""
        return {
            limit.gpu_type: limit.lend_limit
            for limit in self.capacity_limits.all()
            if limit.lend_limit is not None
        }

    def engine_view(self) -> ShareView:
        """The share as the engine sees it (load it with its capacity_limits prefetched)."""
        return ShareView(
            name=self.name,
            capacity_limits=self.limits,
            strategy=self.strategy,
            borrow_limit=self.borrow_limit,
            lend_limit=self.lend_limits or None,
            in_share_preemption=self.in_share_preemption,
            grace_seconds=self.grace_seconds,
            state=self.state,
            weight=self.weight,
            strict_fifo=self.strict_fifo,
            min_runtime_seconds=self.min_runtime_seconds,
        )


def validate_gpu_type(value: str) -> None:
    if not re.fullmatch(GPU_TYPE_PATTERN, value or ""):
        raise ValidationError(GPU_TYPE_FORMAT.format(value=value))


class CapacityLimit(models.Model):
    """A share's limit for one GPU type, and how many of its idle GPUs it lends at most."""

    share = models.ForeignKey(QuotaShare, on_delete=models.CASCADE, related_name="capacity_limits")
    gpu_type = models.CharField(max_length=32, validators=[validate_gpu_type])
    max_gpus = models.PositiveIntegerField(
        validators=[MinValueValidator(1, message=MAX_GPUS_POSITIVE)]
    )
    lend_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="At most this many idle GPUs are lent; the rest stay reserved. Empty: all.",
    )

    class Meta:
        ordering = ["gpu_type"]
        constraints = [
            models.UniqueConstraint(
                fields=["share", "gpu_type"], name="capacity_limit_once_per_type"
            ),
            models.CheckConstraint(
                condition=Q(max_gpus__gte=1), name="capacity_limit_at_least_one"
            ),
            models.CheckConstraint(
                condition=Q(lend_limit__isnull=True) | Q(lend_limit__lte=F("max_gpus")),
                name="capacity_lend_limit_within_limit",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.max_gpus} × {self.gpu_type}"

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if (
            self.lend_limit is not None
            and self.max_gpus is not None
            and self.lend_limit > self.max_gpus
        ):
            errors["lend_limit"] = LEND_LIMIT_ABOVE_LIMIT.format(
                max_gpus=self.max_gpus, gpu_type=self.gpu_type
            )
        if errors:
            raise ValidationError(errors)


class ShareChange(models.Model):
    """One field of a share changed: who, when, from what to what, and through which door."""

    class Source(models.TextChoices):
        ADMIN = "admin", "Admin site"
        API = "api", "REST API"
        COMMAND = "command", "Management command"

    share = models.ForeignKey(QuotaShare, on_delete=models.CASCADE, related_name="changes")
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    changed_at = models.DateTimeField(auto_now_add=True)
    source = models.CharField(max_length=10, choices=Source.choices)
    field = models.CharField(max_length=64)
    old_value = models.TextField(blank=True)
    new_value = models.TextField(blank=True)

    class Meta:
        ordering = ["-changed_at", "-id"]
        # The share page lists its history newest first.
        indexes = [models.Index(fields=["share", "-changed_at"], name="share_change_history")]

    def __str__(self) -> str:
        return f"{self.share}: {self.field} {self.old_value} → {self.new_value}"

"""GPU nodes, jobs and their attempts (DESIGN §2 job states)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Mod
from django.db.models.lookups import Exact
from django.urls import reverse

from scheduler.engine import outcomes
from scheduler.engine.snapshot import CHURN_PREEMPTIONS, CHURN_WINDOW_SECONDS, Allocation
from scheduler.limits import MAX_GPUS_PER_NODE
from shares.models import QuotaShare, validate_gpu_type

MAX_PRIORITY = 9999
MAX_TIMEOUT_SECONDS = 90 * 86400
MAX_RETRY_ATTEMPTS = 20

GPUS_DIVISIBLE_BY_NODES = (
    "gpus: must be divisible by nodes (each of the {nodes} nodes gets the same number of GPUs)."
)
PRIORITY_RANGE = f"priority: must be a whole number between 0 and {MAX_PRIORITY}."


def priority_in_range(priority: int) -> bool:
    return 0 <= priority <= MAX_PRIORITY


TIMEOUT_RANGE = (
    f"timeout_seconds: must be a whole number between 1 and {MAX_TIMEOUT_SECONDS} seconds "
    "(90 days)."
)
EXPECTED_RANGE = (
    f"expected_seconds: must be a whole number between 1 and {MAX_TIMEOUT_SECONDS} seconds "
    "(90 days)."
)
# A held-off job's pages and metrics show when its window ends, as a date: a window beyond any
# date would fail them all. No job runs longer than its longest timeout, nor need its window.
MAX_CHURN_WINDOW_SECONDS = MAX_TIMEOUT_SECONDS
CHURN_WINDOW_RANGE = (
    f"churn_window_seconds: must be a whole number between 1 and {MAX_CHURN_WINDOW_SECONDS} "
    "seconds (90 days)."
)
MAX_ENV_VARS = 100
MAX_ENV_NAME_CHARS = 128
MAX_ENV_VALUE_CHARS = 4096
ENV_TYPE = (
    'env: must be a map of variable names to string values, {"NAME": "value"} (a form post '
    "cannot carry one: send the job as JSON)."
)
ENV_TOO_MANY = f"env: at most {MAX_ENV_VARS} variables."
ENV_NAME = (
    "env: {name!r} is not a valid variable name (letters, digits and underscores, not starting "
    f"with a digit, at most {MAX_ENV_NAME_CHARS} characters)."
)
ENV_VALUE_TOO_LONG = f"env: the value of {{name}} is longer than {MAX_ENV_VALUE_CHARS} characters."
ENV_VALUE_TYPE = "env: the value of {name} must be a string."
ENV_VALUE_CHARACTER = (
    "env: the value of {name} contains {character}, which no environment variable can hold."
)
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A lone surrogate: JSON can escape one ("\\ud800"), but no UTF-8 text, and so no environment
# (nor the API's own answer showing the job), can hold it.
LONE_SURROGATE_RE = re.compile("[\ud800-\udfff]")
NODE_GPUS_RANGE = f"gpus: a node has between 1 and {MAX_GPUS_PER_NODE} GPUs."
MAX_IMAGE_CHARS = 512
IMAGE_INVALID = (
    "image: must be a container image reference, such as registry.example.com/team/trainer:1.4 "
    f"or ubuntu@sha256:<64 hex digits>, of at most {MAX_IMAGE_CHARS} characters."
)
# A container image reference, as the distribution project's grammar writes it: an optional
# registry host (with a port), path components of lowercase letters and digits joined by
# '.', '_', '__' or dashes, then an optional tag and an optional digest.
_IMAGE_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_IMAGE_HOST = rf"(?:{_IMAGE_HOST_LABEL}(?:\.{_IMAGE_HOST_LABEL})*(?::[0-9]+)?/)"
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_RE = re.compile(
    rf"{_IMAGE_HOST}?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)


def validate_image(value: str) -> None:
    if value and (len(value) > MAX_IMAGE_CHARS or not IMAGE_RE.fullmatch(value)):
        raise ValidationError(IMAGE_INVALID, code="invalid")


MAX_WORKING_DIR_CHARS = 1024
WORKING_DIR_INVALID = (
    "working_dir: must be an absolute path (it begins with /) of at most "
    f"{MAX_WORKING_DIR_CHARS} characters, without control characters: the directory on the "
    "node (or in the container) the command starts in."
)
# A path of printable characters: a control character has no place in a directory a person
# names, and a NUL none in any path.
_WORKING_DIR_RE = re.compile(r"/[^\x00-\x1f\x7f]*")


def working_dir_is_valid(value: str) -> bool:
    return not value or (
        len(value) <= MAX_WORKING_DIR_CHARS and _WORKING_DIR_RE.fullmatch(value) is not None
    )


def validate_working_dir(value: str) -> None:
    if not working_dir_is_valid(value):
        raise ValidationError(WORKING_DIR_INVALID, code="invalid")


class Connector(models.Model):
    """A process that brings a cluster manager's nodes to the portal (`gpu-agent slurm`,
    `gpu-agent kubernetes`): it registers them all, polls for all their orders at once, and has
    the cluster manager run each attempt. Its nodes are portal nodes like an agent's; the engine
    plans on both alike."""

    class Kind(models.TextChoices):
        SLURM = "slurm", "Slurm"
        KUBERNETES = "kubernetes", "Kubernetes"

    name = models.CharField(max_length=253, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    # The connector's token, as sha256 hex, as a node agent's.
    token_hash = models.CharField(max_length=64, blank=True, editable=False)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        indexes = [
            # Connector requests authenticate by WHERE token_hash = sha256(token).
            models.Index(fields=["token_hash"], name="connector_token_hash"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} cluster {self.name}"


class Node(models.Model):
    """A GPU machine, run by its node agent or by a connector's cluster manager (`connector`).
    It has GPUs of one type."""

    class State(models.TextChoices):
        READY = "READY", "Ready"
        DRAINING = "DRAINING", "Draining (finishes its jobs, gets no new ones)"
        DOWN = "DOWN", "Down"

    name = models.CharField(max_length=253, unique=True)
    gpu_type = models.CharField(max_length=32, validators=[validate_gpu_type])
    gpus = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_GPUS_PER_NODE)]
    )
    state = models.CharField(max_length=10, choices=State.choices, default=State.READY)
    labels = models.JSONField(default=dict, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The node agent's token, as sha256 hex: the token itself is shown to the agent once.
    token_hash = models.CharField(max_length=64, blank=True, editable=False)
    gpu_details = models.JSONField(
        default=list, blank=True, help_text="What the agent discovered: index, uuid, model, memory."
    )
    connector = models.ForeignKey(
        Connector, null=True, blank=True, on_delete=models.PROTECT, related_name="nodes"
    )
    state_reason = models.CharField(
        max_length=300,
        blank=True,
        help_text="Why the node is in its state: as its cluster says, or who drained or "
        "undrained it and why (`node_set_state`).",
    )
    outside_gpus = models.PositiveIntegerField(
        default=0,
        help_text="GPUs held by work the portal did not submit (its cluster manager's own jobs).",
    )
    asks_to_start = models.BooleanField(
        default=False,
        help_text="Its agent (or connector) starts an attempt only once the portal granted it, "
        "so an attempt preempted before its start was granted ends at once.",
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(gpus__gte=1) & Q(gpus__lte=MAX_GPUS_PER_NODE), name="node_gpus_range"
            )
        ]
        indexes = [
            # Agent requests authenticate by WHERE token_hash = sha256(token).
            models.Index(fields=["token_hash"], name="node_token_hash"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.gpus} × {self.gpu_type})"

    def clean(self) -> None:
        if self.gpus is not None and not 1 <= self.gpus <= MAX_GPUS_PER_NODE:
            raise ValidationError({"gpus": NODE_GPUS_RANGE})


def validate_env(env) -> None:
    """A job's environment: at most MAX_ENV_VARS variables of valid names, each a string an
    environment can hold (no NUL, no lone surrogate: JSON escapes one, but no UTF-8 text holds
    it, and PostgreSQL refuses it) of at most MAX_ENV_VALUE_CHARS. Every way a job comes in (the
    REST API, the AWS API, the admin) is checked by it, with these messages."""
    if not isinstance(env, dict):
        raise ValidationError(ENV_TYPE)
    if len(env) > MAX_ENV_VARS:
        raise ValidationError(ENV_TOO_MANY)
    for name, value in env.items():
        if (
            not isinstance(name, str)
            or len(name) > MAX_ENV_NAME_CHARS
            or not ENV_NAME_RE.fullmatch(name)
        ):
            raise ValidationError(ENV_NAME.format(name=str(name)[:200]))
        if not isinstance(value, str):
            raise ValidationError(ENV_VALUE_TYPE.format(name=name))
        if "\x00" in value:
            raise ValidationError(
                ENV_VALUE_CHARACTER.format(name=name, character="a NUL character")
            )
        if LONE_SURROGATE_RE.search(value):
            raise ValidationError(
                ENV_VALUE_CHARACTER.format(name=name, character="a lone surrogate")
            )
        if len(value) > MAX_ENV_VALUE_CHARS:
            raise ValidationError(ENV_VALUE_TOO_LONG.format(name=name))


class Job(models.Model):
    """A request for `gpus` GPUs of one type on `nodes` nodes, to run `command`."""

    class State(models.TextChoices):
        SUBMITTED = "SUBMITTED"
        RUNNABLE = "RUNNABLE"
        SCHEDULED = "SCHEDULED"
        STARTING = "STARTING"
        RUNNING = "RUNNING"
        PREEMPTING = "PREEMPTING"
        SUCCEEDED = "SUCCEEDED"
        FAILED = "FAILED"
        CANCELLED = "CANCELLED"

    PLACED_STATES = (State.SCHEDULED, State.STARTING, State.RUNNING, State.PREEMPTING)
    FINAL_STATES = (State.SUCCEEDED, State.FAILED, State.CANCELLED)

    name = models.CharField(max_length=200, blank=True)
    # No index of its own: job_share_recent (share, -submitted_at) serves lookups by share, and
    # one index less is one write less per submit.
    share = models.ForeignKey(
        QuotaShare, on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs"
    )
    gpu_type = models.CharField(max_length=32, validators=[validate_gpu_type])
    gpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    nodes = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    priority = models.PositiveIntegerField(default=0, validators=[MaxValueValidator(MAX_PRIORITY)])
    command = models.TextField()
    env = models.JSONField(default=dict, blank=True, validators=[validate_env])
    image = models.CharField(
        max_length=MAX_IMAGE_CHARS,
        blank=True,
        validators=[validate_image],
        help_text="The container image the command runs in on Kubernetes nodes (blank: the "
        "connector's default); node agents and Slurm run the command on the node itself.",
    )
    working_dir = models.CharField(
        max_length=MAX_WORKING_DIR_CHARS,
        blank=True,
        validators=[validate_working_dir],
        help_text="The directory the command starts in, an absolute path on the node (in the "
        "container on Kubernetes nodes); blank: the job's checkpoint directory.",
    )
    client_token = models.CharField(max_length=64, blank=True)
    timeout_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_TIMEOUT_SECONDS)],
    )
    max_preemptions = models.PositiveIntegerField(null=True, blank=True)
    expected_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_TIMEOUT_SECONDS)],
        help_text="How long the submitter expects the job to run: what estimated starts count "
        "on (else its timeout, else its share's history).",
    )
    preemptible = models.BooleanField(
        default=True,
        help_text="False: runs only within its share's limit (it never borrows) and is never "
        "preempted, by a reclaim or in its share.",
    )
    retry_attempts = models.PositiveIntegerField(
        default=0, validators=[MaxValueValidator(MAX_RETRY_ATTEMPTS)]
    )

    state = models.CharField(max_length=12, choices=State.choices, default=State.SUBMITTED)
    reason = models.TextField(blank=True, help_text="Why the job waits, or why it ended.")
    preemption_count = models.PositiveIntegerField(default=0)
    failure_count = models.PositiveIntegerField(default=0)
    attempt_count = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(
        default=False, help_text="A cancel arrived while the job held GPUs: it is being stopped."
    )

    # When a RUNNABLE job is estimated to start (scheduler/cycle/estimates.py), on which GPUs
    # ([{node, gpu_indices}], as an attempt's allocations), and what the estimate counted on;
    # null: none (not waiting, or not within the horizon).
    estimated_start = models.DateTimeField(null=True, blank=True)
    estimated_allocations = models.JSONField(default=list, blank=True)
    estimate_basis = models.CharField(max_length=300, blank=True)

    submitted_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True, help_text="First start.")
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=1), name="job_gpus_at_least_one"),
            models.CheckConstraint(condition=Q(nodes__gte=1), name="job_nodes_at_least_one"),
            models.CheckConstraint(
                condition=Exact(Mod("gpus", "nodes"), 0), name="job_gpus_divisible_by_nodes"
            ),
            models.CheckConstraint(
                condition=Q(priority__lte=MAX_PRIORITY), name="job_priority_range"
            ),
            models.CheckConstraint(
                condition=Q(timeout_seconds__isnull=True)
                | (Q(timeout_seconds__gte=1) & Q(timeout_seconds__lte=MAX_TIMEOUT_SECONDS)),
                name="job_timeout_range",
            ),
            models.CheckConstraint(
                condition=Q(expected_seconds__isnull=True)
                | (Q(expected_seconds__gte=1) & Q(expected_seconds__lte=MAX_TIMEOUT_SECONDS)),
                name="job_expected_seconds_range",
            ),
            # Submitting the same client_token twice returns the first job (idempotent submit).
            models.UniqueConstraint(
                fields=["submitted_by", "client_token"],
                condition=~Q(client_token=""),
                name="job_client_token_once_per_user",
            ),
        ]
        indexes = [
            # The cycle loads runnable and placed jobs: WHERE state IN (...).
            models.Index(fields=["state", "gpu_type"], name="job_state_gpu_type"),
            # Job lists filtered by share, newest first.
            models.Index(fields=["share", "-submitted_at"], name="job_share_recent"),
        ]

    def __str__(self) -> str:
        return self.name or f"job {self.pk}"

    def get_absolute_url(self) -> str:
        """The job's page on the dashboards (the admin's "view on site" leads there)."""
        return reverse("dashboards:job", args=[self.pk])

    @staticmethod
    def no_estimate() -> dict:
        """The estimate fields of a job that has none: only a waiting (RUNNABLE) job has an
        estimated start, and a job that leaves the queue loses it (`scheduler.transitions`)."""
        return {
            "estimated_start": None,
            "estimated_allocations": [],
            "estimate_basis": "",
        }

    @property
    def estimated_nodes(self) -> list[str]:
        """The nodes it is estimated to start on, in its allocations' order."""
        return [allocation["node"] for allocation in self.estimated_allocations]

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.gpus and self.nodes and self.gpus % self.nodes:
            errors["gpus"] = GPUS_DIVISIBLE_BY_NODES.format(nodes=self.nodes)
        if self.priority is not None and not priority_in_range(self.priority):
            errors["priority"] = PRIORITY_RANGE
        if self.timeout_seconds is not None and not (
            1 <= self.timeout_seconds <= MAX_TIMEOUT_SECONDS
        ):
            errors["timeout_seconds"] = TIMEOUT_RANGE
        if errors:
            raise ValidationError(errors)

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES


class JobEvent(models.Model):
    """Every state change of a job, with the reason a person can read."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True)
    from_state = models.CharField(max_length=12, blank=True)
    to_state = models.CharField(max_length=12)
    reason = models.TextField()

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.job}: {self.from_state or '∅'} → {self.to_state} ({self.reason})"


def allocations_data(allocations: Iterable[Allocation]) -> list[dict]:
    """The engine's allocations as stored and shown: [{node, gpu_indices}] (an attempt's
    `allocations`, a waiting job's `estimated_allocations`)."""
    return [{"node": a.node, "gpu_indices": list(a.gpu_indices)} for a in allocations]


class JobAttempt(models.Model):
    """One placement of a job on GPUs, from scheduling to its end."""

    class Outcome(models.TextChoices):
        # The words of scheduler.engine.outcomes, which says what each one leads to.
        SUCCEEDED = outcomes.SUCCEEDED
        FAILED = outcomes.FAILED
        PREEMPTED = outcomes.PREEMPTED
        NODE_LOST = outcomes.NODE_LOST
        TIMEOUT = outcomes.TIMEOUT
        CANCELLED = outcomes.CANCELLED
        WITHDRAWN = outcomes.WITHDRAWN

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    nodes = models.ManyToManyField(Node, through="GpuAssignment", related_name="attempts")
    allocations = models.JSONField(
        default=list, help_text='[{"node": name, "gpu_indices": [..]}], as CUDA_VISIBLE_DEVICES.'
    )
    borrowed_gpus = models.PositiveIntegerField(
        default=0, help_text="GPUs above the share's limit when the attempt started."
    )
    scheduled_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    end_reason = models.TextField(blank=True)
    # When the job last saved a checkpoint during this attempt, as its agent saw it
    # (docs/agent.md): the work a preemption would lose runs from here.
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)
    preempted_for = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="reclaimed_attempts"
    )
    log_tail = models.TextField(blank=True)
    cluster_job = models.JSONField(
        default=dict,
        blank=True,
        help_text='What a connector\'s cluster manager runs the attempt as: {"id": its job id, '
        '"allocations": [{"node": name, "gpu_indices": [..]}] as the cluster manager gave them}.',
    )

    class Meta:
        ordering = ["job", "number"]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="attempt_number_once_per_job")
        ]
        indexes = [
            # The cycle loads the placed jobs' attempts: WHERE ended_at IS NULL.
            models.Index(fields=["job"], condition=Q(ended_at__isnull=True), name="attempt_open"),
        ]

    def __str__(self) -> str:
        return f"{self.job} attempt {self.number}"

    @property
    def used_borrowed_gpus(self) -> bool:
        return self.borrowed_gpus > 0


def seconds_lost(started_at, last_checkpoint_at, ended_at) -> float:
    """Seconds of work a preempted attempt threw away (times its GPUs: GPU-seconds): from the
    later of its start and its last checkpoint to its end, the grace period included (what it
    computed then is lost too, unless it saved a checkpoint). One that never started lost
    nothing. The engine orders victims by the same measure (`victims.work_lost`)."""
    if started_at is None:
        return 0.0
    since = max(started_at, last_checkpoint_at) if last_checkpoint_at else started_at
    return max(0.0, (ended_at - since).total_seconds())


class GpuAssignment(models.Model):
    """One GPU index of a node held by an attempt. The database itself refuses to give a GPU
    that is still held to a second attempt."""

    attempt = models.ForeignKey(JobAttempt, on_delete=models.CASCADE, related_name="gpus")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="gpu_assignments")
    gpu_index = models.PositiveIntegerField()
    released = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["node", "gpu_index"],
                condition=Q(released=False),
                name="gpu_held_by_one_attempt",
            )
        ]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.gpu_index}"


class ClusterSettings(models.Model):
    """Settings of the whole cluster, one row, edited in the admin."""

    agent_join_token = models.CharField(
        max_length=128,
        help_text="Node agents register with this token (agent flag --join-token or "
        "AGENT_JOIN_TOKEN); each then gets a token of its own. Changing it stops new "
        "registrations with the old one; registered nodes keep working.",
    )
    churn_preemptions = models.PositiveIntegerField(
        default=CHURN_PREEMPTIONS,
        help_text="The churn breaker: a job preempted this many times within the window below "
        "is not placed on borrowed GPUs until the window has passed (within its share's limit "
        "it still runs). 0 turns the breaker off.",
    )
    # The bounds live here, so every form or service that cleans the row enforces them.
    churn_window_seconds = models.PositiveIntegerField(
        default=int(CHURN_WINDOW_SECONDS),
        validators=[
            MinValueValidator(1, message=CHURN_WINDOW_RANGE),
            MaxValueValidator(MAX_CHURN_WINDOW_SECONDS, message=CHURN_WINDOW_RANGE),
        ],
        help_text=f"The churn breaker's window, in seconds (1 to {MAX_CHURN_WINDOW_SECONDS}, "
        "90 days).",
    )

    class Meta:
        verbose_name = "cluster settings"
        verbose_name_plural = "cluster settings"

    def __str__(self) -> str:
        return "Cluster settings"

    @classmethod
    def load(cls) -> ClusterSettings:
        """The one row, created on first use with AGENT_JOIN_TOKEN from the environment or a
        random token (`new_join_token`), drawn only then."""
        row, _ = cls.objects.get_or_create(
            pk=1,
            defaults={"agent_join_token": lambda: settings.AGENT_JOIN_TOKEN or new_join_token()},
        )
        return row


def new_join_token() -> str:
    """A random join token that never begins with "-": it is given on command lines
    (`gpu-agent --join-token T`), where one that did would read as an option."""
    while (token := secrets.token_urlsafe(24)).startswith("-"):
        pass
    return token

"""What the API reads and writes. Write serializers check types and sizes; the rules of
DESIGN §2 stay in the services, whose ValidationErrors come back as 400s (see errors.py)."""

from __future__ import annotations

import re
import shlex
from functools import cache

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.fields import SkipField
from rest_framework.relations import PKOnlyObject, RelatedField
from rest_framework.utils import html
from rest_framework.utils.serializer_helpers import BindingDict

from portal.choices import choice_errors
from scheduler.engine import order
from scheduler.limits import GPU_TYPE_PATTERN
from scheduler.models import (
    ENV_TYPE,
    EXPECTED_RANGE,
    IMAGE_INVALID,
    IMAGE_RE,
    MAX_IMAGE_CHARS,
    MAX_PRIORITY,
    MAX_RETRY_ATTEMPTS,
    MAX_TIMEOUT_SECONDS,
    MAX_WORKING_DIR_CHARS,
    PRIORITY_RANGE,
    TIMEOUT_RANGE,
    WORKING_DIR_INVALID,
    Job,
    JobAttempt,
    JobEvent,
    Node,
    validate_env,
    working_dir_is_valid,
)
from shares.models import (
    GPU_TYPE_FORMAT,
    MAX_GPU_TYPES_PER_SHARE,
    MAX_GRACE_SECONDS,
    MAX_MIN_RUNTIME_SECONDS,
    QuotaShare,
    ShareChange,
)

# Sizes a job request may have. Bigger bodies are refused before parsing (413).
MAX_COMMAND_CHARS = 65536
MAX_NAME_CHARS = 200
MAX_CLIENT_TOKEN_CHARS = 64
MAX_GPUS_ASKED = 1_000_000  # far above any cluster: the service then says it never fits
MAX_NODES_ASKED = 100_000
MAX_PREEMPTIONS = 1000
MAX_LIMIT_GPUS = 1_000_000
MAX_INT = 2_147_483_647  # PostgreSQL integer

COMMAND_TOO_LONG = f"command: at most {MAX_COMMAND_CHARS} characters; put long scripts in a file."
COMMAND_REQUIRED = "command: required; the shell command the job runs."
COMMAND_TYPE = "command: must be a shell command (a string) or its argv (a list of strings)."
COMMAND_ARGV_EMPTY = (
    "command: an argv list must not be empty; its first item is the program to run."
)
COMMAND_ARGV_ITEM_TYPE = "command: argv item {index} must be a string, not {kind}."
COMMAND_ARGV_NUL = (
    "command: argv item {index} contains a NUL character, which no argument can hold."
)
COMMAND_ARGV_PROGRAM = "command: argv item 0, the program to run, must not be blank."
COMMAND_ARGV_TOO_LONG = (
    f"command: the argv list joined into one shell command (shlex.join) is longer than "
    f"{MAX_COMMAND_CHARS} characters; put long scripts in a file."
)
GPUS_RANGE = f"gpus: must be a whole number between 1 and {MAX_GPUS_ASKED}."
NODES_RANGE = f"nodes: must be a whole number between 1 and {MAX_NODES_ASKED}."
MAX_PREEMPTIONS_RANGE = (
    f"max_preemptions: must be a whole number between 0 and {MAX_PREEMPTIONS}, or null."
)
RETRY_ATTEMPTS_RANGE = f"retry_attempts: must be a whole number between 0 and {MAX_RETRY_ATTEMPTS}."
NAME_TOO_LONG = f"name: at most {MAX_NAME_CHARS} characters."
CLIENT_TOKEN_TOO_LONG = f"client_token: at most {MAX_CLIENT_TOKEN_CHARS} characters."
ONLY_PRIORITY = "{fields}: only priority can be changed on a submitted job."
UNKNOWN_JOB_FIELD = "{field}: not a field of a job (misspelled?); a job has: {known}."
UNKNOWN_JOB_FILTER = (
    "{param}: not a parameter of the job list (misspelled?); it takes share, state, "
    "submitted_by, since, gpu_type, page and page_size."
)
LIMITS_RANGE = f"capacity_limits: each limit is between 1 and {MAX_LIMIT_GPUS} GPUs."
LEND_LIMIT_TYPE = "lend_limit: a number of GPUs for every type, or a map {gpu_type: GPUs}, or null."

GPU_TYPE_RE = re.compile(GPU_TYPE_PATTERN)


def _range(message: str) -> dict[str, str]:
    """An integer field's errors: whatever is not a whole number in its range breaks its rule."""
    return {"min_value": message, "max_value": message, "invalid": message,
            "max_string_length": message}  # fmt: skip


# The mixins' docs are comments, not docstrings: drf-spectacular describes a serializer that has
# no docstring of its own with the first docstring of its classes, a mixin's included.


# Build the serializer's fields once per class, not once per instance.
#
# DRF builds a serializer's fields for every instance (a deep copy of the declared fields; for
# a ModelSerializer, about 20 model fields mapped with their kwargs and validators), which was
# most of the time a submit spent turning its job into JSON, and checking its request. When
# the fields need nothing from the request they can be shared: they are bound to a prototype
# instance with an empty context, so they must not read `context` (no request-dependent
# SerializerMethodField, no hyperlinks), and a writing serializer must not be `partial`.
# Fields keep no state while they validate: errors and values live on the serializer.
class SharedFieldsMixin:
    @property
    def fields(self) -> BindingDict:
        cls = type(self)
        shared = cls.__dict__.get("_shared_fields")
        if shared is None:
            prototype = cls()
            shared = BindingDict(prototype)
            for name, field in prototype.get_fields().items():
                shared[name] = field
            cls._shared_fields = shared  # a race builds it twice: same fields, no harm
        return shared


# The DRF fields whose to_representation returns a value of exactly this type as it is.
_SHOWN_AS_IS: dict[type[serializers.Field], type] = {
    serializers.CharField: str,
    serializers.IntegerField: int,
    serializers.BooleanField: bool,
}


# DRF's to_representation of a model instance, minus the work that changes nothing: an
# attribute is read straight off the instance (for fields whose source is one attribute, not
# a pk-only related field), and a value that is None or already of exactly the type the
# field shows (a str for a CharField, an int for an IntegerField, a bool for a BooleanField)
# is shown as it is. Every other value, and every other field, goes DRF's way. Same output,
# with less work for every job a response shows (bench/api.py).
class PlainValuesMixin(SharedFieldsMixin):
    def to_representation(self, instance) -> dict:
        cls = type(self)
        plan = cls.__dict__.get("_representation_plan")
        if plan is None:
            plan = cls._representation_plan = tuple(
                (field.field_name, _direct_attribute(field), _SHOWN_AS_IS.get(type(field)), field)
                for field in self._readable_fields
            )
        shown = {}
        for name, attribute, plain, field in plan:
            value = getattr(instance, attribute, _UNREAD) if attribute else _UNREAD
            if value is _UNREAD or callable(value):  # missing, or a method DRF would call
                try:
                    value = field.get_attribute(instance)
                except SkipField:
                    continue
                if isinstance(value, PKOnlyObject) and value.pk is None:
                    value = None
            if value is None or type(value) is plain:
                shown[name] = value
            else:
                shown[name] = field.to_representation(value)
        return shown


_UNREAD = object()


def _direct_attribute(field: serializers.Field) -> str | None:
    """The attribute DRF's field.get_attribute would read with a plain getattr, if any."""
    if len(field.source_attrs) != 1:
        return None
    if isinstance(field, RelatedField) and field.use_pk_only_optimization():
        return None
    if type(field).get_attribute not in (
        serializers.Field.get_attribute,
        RelatedField.get_attribute,
    ):
        return None
    return field.source_attrs[0]


# --- Jobs -------------------------------------------------------------------------------------


class AllocationSerializer(serializers.Serializer):
    node = serializers.CharField()
    gpu_indices = serializers.ListField(child=serializers.IntegerField())


@extend_schema_field(AllocationSerializer(many=True))
class AllocationsField(serializers.JSONField):
    """[{node, gpu_indices}] as stored: shown as it is."""


class JobSerializer(PlainValuesMixin, serializers.ModelSerializer):
    """A job as lists show it (AWS ServiceJobSummary)."""

    share = serializers.SlugRelatedField(slug_field="name", read_only=True)
    submitted_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    estimated_start = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="When the waiting job is estimated to start, assuming nothing new is "
        "submitted (null: not waiting, or not within the estimate's horizon).",
    )
    estimated_nodes = serializers.ListField(
        child=serializers.CharField(), read_only=True, help_text="The nodes it would start on."
    )
    estimated_allocations = AllocationsField(
        read_only=True, help_text="The GPUs it would start on, per node."
    )
    estimate_basis = serializers.CharField(
        read_only=True, help_text="What the estimate counts on (docs/estimates.md)."
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "share",
            "submitted_by",
            "gpu_type",
            "gpus",
            "nodes",
            "priority",
            "state",
            "reason",
            "preemption_count",
            "attempt_count",
            "failure_count",
            "cancel_requested",
            "command",
            "env",
            "image",
            "working_dir",
            "client_token",
            "timeout_seconds",
            "expected_seconds",
            "max_preemptions",
            "retry_attempts",
            "preemptible",
            "estimated_start",
            "estimated_nodes",
            "estimated_allocations",
            "estimate_basis",
            "submitted_at",
            "started_at",
            "finished_at",
            "updated_at",
        ]
        read_only_fields = fields


def job_data(job: Job) -> dict:
    """JobSerializer(job).data, without a serializer per job: JobSerializer's fields are shared
    by the class and read no context (SharedFieldsMixin), so one instance shows every job,
    without making a serializer (and the ReturnDict copy of `.data`) for each."""
    return _job_serializer().to_representation(job)


@cache
def _job_serializer() -> JobSerializer:
    return JobSerializer()


class ClusterJobSerializer(serializers.Serializer):
    """What a connector's cluster manager runs an attempt as: {} (no key) for an attempt a
    node agent runs, and for one the cluster manager has not started."""

    # `allocations` is empty where the cluster manager could not say which GPUs it gave.
    id = serializers.CharField(
        required=False, help_text="The cluster manager's job id (Slurm's job id)."
    )
    allocations = AllocationSerializer(
        many=True,
        required=False,
        help_text="The GPU indices the cluster manager really gave, per node; the attempt's "
        "`allocations` are the portal's own (nominal) indices.",
    )


@extend_schema_field(ClusterJobSerializer)
class ClusterJobField(serializers.JSONField):
    """What a connector's cluster manager runs an attempt as; {} where a node agent runs it."""


class AttemptSerializer(PlainValuesMixin, serializers.ModelSerializer):
    # Shows an attempt from `job_detail`, with its GPUs in `gpu_list`.
    allocations = serializers.SerializerMethodField()
    # Declared, not derived from the model: a read-only model field loses its allow_blank and
    # allow_null, so the schema would refuse an attempt not ended yet (outcome "", no
    # preempted_for).
    outcome = serializers.ChoiceField(
        choices=JobAttempt.Outcome.choices,
        allow_blank=True,
        read_only=True,
        help_text="How the attempt ended; blank while it has not.",
    )
    preempted_for = serializers.PrimaryKeyRelatedField(read_only=True, allow_null=True)
    cluster_job = ClusterJobField(read_only=True)

    class Meta:
        model = JobAttempt
        fields = [
            "number",
            "allocations",
            "borrowed_gpus",
            "scheduled_at",
            "started_at",
            "stop_requested_at",
            "ended_at",
            "last_checkpoint_at",
            "outcome",
            "exit_code",
            "end_reason",
            "preempted_for",
            "cluster_job",
        ]
        read_only_fields = fields

    @extend_schema_field(AllocationSerializer(many=True))
    def get_allocations(self, attempt: JobAttempt) -> list[dict]:
        return attempt_allocations(attempt)


def attempt_allocations(attempt: JobAttempt) -> list[dict]:
    """[{node, gpu_indices}] from the GPUs the attempt holds or held (`gpu_list`, from
    `job_detail`); the attempt's own `allocations` field when it has no GPU rows."""
    by_node: dict[str, list[int]] = {}
    for node, gpu_index in attempt.gpu_list:
        by_node.setdefault(node, []).append(gpu_index)
    if not by_node:
        return list(attempt.allocations or [])
    return [{"node": node, "gpu_indices": sorted(indices)} for node, indices in by_node.items()]


class EventSerializer(PlainValuesMixin, serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "from_state", "to_state", "reason"]
        read_only_fields = fields


class PreemptionSummarySerializer(serializers.Serializer):
    count = serializers.IntegerField()
    max_preemptions = serializers.IntegerField(allow_null=True)
    recent = AttemptSerializer(many=True)


RECENT_PREEMPTIONS = 5


class JobDetailSerializer(JobSerializer):
    """A job as describe shows it (AWS DescribeServiceJob): attempts, preemptions, where it
    runs and the end of its log."""

    # Shows a job from `job_detail`, which loads its attempts and events.
    attempts = AttemptSerializer(many=True, read_only=True, source="attempt_list")
    events = EventSerializer(many=True, read_only=True, source="event_list")
    preemptions = serializers.SerializerMethodField()
    allocations = serializers.SerializerMethodField()
    cluster_job = serializers.SerializerMethodField()
    log_tail = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = [
            *JobSerializer.Meta.fields,
            "allocations",
            "cluster_job",
            "preemptions",
            "attempts",
            "events",
            "log_tail",
        ]
        read_only_fields = fields

    @extend_schema_field(PreemptionSummarySerializer)
    def get_preemptions(self, job: Job) -> dict:
        preempted = [
            attempt
            for attempt in job.attempt_list
            if attempt.outcome == JobAttempt.Outcome.PREEMPTED
        ]
        recent = preempted[-RECENT_PREEMPTIONS:][::-1]
        return {
            "count": job.preemption_count,
            "max_preemptions": job.max_preemptions,
            "recent": self.fields["attempts"].to_representation(recent),  # as `attempts` shows
        }

    @extend_schema_field(AllocationSerializer(many=True))
    def get_allocations(self, job: Job) -> list[dict]:
        """Where the latest attempt runs (or ran): nodes and GPU indices."""
        return attempt_allocations(job.attempt_list[-1]) if job.attempt_list else []

    @extend_schema_field(ClusterJobSerializer)
    def get_cluster_job(self, job: Job) -> dict:
        """What the cluster manager runs (or ran) the latest attempt as; {} if none does."""
        return dict(job.attempt_list[-1].cluster_job) if job.attempt_list else {}

    @extend_schema_field(serializers.CharField())
    def get_log_tail(self, job: Job) -> str:
        return job.attempt_list[-1].log_tail if job.attempt_list else ""


class EnvField(serializers.DictField):
    """{NAME: value}: the model's rule (`scheduler.models.validate_env`: bounded in count and
    size, values an environment can hold), and a form post's env refused."""

    def get_value(self, dictionary):
        # DRF reads a form's dict only from "env.NAME" keys and drops a plain "env=..." without
        # a word: hand that on, to be refused, rather than run the job without its env.
        if html.is_html_input(dictionary) and self.field_name in dictionary:
            return dictionary[self.field_name]
        return super().get_value(dictionary)

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError(ENV_TYPE)
        try:
            validate_env(data)  # the model's rule, for every way a job comes in
        except DjangoValidationError as error:
            raise serializers.ValidationError(error.messages[0]) from None
        return dict(data)


# What a JSON value that is not a string is called in COMMAND_ARGV_ITEM_TYPE.
_JSON_KINDS = {
    bool: "a boolean",
    int: "a number",
    float: "a number",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "maxLength": MAX_COMMAND_CHARS},
            {"type": "array", "items": {"type": "string"}, "minItems": 1},
        ]
    }
)
class CommandField(serializers.CharField):
    """A shell command, as it is, or an argv list, kept as `shlex.join(argv)`: a command the
    agent runs as exactly those arguments (as is when no item needs quoting, else under
    /bin/sh, which takes the quotes off)."""

    def to_internal_value(self, data):
        if isinstance(data, str):
            return super().to_internal_value(data)
        if not isinstance(data, list):
            # CharField would run a number as the command "5".
            raise serializers.ValidationError(COMMAND_TYPE)
        if not data:
            raise serializers.ValidationError(COMMAND_ARGV_EMPTY)
        for index, item in enumerate(data):
            if not isinstance(item, str):
                kind = _JSON_KINDS.get(type(item), type(item).__name__)
                raise serializers.ValidationError(
                    COMMAND_ARGV_ITEM_TYPE.format(index=index, kind=kind)
                )
            if "\x00" in item:
                raise serializers.ValidationError(COMMAND_ARGV_NUL.format(index=index))
        # An empty argument is one ('' in the command); an empty program is not.
        if not data[0].strip():
            raise serializers.ValidationError(COMMAND_ARGV_PROGRAM)
        command = shlex.join(data)
        if len(command) > MAX_COMMAND_CHARS:
            raise serializers.ValidationError(COMMAND_ARGV_TOO_LONG)
        return command


@extend_schema_field({"type": "string", "pattern": r"^[a-z0-9][a-z0-9-]{0,31}$"})
class GpuTypeField(serializers.CharField):
    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if not GPU_TYPE_RE.fullmatch(value):
            raise serializers.ValidationError(GPU_TYPE_FORMAT.format(value=value[:100]))
        return value


@extend_schema_field(
    {
        "type": "string",
        "maxLength": MAX_IMAGE_CHARS,
        "example": "registry.example.com/team/trainer:1.4",
    }
)
class ImageField(serializers.CharField):
    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if value and not IMAGE_RE.fullmatch(value):
            raise serializers.ValidationError(IMAGE_INVALID)
        return value


@extend_schema_field(
    {
        "type": "string",
        "maxLength": MAX_WORKING_DIR_CHARS,
        "pattern": "^(/.*)?$",
        "example": "/home/alice/project",
    }
)
class WorkingDirField(serializers.CharField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            raise serializers.ValidationError(WORKING_DIR_INVALID)
        value = super().to_internal_value(data)
        if not working_dir_is_valid(value):
            raise serializers.ValidationError(WORKING_DIR_INVALID)
        return value


class JobSubmitSerializer(SharedFieldsMixin, serializers.Serializer):
    """AWS SubmitServiceJob: what a job asks for."""

    share = serializers.CharField(max_length=63, help_text="The quota share's name.")
    gpu_type = GpuTypeField(max_length=32)
    gpus = serializers.IntegerField(
        min_value=1, max_value=MAX_GPUS_ASKED, error_messages=_range(GPUS_RANGE)
    )
    nodes = serializers.IntegerField(
        default=1, min_value=1, max_value=MAX_NODES_ASKED, error_messages=_range(NODES_RANGE)
    )
    priority = serializers.IntegerField(
        default=0, min_value=0, max_value=MAX_PRIORITY, error_messages=_range(PRIORITY_RANGE)
    )
    command = CommandField(
        max_length=MAX_COMMAND_CHARS,
        trim_whitespace=False,
        allow_blank=True,
        error_messages={
            "max_length": COMMAND_TOO_LONG,
            "required": COMMAND_REQUIRED,
            "invalid": COMMAND_TYPE,
            "null": COMMAND_TYPE,
        },
        help_text="The shell command the job runs, or its argv as a list of strings, which is "
        "kept as the command shlex.join(argv).",
    )
    name = serializers.CharField(
        default="",
        allow_blank=True,
        max_length=MAX_NAME_CHARS,
        error_messages={"max_length": NAME_TOO_LONG},
    )
    env = EnvField(default=dict, child=serializers.CharField(allow_blank=True))
    image = ImageField(
        default="",
        allow_blank=True,
        max_length=MAX_IMAGE_CHARS,
        error_messages={"max_length": IMAGE_INVALID, "invalid": IMAGE_INVALID},
        help_text="The container image the command runs in on Kubernetes nodes (blank: the "
        "connector's default); node agents and Slurm run it on the node itself.",
    )
    working_dir = WorkingDirField(
        default="",
        allow_blank=True,
        help_text="The directory the command starts in: an absolute path on the node (in the "
        "container on Kubernetes nodes). Blank: the job's checkpoint directory "
        "(CHECKPOINT_DIR). On a node without it, the attempt fails without starting.",
    )
    client_token = serializers.CharField(
        default="",
        allow_blank=True,
        max_length=MAX_CLIENT_TOKEN_CHARS,
        error_messages={"max_length": CLIENT_TOKEN_TOO_LONG},
        help_text="Idempotency token: the same token returns the first job (200).",
    )
    timeout_seconds = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=1,
        max_value=MAX_TIMEOUT_SECONDS,
        error_messages=_range(TIMEOUT_RANGE),
    )
    expected_seconds = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=1,
        max_value=MAX_TIMEOUT_SECONDS,
        error_messages=_range(EXPECTED_RANGE),
        help_text="How long you expect the job to run: estimated starts count on it (else on "
        "its timeout, else on its share's history).",
    )
    max_preemptions = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=0,
        max_value=MAX_PREEMPTIONS,
        error_messages=_range(MAX_PREEMPTIONS_RANGE),
    )
    retry_attempts = serializers.IntegerField(
        default=0,
        min_value=0,
        max_value=MAX_RETRY_ATTEMPTS,
        error_messages=_range(RETRY_ATTEMPTS_RANGE),
    )
    preemptible = serializers.BooleanField(
        default=True,
        help_text="false: the job runs only within its share's limit (it never borrows) and is "
        "never preempted, by a reclaim or in its share (docs/semantics.md).",
    )

    def to_internal_value(self, data):
        # A field the API does not know is refused, not ignored: a misspelled "preemptible"
        # would otherwise leave the job preemptible without a word.
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields) - _FORM_ONLY_FIELDS)
            if unknown:
                known = ", ".join(self.fields)
                raise serializers.ValidationError(
                    {name: [UNKNOWN_JOB_FIELD.format(field=name[:100], known=known)]
                     for name in unknown[:10]}
                )  # fmt: skip
        return super().to_internal_value(data)


# What a form post carries beside the job's fields.
_FORM_ONLY_FIELDS = frozenset({"csrfmiddlewaretoken"})


class JobWhatIfSerializer(JobSubmitSerializer):
    """What a what-if asks about: the body of a submit, the command optional (it changes no
    estimate)."""

    def get_fields(self) -> dict:
        fields = super().get_fields()
        fields["command"].required = False
        return fields


class JobEstimateSerializer(serializers.Serializer):
    """What-if: when a job would start if it were submitted now (nothing is stored)."""

    estimated_start = serializers.DateTimeField(
        allow_null=True, help_text="null: not within the estimate's horizon."
    )
    estimated_nodes = serializers.ListField(child=serializers.CharField())
    estimated_allocations = AllocationsField()
    estimate_basis = serializers.CharField()
    reason = serializers.CharField(
        allow_null=True, help_text="Why it would wait at the next cycle; null: it would start."
    )


class JobUpdateSerializer(serializers.Serializer):
    """AWS UpdateServiceJob: only the priority of a job can change."""

    priority = serializers.IntegerField(
        min_value=0, max_value=MAX_PRIORITY, error_messages=_range(PRIORITY_RANGE)
    )

    def to_internal_value(self, data):
        if isinstance(data, dict):
            others = sorted(set(data) - {"priority"})
            if others:
                raise serializers.ValidationError(
                    {others[0]: [ONLY_PRIORITY.format(fields=", ".join(others))]}
                )
        return super().to_internal_value(data)


class JobListFilterSerializer(serializers.Serializer):
    share = serializers.CharField(required=False, max_length=63)
    state = serializers.MultipleChoiceField(
        choices=Job.State.choices, required=False, error_messages=choice_errors("state", Job.State)
    )
    submitted_by = serializers.CharField(required=False, max_length=150)
    since = serializers.DateTimeField(required=False)
    gpu_type = serializers.CharField(required=False, max_length=32)

    def to_internal_value(self, data):
        # A parameter the list does not take is refused, not ignored: a misspelled filter
        # (?sate=RUNNABLE) would list every job, and ?limit= or ?offset= would read as honoured.
        unknown = sorted(set(data) - set(self.fields) - _LIST_ONLY_PARAMS)
        if unknown:
            raise serializers.ValidationError(
                {name: [UNKNOWN_JOB_FILTER.format(param=name[:100])] for name in unknown[:10]}
            )
        return super().to_internal_value(data)


# What a job list's query string carries beside its filters: the pagination's parameters and
# DRF's ?format=.
_LIST_ONLY_PARAMS = frozenset({"page", "page_size", "format"})


# --- Shares -----------------------------------------------------------------------------------


class TypeUsageSerializer(serializers.Serializer):
    limit = serializers.IntegerField()
    lend_limit = serializers.IntegerField(allow_null=True)
    used = serializers.IntegerField()
    own = serializers.IntegerField()
    borrowed = serializers.IntegerField()
    lent = serializers.IntegerField()
    lendable = serializers.IntegerField()


class PoolUsageSerializer(serializers.Serializer):
    capacity = serializers.IntegerField()
    covered_by_limits = serializers.IntegerField()
    free_pool = serializers.IntegerField()
    borrowed_from_pool = serializers.IntegerField()
    used = serializers.IntegerField()


class ShareSerializer(serializers.ModelSerializer):
    """A quota share with its live usage per GPU type (needs `usage` in the context)."""

    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    capacity_limits = serializers.SerializerMethodField()
    lend_limit = serializers.SerializerMethodField()
    usage = serializers.SerializerMethodField()

    class Meta:
        model = QuotaShare
        fields = [
            "name",
            "team",
            "strategy",
            "capacity_limits",
            "lend_limit",
            "borrow_limit",
            "in_share_preemption",
            "grace_seconds",
            "min_runtime_seconds",
            "state",
            "weight",
            "strict_fifo",
            "created_at",
            "updated_at",
            "usage",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField()))
    def get_capacity_limits(self, share: QuotaShare) -> dict[str, int]:
        return share.limits

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField()))
    def get_lend_limit(self, share: QuotaShare) -> dict[str, int]:
        return share.lend_limits

    @extend_schema_field(serializers.DictField(child=TypeUsageSerializer()))
    def get_usage(self, share: QuotaShare) -> dict[str, dict]:
        report = self.context["usage"]
        return {t: row.as_dict() for t, row in report.shares.get(share.name, {}).items()}


class LendLimitField(serializers.Field):
    """A number of GPUs for every type, a map {gpu_type: GPUs}, or null (lend all idle GPUs)."""

    def to_internal_value(self, data):
        if isinstance(data, bool):
            raise serializers.ValidationError(LEND_LIMIT_TYPE)
        if isinstance(data, int):
            if not 0 <= data <= MAX_LIMIT_GPUS:
                raise serializers.ValidationError("lend_limit: must be 0 or more GPUs.")
            return data
        if isinstance(data, dict):
            for gpu_type, value in data.items():
                if not GPU_TYPE_RE.fullmatch(str(gpu_type)):
                    raise serializers.ValidationError(
                        GPU_TYPE_FORMAT.format(value=str(gpu_type)[:100])
                    )
                if isinstance(value, bool) or not isinstance(value, int):
                    raise serializers.ValidationError(LEND_LIMIT_TYPE)
                if not 0 <= value <= MAX_LIMIT_GPUS:
                    raise serializers.ValidationError("lend_limit: must be 0 or more GPUs.")
            return dict(data)
        raise serializers.ValidationError(LEND_LIMIT_TYPE)

    def to_representation(self, value):
        return value


# What the keys of a map by GPU type are. Said in words: OpenAPI 3.0, which the schema is,
# has no propertyNames, and a schema using it fails validation.
_GPU_TYPE_KEYS = (
    f"GPUs by GPU type; a GPU type matches ^{GPU_TYPE_RE.pattern}$ (lowercase letters, digits "
    "and '-')."
)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "integer", "minimum": 0, "maximum": MAX_LIMIT_GPUS},
            {
                "type": "object",
                "description": _GPU_TYPE_KEYS,
                "additionalProperties": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_LIMIT_GPUS,
                },
            },
        ],
        "nullable": True,
    }
)
class DocumentedLendLimitField(LendLimitField):
    pass


@extend_schema_field(
    {
        "type": "object",
        "minProperties": 1,
        "maxProperties": MAX_GPU_TYPES_PER_SHARE,
        "description": _GPU_TYPE_KEYS,
        "additionalProperties": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT_GPUS},
        "example": {"h100": 8},
    }
)
class CapacityLimitsField(serializers.DictField):
    def to_internal_value(self, data):
        if not isinstance(data, dict):
            self.fail("not_a_dict", input_type=type(data).__name__)
        if not 1 <= len(data) <= MAX_GPU_TYPES_PER_SHARE:
            raise serializers.ValidationError(
                f"capacity_limits: a share needs between 1 and {MAX_GPU_TYPES_PER_SHARE} GPU types."
            )
        for gpu_type, value in data.items():
            if not GPU_TYPE_RE.fullmatch(str(gpu_type)):
                raise serializers.ValidationError(GPU_TYPE_FORMAT.format(value=str(gpu_type)[:100]))
            if isinstance(value, bool) or not isinstance(value, int):
                raise serializers.ValidationError(LIMITS_RANGE)
            if not 1 <= value <= MAX_LIMIT_GPUS:
                raise serializers.ValidationError(LIMITS_RANGE)
        return dict(data)


class ShareWriteSerializer(serializers.Serializer):
    """What an admin sets on a share (create: name, team and capacity_limits are required)."""

    name = serializers.SlugField(max_length=63)
    team = serializers.SlugField(max_length=50, help_text="The team's slug.")
    capacity_limits = CapacityLimitsField(child=serializers.IntegerField(min_value=1))
    lend_limit = DocumentedLendLimitField(required=False, allow_null=True)
    strategy = serializers.ChoiceField(
        choices=QuotaShare.Strategy.choices, required=False,
        error_messages=choice_errors("strategy", QuotaShare.Strategy),
    )  # fmt: skip
    borrow_limit = serializers.IntegerField(required=False, min_value=-1, max_value=MAX_INT)
    in_share_preemption = serializers.BooleanField(required=False)
    grace_seconds = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_GRACE_SECONDS
    )
    min_runtime_seconds = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_MIN_RUNTIME_SECONDS,
        help_text="A job of the share is no victim of a preemption before it has run this long.",
    )
    state = serializers.ChoiceField(
        choices=QuotaShare.State.choices, required=False,
        error_messages=choice_errors("state", QuotaShare.State),
    )  # fmt: skip
    weight = serializers.FloatField(required=False, min_value=0.000001, max_value=1e6)
    strict_fifo = serializers.BooleanField(required=False)


class ShareUpdateSerializer(ShareWriteSerializer):
    """PATCH: every field optional; `name` cannot change."""

    name = None
    team = serializers.SlugField(max_length=50, required=False)
    capacity_limits = CapacityLimitsField(
        child=serializers.IntegerField(min_value=1), required=False
    )


class ShareChangeSerializer(serializers.ModelSerializer):
    changed_by = serializers.SlugRelatedField(
        slug_field="username",
        read_only=True,
        allow_null=True,
        help_text="Who made the change; null for a change made by a command or the system.",
    )

    class Meta:
        model = ShareChange
        fields = ["changed_at", "changed_by", "source", "field", "old_value", "new_value"]
        read_only_fields = fields


class UsagePointSerializer(serializers.Serializer):
    t = serializers.DateTimeField()
    own = serializers.IntegerField()
    borrowed = serializers.IntegerField()
    lent = serializers.IntegerField()
    limit = serializers.IntegerField()


class ShareUsageSeriesSerializer(serializers.Serializer):
    share = serializers.CharField()
    series = serializers.DictField(child=UsagePointSerializer(many=True))


# --- Queue and nodes --------------------------------------------------------------------------


class QueueEntrySerializer(serializers.Serializer):
    position = serializers.IntegerField(help_text="Place in the whole queue, 1 = next.")
    considered_as = serializers.ChoiceField(choices=order.PASSES, source="pass_")
    job = JobSerializer()


class AheadEntrySerializer(serializers.Serializer):
    position = serializers.IntegerField(help_text="Place among the waiting jobs of the GPU type.")
    considered_as = serializers.ChoiceField(choices=order.PASSES)
    job = serializers.IntegerField(allow_null=True, help_text="null for another team's job.")
    share = serializers.CharField()
    gpus = serializers.IntegerField()
    priority = serializers.IntegerField()


class HolderSerializer(serializers.Serializer):
    job = serializers.IntegerField(allow_null=True, help_text="null for another team's job.")
    share = serializers.CharField()
    gpus = serializers.IntegerField()
    stopping = serializers.BooleanField(help_text="true: a victim stopping for this job.")


class AheadSerializer(serializers.Serializer):
    """Where a waiting job stands in its GPU type's queue, and whose jobs hold what it waits
    for: the victims stopping for it, and the other shares' jobs above their limits."""

    position = serializers.IntegerField(
        allow_null=True, help_text="1 = next among its GPU type; null: the job is not waiting."
    )
    count = serializers.IntegerField(help_text="Jobs ahead of it.")
    gpus = serializers.IntegerField(help_text="GPUs those jobs ask for.")
    ahead = AheadEntrySerializer(many=True, help_text="The first 100 of them, in order.")
    holders = HolderSerializer(many=True)


class QueueSnapshotSerializer(serializers.Serializer):
    """AWS GetJobQueueSnapshot: the front of the queue and each share's usage."""

    at = serializers.DateTimeField()
    runnable = serializers.IntegerField(help_text="Runnable jobs in the whole queue.")
    front = QueueEntrySerializer(many=True)
    shares = serializers.DictField(child=serializers.DictField(child=TypeUsageSerializer()))
    pool = serializers.DictField(child=PoolUsageSerializer())


class NodeJobSerializer(serializers.Serializer):
    id = serializers.IntegerField(allow_null=True, help_text="null for another team's job.")
    share = serializers.CharField(allow_null=True)
    state = serializers.CharField()
    gpu_indices = serializers.ListField(child=serializers.IntegerField())


class NodeSerializer(serializers.ModelSerializer):
    """A node with its GPUs and the jobs holding them (another team's job shows no id)."""

    # Shows a node of `node_list`, with its connector loaded.
    connector = serializers.SlugRelatedField(
        slug_field="name",
        read_only=True,
        allow_null=True,
        help_text="The connector that brings the node from its cluster manager (`gpu-agent "
        "slurm`); null for a node its own agent runs.",
    )
    gpus_in_use = serializers.SerializerMethodField()
    jobs = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = [
            "name",
            "gpu_type",
            "gpus",
            "state",
            "state_reason",
            "labels",
            "last_heartbeat",
            "connector",
            "outside_gpus",
            "gpus_in_use",
            "jobs",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.IntegerField(help_text="GPUs the portal's jobs hold."))
    def get_gpus_in_use(self, node: Node) -> int:
        return len(getattr(node, "held", []))

    @extend_schema_field(NodeJobSerializer(many=True))
    def get_jobs(self, node: Node) -> list[dict]:
        visible = self.context["visible_share_ids"]
        jobs: dict[int, dict] = {}
        for gpu in getattr(node, "held", []):
            job = gpu.attempt.job
            entry = jobs.setdefault(
                job.pk,
                {
                    "id": job.pk if visible is None or job.share_id in visible else None,
                    "share": job.share.name if visible is None or job.share_id in visible else None,
                    "state": job.state,
                    "gpu_indices": [],
                },
            )
            entry["gpu_indices"].append(gpu.gpu_index)
        return [dict(entry, gpu_indices=sorted(entry["gpu_indices"])) for entry in jobs.values()]

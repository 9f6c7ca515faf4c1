from __future__ import annotations

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import Count
from django.http import HttpRequest

from scheduler.jobs.services import job_cancel
from scheduler.models import (
    MAX_TIMEOUT_SECONDS,
    ClusterSettings,
    Connector,
    Job,
    JobAttempt,
    JobEvent,
    Node,
)
from scheduler.nodes.services import node_set_state

# A held-off job's pages and metrics show when its window ends, as a date: a window beyond any
# date would fail them all. No job runs longer than its longest timeout, nor need its window.
MAX_CHURN_WINDOW_SECONDS = MAX_TIMEOUT_SECONDS
CHURN_WINDOW_RANGE = (
    f"churn_window_seconds: must be a whole number between 1 and {MAX_CHURN_WINDOW_SECONDS} "
    "seconds (90 days)."
)


@admin.register(Connector)
class ConnectorAdmin(admin.ModelAdmin):
    """Connectors register themselves (`gpu-agent slurm`, by name): here an admin sees them,
    how many nodes each brings and when it was last heard from. Read-only, and without the
    token hash, which is no one's to read."""

    list_display = ["name", "kind", "last_heartbeat", "node_count", "created_at"]
    list_filter = ["kind"]
    search_fields = ["name"]
    fields = ["name", "kind", "last_heartbeat", "created_at"]

    def get_queryset(self, request: HttpRequest):
        return super().get_queryset(request).annotate(node_count=Count("nodes"))

    @admin.display(description="nodes", ordering="node_count")
    def node_count(self, connector: Connector) -> int:
        return connector.node_count

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "gpu_type",
        "gpus",
        "state",
        "state_reason",
        "outside_gpus",
        "connector",
        "last_heartbeat",
    ]
    # asks_to_start: False on a node whose agent is of an earlier release (docs/deploy.md).
    list_filter = ["state", "gpu_type", "connector", "asks_to_start"]
    list_select_related = ["connector"]
    search_fields = ["name"]
    actions = ["drain", "undrain"]
    # A connector's cluster manager says which node is its and how many GPUs its own jobs hold;
    # an agent says whether it asks before it starts (set by hand, a node could be double-booked).
    # The state changes only through drain and undrain (`node_set_state`): a node set DOWN by
    # hand is skipped by the heartbeat check, so a silent agent's jobs would never end.
    readonly_fields = [
        "state", "gpu_details", "last_heartbeat", "connector", "outside_gpus", "asks_to_start",
    ]  # fmt: skip
    # What the agent registered (`node_register`): its attempts name the node and hold GPU
    # indices of its type, so a rename, a new type or fewer GPUs would double-book GPUs.
    registered_fields = ["name", "gpu_type", "gpus"]

    def get_readonly_fields(self, request: HttpRequest, obj=None):
        if obj is None:
            return self.readonly_fields
        return [*self.registered_fields, *self.readonly_fields]

    @admin.action(description="Drain: finish running jobs, take no new ones")
    def drain(self, request: HttpRequest, queryset) -> None:
        for node in queryset:
            node_set_state(node=node, state=Node.State.DRAINING)
        self.message_user(request, f"{queryset.count()} node(s) draining.")

    @admin.action(description="Undrain: take new jobs again")
    def undrain(self, request: HttpRequest, queryset) -> None:
        for node in queryset.filter(state=Node.State.DRAINING):
            node_set_state(node=node, state=Node.State.READY)
        self.message_user(request, "Drained nodes are READY again.")


class JobAttemptInline(admin.TabularInline):
    model = JobAttempt
    fk_name = "job"
    extra = 0
    can_delete = False
    fields = [
        "number",
        "allocations",
        "borrowed_gpus",
        "scheduled_at",
        "started_at",
        "last_checkpoint_at",
        "ended_at",
        "outcome",
        "exit_code",
        "end_reason",
        "cluster_job",
    ]
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    fields = ["at", "from_state", "to_state", "reason"]
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    """Jobs are read-only here: they are submitted over the API and moved by the scheduler."""

    list_display = [
        "id",
        "name",
        "share",
        "gpu_type",
        "gpus",
        "priority",
        "preemptible",
        "state",
        "reason",
        "submitted_at",
    ]
    list_filter = ["state", "share", "gpu_type", "preemptible"]
    search_fields = ["name", "id"]
    list_select_related = ["share"]
    actions = ["cancel"]
    inlines = [JobAttemptInline, JobEventInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    @admin.action(description="Cancel selected jobs (running ones stop with their grace)")
    def cancel(self, request: HttpRequest, queryset) -> None:
        for job in queryset:
            job_cancel(job=job, user=request.user)
        self.message_user(request, f"{queryset.count()} job(s) cancelled or stopping.")


class ClusterSettingsForm(forms.ModelForm):
    class Meta:
        model = ClusterSettings
        fields = ["agent_join_token", "churn_preemptions", "churn_window_seconds"]

    def clean_churn_window_seconds(self) -> int:
        window = self.cleaned_data["churn_window_seconds"]
        if not 1 <= window <= MAX_CHURN_WINDOW_SECONDS:
            raise ValidationError(CHURN_WINDOW_RANGE)
        return window


@admin.register(ClusterSettings)
class ClusterSettingsAdmin(admin.ModelAdmin):
    """One row: the join token node agents register with (shown here to the admin)."""

    form = ClusterSettingsForm
    list_display = ["__str__", "agent_join_token", "churn_preemptions", "churn_window_seconds"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not ClusterSettings.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context=None):
        ClusterSettings.load()
        return super().changelist_view(request, extra_context)

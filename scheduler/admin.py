from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.core.exceptions import ValidationError
from django.db.models import Count
from django.http import HttpRequest

from scheduler.jobs.services import job_cancel
from scheduler.models import (
    ClusterSettings,
    Connector,
    Job,
    JobAttempt,
    JobEvent,
    Node,
)
from scheduler.nodes.services import MAX_NODE_REASON, node_set_state


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


class NodeActionForm(ActionForm):
    """The node list's action bar, with the reason a drain or undrain records."""

    # Its length is the service's rule (`node_set_state`), which names it when it is broken;
    # a form rule would only say "No action selected."
    reason = forms.CharField(
        required=False,
        widget=forms.TextInput(attrs={"maxlength": MAX_NODE_REASON, "size": 40}),
        help_text="Why (recorded as the node's state reason with your name).",
    )


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
    action_form = NodeActionForm
    # A connector's cluster manager says which node is its and how many GPUs its own jobs hold;
    # an agent says whether it asks before it starts (set by hand, a node could be double-booked).
    # The state changes only through drain and undrain (`node_set_state`, which records who and
    # why as its state_reason): a node set DOWN by hand is skipped by the heartbeat check, so a
    # silent agent's jobs would never end.
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
        if self._set_state(request, queryset, Node.State.DRAINING):
            self.message_user(request, f"{queryset.count()} node(s) draining.")

    @admin.action(description="Undrain: take new jobs again")
    def undrain(self, request: HttpRequest, queryset) -> None:
        drained = queryset.filter(state=Node.State.DRAINING)
        if self._set_state(request, drained, Node.State.READY):
            self.message_user(request, "Drained nodes are READY again.")

    def _set_state(self, request: HttpRequest, nodes, state: str) -> bool:
        """Set the nodes' state with the action bar's reason and the admin's name; False, and
        the rule it breaks shown, for a reason the service refuses (no node is changed)."""
        reason = request.POST.get("reason", "")
        try:
            for node in nodes:
                node_set_state(node=node, state=state, user=request.user, reason=reason)
        except ValidationError as refused:
            self.message_user(request, " ".join(refused.messages), level=messages.ERROR)
            return False
        return True


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


@admin.register(ClusterSettings)
class ClusterSettingsAdmin(admin.ModelAdmin):
    """One row: the join token node agents register with (shown here to the admin), and the
    churn breaker's settings, whose bounds are the model's validators."""

    fields = ["agent_join_token", "churn_preemptions", "churn_window_seconds"]
    list_display = ["__str__", "agent_join_token", "churn_preemptions", "churn_window_seconds"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not ClusterSettings.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context=None):
        ClusterSettings.load()
        return super().changelist_view(request, extra_context)

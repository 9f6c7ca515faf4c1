"""Reads that the API and pages need about nodes."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from scheduler.models import GpuAssignment, Node


def node_list() -> QuerySet[Node]:
    """Nodes with their connector and the GPUs their placed jobs hold."""
    held = GpuAssignment.objects.filter(released=False).select_related("attempt__job__share")
    return Node.objects.select_related("connector").prefetch_related(
        Prefetch("gpu_assignments", queryset=held, to_attr="held")
    )

"""/metrics in the Prometheus text format, named after Kueue's metrics where ours map onto them
(a share is Kueue's ClusterQueue, a GPU type its resource)."""

from __future__ import annotations

import ipaddress
from collections import Counter

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from dashboards.models import (
    CYCLE_DURATION_BUCKETS,
    CycleStats,
    cycle_bucket_field,
    cycle_bucket_label,
)
from dashboards.selectors import node_gpus, preemption_kind
from scheduler.jobs.selectors import held_off
from scheduler.models import Job, JobAttempt, Node
from shares.models import CapacityLimit, QuotaShare
from shares.selectors import current_usage


def metrics_allowed(request: HttpRequest) -> bool:
    """A request may read /metrics with `Authorization: Bearer <METRICS_TOKEN>` (when the
    setting is not empty), or from an address inside METRICS_ALLOWED_NETS. The address is
    REMOTE_ADDR: behind a proxy, list the proxy's address or use the token."""
    import hmac

    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and hmac.compare_digest(header.encode(), f"Bearer {token}".encode()):
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(
        address in ipaddress.ip_network(net, strict=False) for net in settings.METRICS_ALLOWED_NETS
    )


class PortalCollector(Collector):
    """Reads the database at every scrape: a few aggregate queries."""

    def collect(self):
        yield from self._quota()
        yield from self._workloads()
        yield from self._held_off()
        yield from self._preemptions()
        yield from self._nodes()
        yield from self._cycle()

    def _quota(self):
        labels = ["cluster_queue", "resource"]
        limits = {
            (share, gpu_type): (max_gpus, lend_limit, strategy, borrow_limit)
            for share, gpu_type, max_gpus, lend_limit, strategy, borrow_limit in (
                CapacityLimit.objects.values_list(
                    "share__name", "gpu_type", "max_gpus", "lend_limit", "share__strategy",
                    "share__borrow_limit",
                )
            )
        }  # fmt: skip
        families = {
            name: GaugeMetricFamily(f"portal_cluster_queue_{name}", doc, labels=labels)
            for name, doc in (
                ("nominal_quota", "GPUs of the type the share is guaranteed (its limit)."),
                ("borrowing_limit", "Extra GPUs the share may borrow above its limit "
                 "(absent: no cap beyond the cluster)."),
                ("lending_limit", "Of the share's idle GPUs, how many may be lent at most."),
                ("resource_usage", "GPUs held by the share's placed jobs."),
                ("borrowed", "GPUs the share uses above its limit."),
                ("lent", "The share's idle GPUs that borrowers use (accounted as in usage)."),
                ("idle", "The share's GPUs neither used nor lent."),
                ("pending_demand", "GPUs the share's runnable jobs ask for."),
            )
        }  # fmt: skip
        for (share, gpu_type), (limit, lend_limit, strategy, borrow_limit) in sorted(
            limits.items()
        ):
            key = [share, gpu_type]
            families["nominal_quota"].add_metric(key, limit)
            if strategy != QuotaShare.Strategy.LEND_AND_BORROW:
                families["borrowing_limit"].add_metric(key, 0)
            elif borrow_limit >= 0:
                families["borrowing_limit"].add_metric(key, limit * borrow_limit // 100)
            lending = 0 if strategy == QuotaShare.Strategy.RESERVE else limit
            if lend_limit is not None:
                lending = min(lending, lend_limit)
            families["lending_limit"].add_metric(key, lending)
        for row in current_usage():
            key = [row.share, row.gpu_type]
            families["resource_usage"].add_metric(key, row.usage)
            families["borrowed"].add_metric(key, row.borrowed)
            families["lent"].add_metric(key, row.lent)
            families["idle"].add_metric(key, row.idle)
            families["pending_demand"].add_metric(key, row.demand)
        yield from families.values()

    def _workloads(self):
        pending = GaugeMetricFamily(
            "portal_pending_workloads", "Jobs waiting in the share's queue (RUNNABLE).",
            labels=["cluster_queue"],
        )  # fmt: skip
        admitted = GaugeMetricFamily(
            "portal_admitted_active_workloads",
            "Jobs holding GPUs (scheduled, starting, running or stopping).",
            labels=["cluster_queue"],
        )
        counts = Counter()
        for share, state, n in (
            Job.objects.filter(state__in=[Job.State.RUNNABLE, *Job.PLACED_STATES])
            .values_list("share__name", "state")
            .annotate(n=Count("id"))
            .order_by()
        ):
            counts[(share, "pending" if state == Job.State.RUNNABLE else "admitted")] += n
        for share in QuotaShare.objects.order_by("name").values_list("name", flat=True):
            pending.add_metric([share], counts[(share, "pending")])
            admitted.add_metric([share], counts[(share, "admitted")])
        yield pending
        yield admitted

    def _held_off(self):
        family = GaugeMetricFamily(
            "portal_held_off_workloads",
            "Runnable jobs the churn breaker holds off borrowed GPUs (preempted too often "
            "within its window): they run only within their share's limit until it has passed.",
            labels=["cluster_queue"],
        )
        counts = Counter(
            Job.objects.filter(pk__in=list(held_off())).values_list("share__name", flat=True)
        )
        for share in QuotaShare.objects.order_by("name").values_list("name", flat=True):
            family.add_metric([share], counts[share])
        yield family

    def _preemptions(self):
        family = CounterMetricFamily(
            "portal_preemptions",
            "Job attempts preempted, by kind: reclaim (for another share's job within its "
            "limit), in_share (for a higher-priority job of the same share), unknown.",
            labels=["cluster_queue", "kind"],
        )
        counts = Counter()
        for share, share_id, for_share_id, n in (
            JobAttempt.objects.filter(outcome=JobAttempt.Outcome.PREEMPTED)
            .values_list("job__share__name", "job__share_id", "preempted_for__share_id")
            .annotate(n=Count("id"))
            .order_by()
        ):
            counts[(share, preemption_kind(share_id, for_share_id))] += n
        for share, kind in sorted(counts):
            family.add_metric([share, kind], counts[(share, kind)])
        yield family

    def _nodes(self):
        nodes = GaugeMetricFamily("portal_nodes", "GPU nodes by state.", labels=["state"])
        gpus = GaugeMetricFamily(
            "portal_node_gpus", "GPUs on nodes, by GPU type and node state.",
            labels=["resource", "state"],
        )  # fmt: skip
        outside = GaugeMetricFamily(
            "portal_node_outside_gpus",
            "GPUs used outside the portal (by jobs the portal did not submit, such as a cluster "
            "manager's own) on nodes that are up, by GPU type: neither capacity nor planned on.",
            labels=["resource"],
        )
        by_state = Counter()
        by_type = Counter()
        for gpu_type, state, n, total, held_outside in node_gpus():
            by_state[state] += n
            gpus.add_metric([gpu_type, state], total)
            by_type[gpu_type] += 0 if state == Node.State.DOWN else held_outside
        for state in Node.State.values:
            nodes.add_metric([state], by_state[state])
        for gpu_type in sorted(by_type):
            outside.add_metric([gpu_type], by_type[gpu_type])
        yield nodes
        yield gpus
        yield outside

    def _cycle(self):
        stats = CycleStats.objects.filter(pk=1).first() or CycleStats()
        buckets, cumulative = [], 0
        for bound in CYCLE_DURATION_BUCKETS:
            cumulative += getattr(stats, cycle_bucket_field(bound))
            buckets.append((cycle_bucket_label(bound), cumulative))
        yield HistogramMetricFamily(
            "portal_cycle_duration_seconds",
            "How long scheduling cycles took.",
            buckets=buckets,
            sum_value=stats.duration_sum,
        )
        runs = CounterMetricFamily(
            "portal_cycles", "Scheduling cycles run, by result.", labels=["result"]
        )
        runs.add_metric(["ok"], stats.runs_ok)
        runs.add_metric(["error"], stats.runs_failed)
        yield runs
        if stats.last_success_at is not None:
            yield GaugeMetricFamily(
                "portal_last_successful_cycle_timestamp_seconds",
                "When the last scheduling cycle succeeded (Unix time).",
                value=stats.last_success_at.timestamp(),
            )


def metrics_text() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PortalCollector())
    return generate_latest(registry)

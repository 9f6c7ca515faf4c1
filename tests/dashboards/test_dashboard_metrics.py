"""/metrics: Prometheus text that prometheus_client's own parser reads, Kueue-like names,
and access by token or network."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboards.models import CYCLE_DURATION_BUCKETS, CycleStats, cycle_bucket_field
from dashboards.services import cycle_record
from scheduler.models import Job, JobAttempt, Node
from shares.models import QuotaShare


def scrape(client, **extra) -> dict:
    response = client.get("/metrics", **extra)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def job(share, user, gpus, state, **fields):
    return Job.objects.create(
        share=share, submitted_by=user, gpu_type="h100", gpus=gpus, command="x", state=state,
        **fields,
    )  # fmt: skip


@pytest.mark.django_db
def test_metrics_report_quota_usage_queue_preemptions_nodes_and_cycles(
    client, vision_share, research_share, alice, carol
):
    """vision (LEND, 8) lends 4 to research (LEND_AND_BORROW, 8, borrow cap 50 % = 4) which
    runs 12; one research job waits. Two research attempts were preempted: one reclaimed by
    vision, one in-share."""
    QuotaShare.objects.filter(pk=research_share.pk).update(borrow_limit=50)
    Node.objects.create(name="n0", gpu_type="h100", gpus=8)
    Node.objects.create(name="n1", gpu_type="h100", gpus=8)
    Node.objects.create(name="n2", gpu_type="h100", gpus=8, state=Node.State.DOWN)
    running = job(research_share, alice, 12, Job.State.RUNNING)
    waiting = job(research_share, alice, 2, Job.State.RUNNABLE)
    owner = job(vision_share, carol, 4, Job.State.RUNNABLE)
    JobAttempt.objects.create(job=running, number=1, outcome="PREEMPTED", preempted_for=owner)
    JobAttempt.objects.create(job=running, number=2, outcome="PREEMPTED", preempted_for=waiting)
    JobAttempt.objects.create(job=waiting, number=1, outcome="FAILED")
    cycle_record(0.02, True, now=datetime(2026, 3, 2, 10, 0, tzinfo=UTC))
    cycle_record(0.3, True, now=datetime(2026, 3, 2, 10, 0, 5, tzinfo=UTC))
    cycle_record(20.0, False, now=datetime(2026, 3, 2, 10, 0, 10, tzinfo=UTC))

    m = scrape(client)
    research = (("cluster_queue", "research"), ("resource", "h100"))
    vision = (("cluster_queue", "vision"), ("resource", "h100"))
    assert m[("portal_cluster_queue_nominal_quota", research)] == 8
    assert m[("portal_cluster_queue_borrowing_limit", research)] == 4
    assert m[("portal_cluster_queue_borrowing_limit", vision)] == 0
    assert m[("portal_cluster_queue_lending_limit", vision)] == 8
    assert m[("portal_cluster_queue_resource_usage", research)] == 12
    assert m[("portal_cluster_queue_borrowed", research)] == 4
    assert m[("portal_cluster_queue_lent", vision)] == 4
    assert m[("portal_cluster_queue_pending_demand", vision)] == 4
    assert m[("portal_pending_workloads", (("cluster_queue", "research"),))] == 1
    assert m[("portal_admitted_active_workloads", (("cluster_queue", "research"),))] == 1
    assert (
        m[("portal_preemptions_total", (("cluster_queue", "research"), ("kind", "reclaim")))] == 1
    )
    assert (
        m[("portal_preemptions_total", (("cluster_queue", "research"), ("kind", "in_share")))] == 1
    )
    assert m[("portal_nodes", (("state", "READY"),))] == 2
    assert m[("portal_nodes", (("state", "DOWN"),))] == 1
    assert m[("portal_node_gpus", (("resource", "h100"), ("state", "DOWN")))] == 8
    assert m[("portal_cycle_duration_seconds_bucket", (("le", "0.025"),))] == 1
    assert m[("portal_cycle_duration_seconds_bucket", (("le", "0.5"),))] == 2
    assert m[("portal_cycle_duration_seconds_bucket", (("le", "10.0"),))] == 2
    assert m[("portal_cycle_duration_seconds_bucket", (("le", "+Inf"),))] == 3
    assert m[("portal_cycle_duration_seconds_count", ())] == 3
    assert m[("portal_cycle_duration_seconds_sum", ())] == pytest.approx(20.32)
    assert m[("portal_cycles_total", (("result", "error"),))] == 1
    last_ok = datetime(2026, 3, 2, 10, 0, 5, tzinfo=UTC).timestamp()
    assert m[("portal_last_successful_cycle_timestamp_seconds", ())] == last_ok


@pytest.mark.django_db
def test_cycle_record_counts_runs_and_keeps_the_last_success():
    at = [datetime(2026, 3, 2, 10, 0, second, tzinfo=UTC) for second in (0, 5, 10)]
    cycle_record(0.004, True, now=at[0])
    cycle_record(0.004, True, now=at[1])
    cycle_record(1.5, False, now=at[2])
    stats = CycleStats.objects.get()
    assert (stats.runs_ok, stats.runs_failed, stats.duration_sum) == (2, 1, pytest.approx(1.508))
    runs_by_bucket = {
        bound: getattr(stats, cycle_bucket_field(bound)) for bound in CYCLE_DURATION_BUCKETS
    }
    assert {bound: runs for bound, runs in runs_by_bucket.items() if runs} == {0.005: 2, 2.5: 1}
    assert (stats.last_success_at, stats.last_run_at) == (at[1], at[2])
    assert stats.last_duration_seconds == 1.5


@pytest.mark.django_db
def test_metrics_answer_allowed_networks_and_the_bearer_token_only(client, settings):
    settings.METRICS_ALLOWED_NETS = ["10.0.0.0/8"]
    settings.METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 403  # 127.0.0.1 is no longer listed
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 403


@pytest.mark.django_db
def test_metrics_by_default_answer_localhost_only(client):
    assert client.get("/metrics").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="192.168.1.20").status_code == 403

"""Put a job on GPUs the way the scheduling cycle records it (an attempt holding GPU rows),
so reads can be tested before the cycle exists."""

from __future__ import annotations

from django.utils import timezone

from scheduler.models import GpuAssignment, Job, JobAttempt, Node


def place(job: Job, node: Node, indices: list[int], state: str = Job.State.RUNNING) -> JobAttempt:
    attempt = JobAttempt.objects.create(
        job=job,
        number=job.attempt_count + 1,
        allocations=[{"node": node.name, "gpu_indices": indices}],
        started_at=timezone.now(),
    )
    GpuAssignment.objects.bulk_create(
        GpuAssignment(attempt=attempt, node=node, gpu_index=index) for index in indices
    )
    Job.objects.filter(pk=job.pk).update(
        state=state, attempt_count=attempt.number, started_at=timezone.now()
    )
    return attempt


def preempt(attempt: JobAttempt, for_job: Job) -> None:
    attempt.gpus.update(released=True)
    JobAttempt.objects.filter(pk=attempt.pk).update(
        outcome=JobAttempt.Outcome.PREEMPTED,
        ended_at=timezone.now(),
        end_reason=f"reclaimed for job {for_job.pk}",
        preempted_for=for_job,
    )
    Job.objects.filter(pk=attempt.job_id).update(
        state=Job.State.RUNNABLE, preemption_count=attempt.job.preemption_count + 1
    )


def add_cluster(world) -> None:
    """Two 8-GPU h100 nodes ("h100-0", "h100-1") and one 4-GPU l4 node ("l4-0"), READY, into
    `world.nodes`: the cluster the API tests place jobs on."""
    for name, gpu_type, gpus in (("h100-0", "h100", 8), ("h100-1", "h100", 8), ("l4-0", "l4", 4)):
        world.nodes[name] = Node.objects.create(name=name, gpu_type=gpu_type, gpus=gpus)


def job_request(**overrides) -> dict:
    """A valid submit body for share `research`; override any field."""
    return {
        "name": "train",
        "share": "research",
        "gpu_type": "h100",
        "gpus": 8,
        "command": "python train.py",
        **overrides,
    }

"""Job and node rules, enforced in clean() with a named message and in the database."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from scheduler import models as m
from scheduler.models import GpuAssignment, Job, JobAttempt, Node


@pytest.fixture
def node(db) -> Node:
    return Node.objects.create(name="gpu-0", gpu_type="h100", gpus=8)


@pytest.fixture
def job(research_share, alice) -> Job:
    return Job.objects.create(
        share=research_share, submitted_by=alice, gpu_type="h100", gpus=8, command="true"
    )


def refused(write) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        write()


@pytest.mark.django_db
class TestJobRules:
    def test_gpus_divisible_by_nodes(self, research_share, alice):
        job = Job(
            share=research_share, submitted_by=alice, gpu_type="h100", gpus=6, nodes=4,
            command="true",
        )  # fmt: skip
        with pytest.raises(ValidationError) as caught:
            job.full_clean()
        assert caught.value.message_dict["gpus"] == [m.GPUS_DIVISIBLE_BY_NODES.format(nodes=4)]
        refused(job.save)

    def test_priority_range(self, job):
        job.priority = 10000
        with pytest.raises(ValidationError) as caught:
            job.full_clean()
        assert m.PRIORITY_RANGE in caught.value.message_dict["priority"]
        refused(lambda: Job.objects.filter(pk=job.pk).update(priority=10000))

    def test_timeout_range(self, job):
        job.timeout_seconds = m.MAX_TIMEOUT_SECONDS + 1
        with pytest.raises(ValidationError) as caught:
            job.full_clean()
        assert m.TIMEOUT_RANGE in caught.value.message_dict["timeout_seconds"]
        refused(lambda: Job.objects.filter(pk=job.pk).update(timeout_seconds=0))

    def test_client_token_unique_per_user(self, job, research_share, alice, bob):
        Job.objects.filter(pk=job.pk).update(client_token="run-1")
        refused(
            lambda: Job.objects.create(
                share=research_share, submitted_by=alice, gpu_type="h100", gpus=1,
                command="true", client_token="run-1",
            )
        )  # fmt: skip
        # Another user may use the same token, and an empty token is no token.
        Job.objects.create(
            share=research_share, submitted_by=bob, gpu_type="h100", gpus=1, command="true",
            client_token="run-1",
        )  # fmt: skip
        for _ in range(2):
            Job.objects.create(
                share=research_share, submitted_by=alice, gpu_type="h100", gpus=1, command="true"
            )

    def test_node_gpus_range(self, db):
        with pytest.raises(ValidationError) as caught:
            Node(name="n", gpu_type="h100", gpus=0).full_clean()
        assert "gpus" in caught.value.message_dict
        refused(lambda: Node.objects.create(name="n", gpu_type="h100", gpus=0))

    def test_a_gpu_is_held_by_one_attempt_at_a_time(self, job, node, research_share, alice):
        """The database refuses to give a GPU index still held by one attempt to another."""
        first = JobAttempt.objects.create(job=job, number=1)
        GpuAssignment.objects.create(attempt=first, node=node, gpu_index=3)
        other = Job.objects.create(
            share=research_share, submitted_by=alice, gpu_type="h100", gpus=1, command="true"
        )
        second = JobAttempt.objects.create(job=other, number=1)
        refused(lambda: GpuAssignment.objects.create(attempt=second, node=node, gpu_index=3))
        GpuAssignment.objects.filter(attempt=first).update(released=True)
        GpuAssignment.objects.create(attempt=second, node=node, gpu_index=3)

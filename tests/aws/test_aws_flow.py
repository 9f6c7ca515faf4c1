"""AWS's quota-management sample, end to end, through boto3: the set-up cells, three quota
shares (one per strategy), a borrower filling idle GPUs, the owner's job reclaiming them,
DescribeServiceJob showing the preemption, and the borrower resuming from its checkpoint."""

from __future__ import annotations

import json
import sys

import pytest

from awsbatch.models import InstanceType
from scheduler.models import Job
from tests.aws.conftest import QUEUE
from tests.live import JOB_SCRIPT, wait_for

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def training_job(name: str, instance: str, steps: int = 40, count: int = 1) -> str:
    """A SageMaker CreateTrainingJob request running the demo job on the portal's nodes."""
    return json.dumps({
        "TrainingJobName": name,
        "AlgorithmSpecification": {
            "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:latest",
            "TrainingInputMode": "File",
            "ContainerEntrypoint": [sys.executable, str(JOB_SCRIPT)],
            "ContainerArguments": ["--steps", str(steps), "--step-seconds", "0.1"],
        },
        "RoleArn": "arn:aws:iam::123456789012:role/SageMakerRole",
        "ResourceConfig": {"InstanceType": instance, "InstanceCount": count,
                           "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        "Environment": {"EPOCHS": "3"},
    })  # fmt: skip


def share(name, unit, count, strategy, *, team, borrow=None, in_share=False):
    sharing = {"strategy": strategy, **({"borrowLimit": borrow} if borrow is not None else {})}
    return {
        "quotaShareName": name,
        "jobQueue": QUEUE,
        "capacityLimits": [{"maxCapacity": count, "capacityUnit": unit}],
        "resourceSharingConfiguration": sharing,
        "preemptionConfiguration": {"inSharePreemption": "ENABLED" if in_share else "DISABLED"},
        "tags": {"team": team},
    }


def status(client, job_id: str) -> str:
    return client.describe_service_job(jobId=job_id)["status"]


def test_the_quota_management_sample_runs_against_the_portal(aws, world):
    InstanceType.objects.create(name="ml.test.h100x4", gpu_type="h100", gpus=4)
    admin = aws.client("root")
    # The sample's set-up cells: the portal is this service environment, policy and queue.
    env = admin.create_service_environment(
        serviceEnvironmentName=QUEUE, serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=[{"maxCapacity": 2, "capacityUnit": "ml.p5.48xlarge"}],
    )  # fmt: skip
    policy = admin.create_scheduling_policy(
        name=QUEUE, quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"}
    )
    queue = admin.create_job_queue(
        jobQueueName=QUEUE, priority=1, jobQueueType="SAGEMAKER_TRAINING",
        schedulingPolicyArn=policy["arn"],
        serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": env["serviceEnvironmentArn"]}],
    )  # fmt: skip
    assert (
        admin.describe_job_queues(jobQueues=[queue["jobQueueArn"]])["jobQueues"][0]["jobQueueName"]
        == QUEUE
    )
    # The world's two shares make way for the sample's three (they have no jobs).
    for old in ("vision", "research"):
        admin.delete_quota_share(quotaShareArn=old)
    admin.create_quota_share(**share("reserved", "h100", 4, "RESERVE", team="vision"))
    admin.create_quota_share(**share("lender", "ml.p5.48xlarge", 1, "LEND", team="vision"))
    created = admin.create_quota_share(**share("borrower", "ml.test.h100x4", 1,
                                               "LEND_AND_BORROW", team="ml-research",
                                               borrow=-1))  # fmt: skip
    assert created["quotaShareArn"].endswith(f"job-queue/{QUEUE}/quota-share/borrower")
    described = admin.describe_quota_share(quotaShareArn=created["quotaShareArn"])
    assert described["capacityLimits"] == [{"capacityUnit": "h100", "maxCapacity": 4}]
    assert described["resourceSharingConfiguration"] == {"strategy": "LEND_AND_BORROW",
                                                         "borrowLimit": -1}  # fmt: skip

    alice = aws.client("alice")
    borrowers = [
        alice.submit_service_job(
            jobName=f"borrower-{i}", jobQueue=QUEUE, serviceJobType="SAGEMAKER_TRAINING",
            quotaShareName="borrower", schedulingPriority=10,
            serviceRequestPayload=training_job(f"borrower-{i}", "ml.test.h100x4"),
        )["jobId"]
        for i in range(4)
    ]  # fmt: skip
    # Three run (one within the limit, two on the lender's idle GPUs); the reserved share's
    # GPUs are never lent, so the fourth waits, and says why.
    wait_for(lambda: [status(alice, j) for j in borrowers[:3]] == ["RUNNING"] * 3,
             timeout=60, what="three borrowers running")  # fmt: skip
    waiting = alice.describe_service_job(jobId=borrowers[3])
    assert waiting["status"] == "RUNNABLE" and "lendable" in waiting["statusReason"]
    wait_for(lambda: all(aws.system.checkpoint_dir(int(j)).joinpath("checkpoint").exists()
                         for j in borrowers[:3]), what="borrowers checkpointing")  # fmt: skip

    carol = aws.client("carol")
    owner = carol.submit_service_job(
        jobName="owner", jobQueue=QUEUE, serviceJobType="SAGEMAKER_TRAINING",
        quotaShareName="lender", serviceRequestPayload=training_job("owner", "ml.p5.48xlarge", 5),
    )["jobId"]  # fmt: skip
    wait_for(lambda: status(carol, owner) == "SUCCEEDED", timeout=90, what="the owner's job")
    preempted = [j for j in borrowers[:3]
                 if alice.describe_service_job(jobId=j)["preemptionSummary"][
                     "preemptedAttemptCount"] == 1]  # fmt: skip
    assert len(preempted) == 2
    for job_id in borrowers:
        wait_for(lambda job_id=job_id: status(alice, job_id) == "SUCCEEDED", timeout=120,
                 what=f"borrower {job_id}")  # fmt: skip
    detail = alice.describe_service_job(jobId=preempted[0])
    recent = detail["preemptionSummary"]["recentPreemptedAttempts"]
    assert len(recent) == 1 and "preempted" in recent[0]["statusReason"]
    assert len(detail["attempts"]) == 2 and detail["isTerminated"] is True
    assert detail["capacityUsage"] == [{"capacityUnit": "ml.test.h100x4", "quantity": 1.0}]
    assert json.loads(detail["serviceRequestPayload"])["RoleArn"].endswith("SageMakerRole")
    resumed_from = aws.system.checkpoint_dir(int(preempted[0])).joinpath("attempt-2.start")
    assert int(resumed_from.read_text()) > 0
    job = Job.objects.get(pk=int(preempted[0]))
    assert (job.gpus, job.priority, job.env) == (4, 10, {"EPOCHS": "3"})
    assert job.image == "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:latest"

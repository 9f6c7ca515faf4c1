"""The job queue: GetJobQueueSnapshot, and enough of CreateJobQueue / DescribeJobQueues,
CreateSchedulingPolicy / DescribeSchedulingPolicies and CreateServiceEnvironment /
DescribeServiceEnvironments that the set-up of AWS's quota-management sample runs.

The portal is one job queue on one service environment (its nodes) with one scheduling policy
(quota shares, idle capacity FIFO): their names are settings (AWS_JOB_QUEUE_NAME,
AWS_SERVICE_ENVIRONMENT_NAME, AWS_SCHEDULING_POLICY_NAME). Creating what exists, in a shape the
portal is, succeeds and changes nothing; anything else is a ClientException that says what the
portal is."""

from __future__ import annotations

import time

from django.conf import settings

from awsbatch import arns
from awsbatch.errors import client_error
from awsbatch.operations import Caller, operation
from awsbatch.operations.shares import check_queue
from scheduler.jobs.selectors import jobs_visible_to, queue_snapshot
from shares.selectors import ready_capacity

ONE_OF_A_KIND = (
    "{field}: this portal has one {kind}, {name} (the setting {setting}); it cannot create {given}."
)
QUEUE_TYPE = "jobQueueType: this portal's job queue is SAGEMAKER_TRAINING, not {given}."
COMPUTE_ENVIRONMENTS = (
    "computeEnvironmentOrder: this portal runs on its own nodes (a service environment), not "
    "on compute environments."
)
FAIRSHARE = (
    "fairsharePolicy: this portal schedules by quota shares (quotaSharePolicy), not fair share."
)
QUOTA_SHARE_POLICY = "quotaSharePolicy: required (idleResourceAssignmentStrategy FIFO)."
NOT_FIFO = (
    "quotaSharePolicy.idleResourceAssignmentStrategy: the portal lends idle capacity {order} "
    "(its BORROW_ORDER setting), not {given}."
)


def _same(field: str, kind: str, given: str, name: str, setting: str) -> None:
    given_name = arns.name_of(given, kind=kind, field=field)
    if given_name != name:
        raise client_error(ONE_OF_A_KIND.format(field=field, kind=kind, name=name,
                                                setting=setting, given=given))  # fmt: skip


def _queue() -> dict:
    return {
        "jobQueueName": settings.AWS_JOB_QUEUE_NAME,
        "jobQueueArn": arns.job_queue_arn(),
        "state": "ENABLED",
        "status": "VALID",
        "schedulingPolicyArn": arns.scheduling_policy_arn(),
        "priority": 1,
        "computeEnvironmentOrder": [],
        "serviceEnvironmentOrder": [
            {"order": 1, "serviceEnvironment": arns.service_environment_arn()}
        ],
        "jobQueueType": "SAGEMAKER_TRAINING",
        "tags": {},
    }


def _service_environment() -> dict:
    return {
        "serviceEnvironmentName": settings.AWS_SERVICE_ENVIRONMENT_NAME,
        "serviceEnvironmentArn": arns.service_environment_arn(),
        "serviceEnvironmentType": "SAGEMAKER_TRAINING",
        "state": "ENABLED",
        "status": "VALID",
        # Its capacity is the portal's READY nodes, in GPUs of each type.
        "capacityLimits": [
            {"capacityUnit": t, "maxCapacity": n} for t, n in sorted(ready_capacity().items())
        ],  # fmt: skip
        "tags": {},
    }


@operation("CreateJobQueue")
def create_job_queue(caller: Caller, params: dict) -> dict:
    _same("jobQueueName", "job-queue", params["jobQueueName"], settings.AWS_JOB_QUEUE_NAME,
          "AWS_JOB_QUEUE_NAME")  # fmt: skip
    if params.get("jobQueueType", "SAGEMAKER_TRAINING") != "SAGEMAKER_TRAINING":
        raise client_error(QUEUE_TYPE.format(given=params["jobQueueType"]))
    if params.get("computeEnvironmentOrder"):
        raise client_error(COMPUTE_ENVIRONMENTS)
    for i, entry in enumerate(params.get("serviceEnvironmentOrder", [])):
        _same(f"serviceEnvironmentOrder[{i}].serviceEnvironment", "service-environment",
              entry["serviceEnvironment"], settings.AWS_SERVICE_ENVIRONMENT_NAME,
              "AWS_SERVICE_ENVIRONMENT_NAME")  # fmt: skip
    if params.get("schedulingPolicyArn"):
        _same("schedulingPolicyArn", "scheduling-policy", params["schedulingPolicyArn"],
              settings.AWS_SCHEDULING_POLICY_NAME, "AWS_SCHEDULING_POLICY_NAME")  # fmt: skip
    return {"jobQueueName": settings.AWS_JOB_QUEUE_NAME, "jobQueueArn": arns.job_queue_arn()}


@operation("DescribeJobQueues", atomic=False)
def describe_job_queues(caller: Caller, params: dict) -> dict:
    wanted = params.get("jobQueues")
    if wanted:
        names = {arns.name_of(q, kind="job-queue", field="jobQueues") for q in wanted}
        if settings.AWS_JOB_QUEUE_NAME not in names:
            return {"jobQueues": []}
    return {"jobQueues": [_queue()]}


@operation("CreateServiceEnvironment")
def create_service_environment(caller: Caller, params: dict) -> dict:
    _same("serviceEnvironmentName", "service-environment", params["serviceEnvironmentName"],
          settings.AWS_SERVICE_ENVIRONMENT_NAME, "AWS_SERVICE_ENVIRONMENT_NAME")  # fmt: skip
    return {
        "serviceEnvironmentName": settings.AWS_SERVICE_ENVIRONMENT_NAME,
        "serviceEnvironmentArn": arns.service_environment_arn(),
    }


@operation("DescribeServiceEnvironments", atomic=False)
def describe_service_environments(caller: Caller, params: dict) -> dict:
    wanted = params.get("serviceEnvironments")
    if wanted:
        names = {arns.name_of(e, kind="service-environment", field="serviceEnvironments")
                 for e in wanted}  # fmt: skip
        if settings.AWS_SERVICE_ENVIRONMENT_NAME not in names:
            return {"serviceEnvironments": []}
    return {"serviceEnvironments": [_service_environment()]}


@operation("CreateSchedulingPolicy")
def create_scheduling_policy(caller: Caller, params: dict) -> dict:
    _same("name", "scheduling-policy", params["name"], settings.AWS_SCHEDULING_POLICY_NAME,
          "AWS_SCHEDULING_POLICY_NAME")  # fmt: skip
    if params.get("fairsharePolicy"):
        raise client_error(FAIRSHARE)
    policy = params.get("quotaSharePolicy")
    if policy is None:
        raise client_error(QUOTA_SHARE_POLICY)
    given = policy["idleResourceAssignmentStrategy"]
    if settings.BORROW_ORDER != "fifo":
        raise client_error(NOT_FIFO.format(order=settings.BORROW_ORDER, given=given))
    return {"name": settings.AWS_SCHEDULING_POLICY_NAME, "arn": arns.scheduling_policy_arn()}


@operation("GetJobQueueSnapshot", atomic=False)
def get_job_queue_snapshot(caller: Caller, params: dict) -> dict:
    """The front of the queue in the engine's order, the first job of each quota share, and each
    share's GPUs in use, as the native queue/ endpoint shows them: every share's figures (as
    AWS does for anyone who may read the queue), but only the caller's own teams' jobs."""
    check_queue(params["jobQueue"])
    snapshot = queue_snapshot()
    now = _millis_now()
    visible = set(
        jobs_visible_to(caller.user)
        .filter(pk__in=[e.job.pk for e in snapshot.front])
        .values_list("pk", flat=True)
    )
    front = [{"jobArn": arns.job_arn(e.job.pk), "earliestTimeAtPosition": now}
             for e in snapshot.front if e.job.pk in visible]  # fmt: skip
    first_of_share: dict[str, list[dict]] = {}
    for entry in snapshot.front:
        if entry.job.pk in visible and entry.job.share.name not in first_of_share:
            first_of_share[entry.job.share.name] = [
                {"jobArn": arns.job_arn(entry.job.pk), "earliestTimeAtPosition": now}
            ]
    totals: dict[str, float] = {}
    per_share = []
    for share, types in sorted(snapshot.usage.shares.items()):
        usage = [{"capacityUnit": t, "quantity": float(u.used)} for t, u in sorted(types.items())]
        for t, u in types.items():
            totals[t] = totals.get(t, 0.0) + u.used
        per_share.append({"quotaShareName": share, "capacityUsage": usage})
    return {
        "frontOfQueue": {"jobs": front, "lastUpdatedAt": now},
        "frontOfQuotaShares": {"quotaShares": first_of_share, "lastUpdatedAt": now},
        "queueUtilization": {
            "totalCapacityUsage": [
                {"capacityUnit": t, "quantity": q} for t, q in sorted(totals.items())
            ],  # fmt: skip
            "quotaShareUtilization": {"topCapacityUtilization": per_share},
            "lastUpdatedAt": now,
        },
    }


def _millis_now() -> int:
    return int(time.time() * 1000)

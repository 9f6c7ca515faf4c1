"""Service jobs: SubmitServiceJob, DescribeServiceJob, ListServiceJobs, UpdateServiceJob,
TerminateServiceJob, TerminateServiceJobs, onto scheduler.jobs.services and selectors.

A SAGEMAKER_TRAINING job's `serviceRequestPayload` is a SageMaker CreateTrainingJob request (as
JSON). The portal reads: ResourceConfig.InstanceType and InstanceCount (the GPU type, the GPUs
per node and the nodes, from the admin's instance types), AlgorithmSpecification.
ContainerEntrypoint + ContainerArguments (the command, run on the portal's nodes),
AlgorithmSpecification.TrainingImage (the image the command runs in on Kubernetes nodes; node
agents and Slurm run it on the node itself), Environment (the job's env),
StoppingCondition.MaxRuntimeInSeconds (its timeout) and TrainingJobName. The rest (RoleArn,
input and output data, VPC, checkpoint S3
config, hyperparameters, ...) is kept with the job and shown back, and otherwise ignored: the
job's checkpoints go to its CHECKPOINT_DIR (docs/aws.md)."""

from __future__ import annotations

import base64
import json
import shlex

from django.conf import settings
from django.core.exceptions import ValidationError

from awsbatch import arns
from awsbatch.errors import AwsError, client_error, in_aws_words
from awsbatch.models import InstanceType, ServiceJob, instance_type_named
from awsbatch.operations import Caller, operation
from awsbatch.operations.shares import NO_SUCH_SHARE, check_queue, page_size
from portal.db.bulk import insert_with_children
from portal.ids import is_row_id
from scheduler.jobs.selectors import jobs_visible_to
from scheduler.jobs.services import (
    ClientTokenConflict,
    ShareNotVisible,
    job_cancel,
    job_set_priority,
    job_submit,
)
from scheduler.models import Job, JobAttempt

PAYLOAD_NOT_JSON = "serviceRequestPayload: must be a SageMaker CreateTrainingJob request, as JSON."
PAYLOAD_FIELD = "serviceRequestPayload.{field}: {rule}"
NEEDS_SHARE = "quotaShareName: required: the quota share the job runs in."
NO_SUCH_JOB = "jobId: no job {job_id} in job queue {queue}."
EVALUATE_ON_EXIT = (
    "retryStrategy.evaluateOnExit: not supported; a failed attempt is retried while attempts "
    "are left."
)
TOKEN_CONFLICT = "clientToken: {token} was already used for another request."
BAD_TOKEN = "nextToken: not a token this operation gave."
FILTERS = ("JOB_NAME", "QUOTA_SHARE_NAME", "SHARE_IDENTIFIER")
UNKNOWN_FILTER = "filters[{i}].name: one of {names}."

# The portal's job states as AWS's ServiceJobStatus: a job being stopped still runs; a
# cancelled one is FAILED (its statusReason says it was cancelled), as AWS terminates.
STATUS = {
    Job.State.SUBMITTED: "SUBMITTED", Job.State.RUNNABLE: "RUNNABLE",
    Job.State.SCHEDULED: "SCHEDULED", Job.State.STARTING: "STARTING",
    Job.State.RUNNING: "RUNNING", Job.State.PREEMPTING: "RUNNING",
    Job.State.SUCCEEDED: "SUCCEEDED", Job.State.FAILED: "FAILED",
    Job.State.CANCELLED: "FAILED",
}  # fmt: skip
# AWS's PENDING (waiting on dependencies) has no portal state: listing it lists nothing.
STATES_OF = {status: [s for s, a in STATUS.items() if a == status] for status in STATUS.values()}
RETRY_ATTEMPTS = range(1, 11)  # ServiceJobRetryStrategy.attempts: between 1 and 10
NOT_SECONDS = "{field}: an integer of seconds, at least 1."


def _millis(moment) -> int | None:
    return int(moment.timestamp() * 1000) if moment is not None else None


def _payload(text: str) -> dict:
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        raise client_error(PAYLOAD_NOT_JSON) from None
    if not isinstance(payload, dict):
        raise client_error(PAYLOAD_NOT_JSON)
    return payload


def _section(payload: dict, name: str) -> dict:
    section = payload.get(name, {})
    if not isinstance(section, dict):
        raise client_error(PAYLOAD_FIELD.format(field=name, rule="must be an object."))
    return section


def _request(payload: dict) -> dict:
    """What the portal runs of a CreateTrainingJob request: size, command, env, timeout."""
    resources = _section(payload, "ResourceConfig")
    instance_name = resources.get("InstanceType")
    if not isinstance(instance_name, str) or not instance_name:
        raise client_error(PAYLOAD_FIELD.format(field="ResourceConfig.InstanceType",
                                                rule="required, e.g. ml.p5.48xlarge."))  # fmt: skip
    instance = instance_type_named(instance_name)
    if instance is None:
        known = ", ".join(InstanceType.objects.values_list("name", flat=True)) or "none"
        rule = f"{instance_name} is not an instance type this portal knows ({known})."
        raise client_error(PAYLOAD_FIELD.format(field="ResourceConfig.InstanceType", rule=rule))
    count = resources.get("InstanceCount", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise client_error(PAYLOAD_FIELD.format(field="ResourceConfig.InstanceCount",
                                                rule="an integer of at least 1."))  # fmt: skip
    algorithm = _section(payload, "AlgorithmSpecification")
    entrypoint = algorithm.get("ContainerEntrypoint") or []
    arguments = algorithm.get("ContainerArguments") or []
    if (
        not isinstance(entrypoint, list)
        or not entrypoint
        or not all(isinstance(a, str) for a in entrypoint)
    ):
        raise client_error(PAYLOAD_FIELD.format(
            field="AlgorithmSpecification.ContainerEntrypoint",
            rule="required, a list of strings: the command the portal runs on its nodes (in "
            "TrainingImage on Kubernetes nodes, on the node itself elsewhere)."))  # fmt: skip
    if not isinstance(arguments, list) or not all(isinstance(a, str) for a in arguments):
        raise client_error(PAYLOAD_FIELD.format(
            field="AlgorithmSpecification.ContainerArguments",
            rule="a list of strings, given to ContainerEntrypoint."))  # fmt: skip
    argv = [*entrypoint, *arguments]
    image = algorithm.get("TrainingImage") or ""
    if not isinstance(image, str):
        raise client_error(PAYLOAD_FIELD.format(field="AlgorithmSpecification.TrainingImage",
                                                rule="a string."))  # fmt: skip
    env = payload.get("Environment", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise client_error(PAYLOAD_FIELD.format(field="Environment",
                                                rule="a map of strings to strings."))  # fmt: skip
    stopping = _section(payload, "StoppingCondition")
    timeout = stopping.get("MaxRuntimeInSeconds")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1
    ):
        raise client_error(PAYLOAD_FIELD.format(
            field="StoppingCondition.MaxRuntimeInSeconds",
            rule="an integer of seconds, at least 1."))  # fmt: skip
    return {
        "gpu_type": instance.gpu_type,
        "gpus": instance.gpus * count,
        "nodes": count,
        "command": shlex.join(argv),
        "env": env,
        "image": image,
        "timeout_seconds": timeout,
        "instance": instance.name,
        "count": count,
    }


@operation("SubmitServiceJob", atomic=False)
def submit_service_job(caller: Caller, params: dict) -> dict:
    check_queue(params["jobQueue"])
    share_name = params.get("quotaShareName")
    if not share_name:
        raise client_error(NEEDS_SHARE)
    share_name = arns.name_of(share_name, kind="quota-share", field="quotaShareName")
    retry = params.get("retryStrategy", {})
    if retry.get("evaluateOnExit"):
        raise client_error(EVALUATE_ON_EXIT)
    if "attempts" in retry and retry["attempts"] not in RETRY_ATTEMPTS:
        raise client_error("retryStrategy.attempts: between 1 and 10.")
    asked = _request(_payload(params["serviceRequestPayload"]))
    per_attempt = params.get("timeoutConfig", {}).get("attemptDurationSeconds")
    if per_attempt is not None and per_attempt < 1:
        raise client_error(NOT_SECONDS.format(field="timeoutConfig.attemptDurationSeconds"))
    timeouts = [t for t in (asked["timeout_seconds"], per_attempt) if t is not None]
    preemption = params.get("preemptionConfiguration", {})
    try:
        job, created = job_submit(
            user=caller.user,
            share_name=share_name,
            gpu_type=asked["gpu_type"],
            gpus=asked["gpus"],
            nodes=asked["nodes"],
            command=asked["command"],
            env=asked["env"],
            image=asked["image"],
            name=params["jobName"],
            priority=params.get("schedulingPriority", 0),
            client_token=params.get("clientToken", ""),
            timeout_seconds=min(timeouts) if timeouts else None,
            max_preemptions=preemption.get("preemptionRetriesBeforeTermination"),
            retry_attempts=max(0, retry.get("attempts", 1) - 1),
            members_only=True,
        )
    except ShareNotVisible:
        message = NO_SUCH_SHARE.format(field="quotaShareName", name=share_name,
                                       queue=settings.AWS_JOB_QUEUE_NAME)  # fmt: skip
        raise client_error(message) from None
    except ClientTokenConflict:
        raise client_error(TOKEN_CONFLICT.format(token=params.get("clientToken"))) from None
    except ValidationError as error:
        raise in_aws_words(error, AWS_FIELDS) from None
    aws = ServiceJob(
        job=job,
        service_job_type=params["serviceJobType"],
        service_request_payload=params["serviceRequestPayload"],
        tags=params.get("tags", {}),
        retry_strategy=retry,
        timeout_config=params.get("timeoutConfig", {}),
        preemption_configuration=preemption,
        instance_type=asked["instance"],
        instance_count=asked["count"],
    )
    if created:
        # One prepared INSERT, in its own commit: the job is accepted already; without this
        # row it is still described, from its own fields.
        insert_with_children(aws, [], link="job")
    else:
        # The same token: the same request, AWS's own fields included, or a conflict.
        first = ServiceJob.objects.filter(job=job).first()
        if first is not None and any(
            getattr(first, field) != getattr(aws, field) for field in AWS_REQUEST_FIELDS
        ):
            raise client_error(TOKEN_CONFLICT.format(token=params.get("clientToken")))
    return {"jobArn": arns.job_arn(job.pk), "jobName": job.name, "jobId": str(job.pk)}


# What a ServiceJob keeps of a SubmitServiceJob request that the portal's job does not.
AWS_REQUEST_FIELDS = (
    "service_job_type", "service_request_payload", "tags", "retry_strategy", "timeout_config",
    "preemption_configuration",
)  # fmt: skip

# The portal's job fields in a SubmitServiceJob request's words, for its rules' messages.
AWS_FIELDS = {
    "name": "jobName",
    "priority": "schedulingPriority",
    "share": "quotaShareName",
    "max_preemptions": "preemptionConfiguration.preemptionRetriesBeforeTermination",
    "retry_attempts": "retryStrategy.attempts",
    "timeout_seconds": "timeoutConfig.attemptDurationSeconds",
    "gpus": "serviceRequestPayload.ResourceConfig",
    "nodes": "serviceRequestPayload.ResourceConfig",
    "gpu_type": "serviceRequestPayload.ResourceConfig.InstanceType",
    "command": "serviceRequestPayload.AlgorithmSpecification",
    "env": "serviceRequestPayload.Environment",
    "image": "serviceRequestPayload.AlgorithmSpecification.TrainingImage",
    "client_token": "clientToken",
}


def _job(caller: Caller, job_id: str, field: str = "jobId") -> Job:
    """A job the caller may see, by id or ARN; another team's is not found."""
    value = arns.name_of(job_id, kind="job", field=field)
    job = (
        jobs_visible_to(caller.user).filter(pk=int(value)).select_related("share").first()
        if value.isascii() and value.isdigit() and is_row_id(int(value))
        else None
    )
    if job is None:
        raise client_error(NO_SUCH_JOB.format(job_id=job_id, queue=settings.AWS_JOB_QUEUE_NAME))
    return job


def _training_job_arn(job: Job, attempt: JobAttempt) -> dict:
    """The attempt as a SageMaker training job would be named (ServiceResourceId)."""
    name = f"{job.name or 'job'}-{job.pk}-{attempt.number}"
    return {
        "name": "TrainingJobArn",
        "value": f"arn:aws:sagemaker:{settings.AWS_REGION}:{settings.AWS_ACCOUNT_ID}:"
        f"training-job/{name}",
    }


def _attempt(job: Job, attempt: JobAttempt) -> dict:
    detail = {"serviceResourceId": _training_job_arn(job, attempt)}
    for key, moment in (("startedAt", attempt.started_at), ("stoppedAt", attempt.ended_at)):
        if moment is not None:
            detail[key] = _millis(moment)
    if attempt.end_reason:
        detail["statusReason"] = attempt.end_reason
    return detail


def _capacity(job: Job, aws: ServiceJob | None) -> list[dict]:
    if aws is not None and aws.instance_type:
        return [{"capacityUnit": aws.instance_type, "quantity": float(aws.instance_count)}]
    return [{"capacityUnit": job.gpu_type, "quantity": float(job.gpus)}]


def _summary(job: Job, attempts: list[JobAttempt]) -> dict:
    aws = getattr(job, "aws", None)
    summary = {
        "jobArn": arns.job_arn(job.pk),
        "jobId": str(job.pk),
        "jobName": job.name,
        "serviceJobType": aws.service_job_type if aws else "SAGEMAKER_TRAINING",
        "quotaShareName": job.share.name,
        "status": STATUS[job.state],
        "statusReason": job.reason,
        "capacityUsage": _capacity(job, aws),
        "createdAt": _millis(job.submitted_at),
        "isTerminated": job.state in Job.FINAL_STATES,
    }
    if attempts:
        summary["latestAttempt"] = {"serviceResourceId": _training_job_arn(job, attempts[-1])}
        summary["scheduledAt"] = _millis(attempts[-1].scheduled_at)
    for key, moment in (("startedAt", job.started_at), ("stoppedAt", job.finished_at)):
        if moment is not None:
            summary[key] = _millis(moment)
    return summary


@operation("DescribeServiceJob", atomic=False)
def describe_service_job(caller: Caller, params: dict) -> dict:
    job = _job(caller, params["jobId"])
    attempts = list(job.attempts.order_by("number"))
    aws = ServiceJob.objects.filter(job=job).first()
    job.aws = aws
    preempted = [a for a in attempts if a.outcome == JobAttempt.Outcome.PREEMPTED]
    detail = {
        **_summary(job, attempts),
        "jobQueue": arns.job_queue_arn(),
        "attempts": [_attempt(job, a) for a in attempts if a.started_at or a.ended_at],
        "schedulingPriority": job.priority,
        "retryStrategy": (
            aws.retry_strategy
            if aws and aws.retry_strategy
            else {"attempts": job.retry_attempts + 1}
        ),  # fmt: skip
        "preemptionSummary": {
            "preemptedAttemptCount": job.preemption_count,
            "recentPreemptedAttempts": [_attempt(job, a) for a in preempted[-5:]],
        },
        "tags": dict(aws.tags) if aws else {},
    }
    if aws is not None:
        detail["serviceRequestPayload"] = aws.service_request_payload
    if job.max_preemptions is not None:
        detail["preemptionConfiguration"] = {
            "preemptionRetriesBeforeTermination": job.max_preemptions
        }
    if job.timeout_seconds:
        detail["timeoutConfig"] = {"attemptDurationSeconds": job.timeout_seconds}
    return detail


@operation("ListServiceJobs", atomic=False)
def list_service_jobs(caller: Caller, params: dict) -> dict:
    """The caller's visible jobs, newest first, by status and filters, a page at a time."""
    if params.get("jobQueue"):
        check_queue(params["jobQueue"])
    jobs = jobs_visible_to(caller.user).select_related("share", "aws")
    if params.get("jobStatus"):
        jobs = jobs.filter(state__in=STATES_OF.get(params["jobStatus"], []))
    for i, item in enumerate(params.get("filters", [])):
        name, values = item.get("name"), item.get("values", [])
        if name == "JOB_NAME":
            jobs = jobs.filter(name__in=values)
        elif name in ("QUOTA_SHARE_NAME", "SHARE_IDENTIFIER"):
            jobs = jobs.filter(share__name__in=values)
        else:
            raise client_error(UNKNOWN_FILTER.format(i=i, names=", ".join(FILTERS)))
    jobs = jobs.order_by("-pk")
    if params.get("nextToken"):
        try:
            before = int(base64.urlsafe_b64decode(params["nextToken"].encode()))
        except (ValueError, TypeError):
            raise client_error(BAD_TOKEN) from None
        jobs = jobs.filter(pk__lt=before)
    size = page_size(params)
    chosen = list(jobs[: size + 1])
    more = len(chosen) > size
    chosen = chosen[:size]
    latest: dict[int, JobAttempt] = {}
    for attempt in JobAttempt.objects.filter(job__in=chosen).order_by("number"):
        latest[attempt.job_id] = attempt
    listed = [_summary(j, [latest[j.pk]] if j.pk in latest else []) for j in chosen]
    answer: dict = {"jobSummaryList": listed}
    if more:
        answer["nextToken"] = base64.urlsafe_b64encode(str(chosen[-1].pk).encode()).decode()
    return answer


@operation("UpdateServiceJob")
def update_service_job(caller: Caller, params: dict) -> dict:
    job = _job(caller, params["jobId"])
    try:
        job = job_set_priority(job=job, priority=params["schedulingPriority"])
    except ValidationError as error:
        raise in_aws_words(error, AWS_FIELDS) from None
    return {"jobArn": arns.job_arn(job.pk), "jobName": job.name, "jobId": str(job.pk)}


@operation("TerminateServiceJob")
def terminate_service_job(caller: Caller, params: dict) -> dict:
    """Our cancel: a queued job ends at once, a running one is stopped with its share's grace
    period (SIGTERM, then SIGKILL)."""
    job_cancel(job=_job(caller, params["jobId"]), user=caller.user, why=params["reason"])
    return {}


@operation("TerminateServiceJobs")
def terminate_service_jobs(caller: Caller, params: dict) -> dict:
    successful, errors = [], []
    for value in params["jobs"]:
        try:
            job = _job(caller, value, field="jobs")
        except AwsError as error:  # reported for this job; the others go on
            errors.append({"job": value, "code": error.code, "message": error.message})
            continue
        job_cancel(job=job, user=caller.user, why=params.get("reason", ""))
        successful.append(value)
    return {"successful": successful, "errors": errors}

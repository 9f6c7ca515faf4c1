"""ARNs in AWS's format, and the names they stand for: a share or a job may be named by ARN or
by name wherever AWS accepts either."""

from __future__ import annotations

from django.conf import settings

from awsbatch.errors import client_error

NOT_THIS_PORTAL = "{field}: {arn} is not an ARN of this portal ({prefix}...)."


def _prefix() -> str:
    return f"arn:aws:batch:{settings.AWS_REGION}:{settings.AWS_ACCOUNT_ID}:"


def job_queue_arn(name: str | None = None) -> str:
    return f"{_prefix()}job-queue/{name or settings.AWS_JOB_QUEUE_NAME}"


def quota_share_arn(name: str) -> str:
    return f"{job_queue_arn()}/quota-share/{name}"


def job_arn(job_id: int | str) -> str:
    return f"{_prefix()}job/{job_id}"


def service_environment_arn(name: str | None = None) -> str:
    return f"{_prefix()}service-environment/{name or settings.AWS_SERVICE_ENVIRONMENT_NAME}"


def scheduling_policy_arn(name: str | None = None) -> str:
    return f"{_prefix()}scheduling-policy/{name or settings.AWS_SCHEDULING_POLICY_NAME}"


def name_of(value: str, *, kind: str, field: str) -> str:
    """The name an ARN of `kind` ("job-queue", "quota-share", "job", ...) stands for, or the
    value itself when it is a plain name. A quota share's ARN names this portal's job queue: a
    share of another queue is not one of this portal's."""
    if not value.startswith("arn:"):
        return value
    if not value.startswith(_prefix()):
        raise client_error(NOT_THIS_PORTAL.format(field=field, arn=value, prefix=_prefix()))
    resource = value[len(_prefix()) :]
    if kind == "quota-share":
        marker = job_queue_arn()[len(_prefix()) :] + "/quota-share/"
    else:
        marker = f"{kind}/"
    name = resource.removeprefix(marker)
    if name == resource or not name or "/" in name:
        raise client_error(f"{field}: {value} is not the ARN of a {kind} of this portal's "
                           f"({_prefix()}{marker}<name>).")  # fmt: skip
    return name

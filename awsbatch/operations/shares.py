"""Quota shares: CreateQuotaShare, DescribeQuotaShare, ListQuotaShares, UpdateQuotaShare,
DeleteQuotaShare, onto shares.services and shares.selectors. Only an admin creates, changes or
deletes a share; a member sees their team's shares, and another team's is not found."""

from __future__ import annotations

import base64

from django.conf import settings
from django.core.exceptions import ValidationError

from awsbatch import arns
from awsbatch.errors import client_error, in_aws_words
from awsbatch.models import InstanceType, ShareTags
from awsbatch.operations import Caller, operation
from shares.models import MAX_GPU_TYPES_PER_SHARE, QuotaShare, ShareChange, Team, validate_gpu_type
from shares.selectors import is_admin, shares_visible_to
from shares.services import share_create, share_delete, share_update

ADMINS_ONLY = "{operation}: only an admin creates, changes or deletes quota shares."
NOT_THE_QUEUE = "{field}: this portal is one job queue, {name}; {given} is not it."
NO_SUCH_SHARE = "{field}: no quota share {name} in job queue {queue}."
SHARE_EXISTS = "quotaShareName: a quota share named {name} already exists."
UNKNOWN_UNIT = (
    "capacityLimits[{i}].capacityUnit: {unit} is neither a GPU type (lower case, e.g. h100) "
    "nor an instance type this portal knows ({known})."
)
UNIT_TWICE = "capacityLimits[{i}].capacityUnit: GPU type {gpu_type} is given twice."
TOO_MANY_TYPES = f"capacityLimits: at most {MAX_GPU_TYPES_PER_SHARE} GPU types per share."
WHICH_TEAM = (
    "tags.team: name the share's team with a tag team=<team slug> (one of: {teams}); the "
    "caller is not on exactly one team."
)
NO_SUCH_TEAM = "tags.team: no team with slug {slug}."
BORROW_LIMIT_ONLY_LAB = (
    "resourceSharingConfiguration.borrowLimit: only a LEND_AND_BORROW share may borrow "
    "(leave it out, or -1, for {strategy})."
)
BAD_TOKEN = "nextToken: not a token this operation gave."
TOKEN_KIND = "quota-share:"  # what a ListQuotaShares token is a token of
# The share's fields in CreateQuotaShare's and UpdateQuotaShare's words, for its rules' messages.
SHARE_FIELDS = {
    "name": "quotaShareName",
    "max_gpus": "capacityLimits.maxCapacity",
    "capacity_limits": "capacityLimits",
    "strategy": "resourceSharingConfiguration.strategy",
    "borrow_limit": "resourceSharingConfiguration.borrowLimit",
    "in_share_preemption": "preemptionConfiguration.inSharePreemption",
    "state": "state",
}
MAX_RESULTS = 100
PAGE_SIZE = (
    f"maxResults: between 1 and {MAX_RESULTS} (a larger value gives pages of {MAX_RESULTS})."
)


def require_admin(caller: Caller, name: str) -> None:
    if not is_admin(caller.user):
        raise client_error(ADMINS_ONLY.format(operation=name))


def check_queue(value: str, field: str = "jobQueue") -> None:
    name = arns.name_of(value, kind="job-queue", field=field)
    if name != settings.AWS_JOB_QUEUE_NAME:
        raise client_error(NOT_THE_QUEUE.format(field=field, name=settings.AWS_JOB_QUEUE_NAME,
                                                given=value))  # fmt: skip


def share_for(caller: Caller, value: str, field: str) -> QuotaShare:
    """The share named (or ARN'd) by `value`, if the caller may see it: not found otherwise,
    so another team's share is no different from one that does not exist."""
    name = arns.name_of(value, kind="quota-share", field=field)
    share = shares_visible_to(caller.user).filter(name=name).first()
    if share is None:
        raise client_error(NO_SUCH_SHARE.format(field=field, name=name,
                                                queue=settings.AWS_JOB_QUEUE_NAME))  # fmt: skip
    return share


def gpu_limits(capacity_limits: list[dict]) -> dict[str, int]:
    """AWS's capacity limits as the share's GPUs per type: a GPU type counts GPUs, an instance
    type (InstanceType, the admin's table) counts instances of that many GPUs each."""
    instance_types = {t.name: t for t in InstanceType.objects.all()}
    limits: dict[str, int] = {}
    for i, limit in enumerate(capacity_limits):
        unit, count = limit["capacityUnit"], limit["maxCapacity"]
        instance = instance_types.get(unit)
        if instance is not None:
            gpu_type, gpus = instance.gpu_type, count * instance.gpus
        else:
            try:
                validate_gpu_type(unit)
            except ValidationError:
                known = ", ".join(sorted(instance_types)) or "none configured"
                raise client_error(UNKNOWN_UNIT.format(i=i, unit=unit, known=known)) from None
            gpu_type, gpus = unit, count
        if gpu_type in limits:
            raise client_error(UNIT_TWICE.format(i=i, gpu_type=gpu_type))
        limits[gpu_type] = gpus
    if len(limits) > MAX_GPU_TYPES_PER_SHARE:
        raise client_error(TOO_MANY_TYPES)
    return limits


def _sharing(config: dict) -> dict:
    strategy = config["strategy"]
    borrow_limit = config.get("borrowLimit", -1)
    if strategy != QuotaShare.Strategy.LEND_AND_BORROW and borrow_limit != -1:
        raise client_error(BORROW_LIMIT_ONLY_LAB.format(strategy=strategy))
    return {"strategy": strategy, "borrow_limit": borrow_limit}


def _team(caller: Caller, tags: dict) -> Team:
    slug = tags.get("team")
    if slug:
        team = Team.objects.filter(slug=slug).first()
        if team is None:
            raise client_error(NO_SUCH_TEAM.format(slug=slug))
        return team
    teams = list(Team.objects.filter(memberships__user=caller.user).distinct())
    if len(teams) == 1:
        return teams[0]
    every = ", ".join(Team.objects.values_list("slug", flat=True)) or "no team yet"
    raise client_error(WHICH_TEAM.format(teams=every))


def describe(share: QuotaShare) -> dict:
    """A share as AWS's QuotaShare shapes show it (capacity in GPUs of each type)."""
    tags = getattr(share, "aws_tags", None)
    return {
        "quotaShareName": share.name,
        "quotaShareArn": arns.quota_share_arn(share.name),
        "jobQueueArn": arns.job_queue_arn(),
        "capacityLimits": [
            {"capacityUnit": t, "maxCapacity": n} for t, n in sorted(share.limits.items())
        ],  # fmt: skip
        "resourceSharingConfiguration": {
            "strategy": share.strategy,
            **(
                {"borrowLimit": share.borrow_limit}
                if share.strategy == QuotaShare.Strategy.LEND_AND_BORROW
                else {}
            ),
        },  # fmt: skip
        "preemptionConfiguration": {
            "inSharePreemption": "ENABLED" if share.in_share_preemption else "DISABLED"
        },
        "state": share.state,
        "status": "VALID",
        "tags": dict(tags.tags) if tags is not None else {},
    }


@operation("CreateQuotaShare")
def create_quota_share(caller: Caller, params: dict) -> dict:
    require_admin(caller, "CreateQuotaShare")
    check_queue(params["jobQueue"])
    name = params["quotaShareName"]
    if QuotaShare.objects.filter(name=name).exists():
        raise client_error(SHARE_EXISTS.format(name=name))
    tags = params.get("tags", {})
    try:
        share = share_create(
            name=name,
            team=_team(caller, tags),
            capacity_limits=gpu_limits(params["capacityLimits"]),
            in_share_preemption=(
                params["preemptionConfiguration"]["inSharePreemption"] == "ENABLED"
            ),
            state=params.get("state", QuotaShare.State.ENABLED),
            actor=caller.user,
            source=ShareChange.Source.API,
            **_sharing(params["resourceSharingConfiguration"]),
        )
    except ValidationError as error:
        raise in_aws_words(error, SHARE_FIELDS) from None
    ShareTags.objects.create(share=share, tags=tags)
    return {"quotaShareName": share.name, "quotaShareArn": arns.quota_share_arn(share.name)}


@operation("DescribeQuotaShare", atomic=False)
def describe_quota_share(caller: Caller, params: dict) -> dict:
    return describe(share_for(caller, params["quotaShareArn"], "quotaShareArn"))


def page_size(params: dict) -> int:
    """A page's size: `maxResults`, at most MAX_RESULTS (also without it). The service model
    sets no minimum, so the validator lets 0 and negative sizes through: refused here."""
    size = params.get("maxResults")
    if size is None:
        return MAX_RESULTS
    if size < 1:
        raise client_error(PAGE_SIZE)
    return min(size, MAX_RESULTS)


def page(names: list[str], params: dict) -> tuple[list[str], str | None]:
    """One page of `names` (sorted), after the name `nextToken` stands for."""
    size = page_size(params)
    start = 0
    if params.get("nextToken"):
        try:
            after = base64.urlsafe_b64decode(params["nextToken"].encode()).decode()
        except (ValueError, UnicodeDecodeError):
            raise client_error(BAD_TOKEN) from None
        if not after.startswith(TOKEN_KIND):
            raise client_error(BAD_TOKEN)
        after = after.removeprefix(TOKEN_KIND)
        start = next((i for i, n in enumerate(names) if n > after), len(names))
    chosen = names[start : start + size]
    more = start + size < len(names)
    token = None
    if more and chosen:
        token = base64.urlsafe_b64encode(f"{TOKEN_KIND}{chosen[-1]}".encode()).decode()
    return chosen, token


@operation("ListQuotaShares", atomic=False)
def list_quota_shares(caller: Caller, params: dict) -> dict:
    check_queue(params["jobQueue"])
    shares = {s.name: s for s in shares_visible_to(caller.user).select_related("aws_tags")}
    chosen, token = page(sorted(shares), params)
    listed = []
    for name in chosen:
        described = describe(shares[name])
        described.pop("tags")
        listed.append(described)
    return {"quotaShares": listed, **({"nextToken": token} if token else {})}


@operation("UpdateQuotaShare")
def update_quota_share(caller: Caller, params: dict) -> dict:
    require_admin(caller, "UpdateQuotaShare")
    share = share_for(caller, params["quotaShareArn"], "quotaShareArn")
    changes: dict = {}
    if "capacityLimits" in params:
        changes["capacity_limits"] = gpu_limits(params["capacityLimits"])
    if "resourceSharingConfiguration" in params:
        changes.update(_sharing(params["resourceSharingConfiguration"]))
    if "preemptionConfiguration" in params:
        changes["in_share_preemption"] = (
            params["preemptionConfiguration"]["inSharePreemption"] == "ENABLED"
        )
    if "state" in params:
        changes["state"] = params["state"]
    try:
        share = share_update(
            share=share, actor=caller.user, source=ShareChange.Source.API, **changes
        )
    except ValidationError as error:
        raise in_aws_words(error, SHARE_FIELDS) from None
    return {"quotaShareName": share.name, "quotaShareArn": arns.quota_share_arn(share.name)}


@operation("DeleteQuotaShare")
def delete_quota_share(caller: Caller, params: dict) -> dict:
    require_admin(caller, "DeleteQuotaShare")
    share_delete(share=share_for(caller, params["quotaShareArn"], "quotaShareArn"))
    return {}

"""The AWS Batch API given odd input: each test drives the portal's
/aws/v1/<operation> through the Django test client, signed with SigV4 as botocore signs, and
reads errors as botocore's rest-json parser does (the code and message boto3's ClientError
would carry). The reference is botocore's service model for Batch and docs/aws.md."""

from __future__ import annotations

import itertools
import json

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.parsers import create_parser

from awsbatch.keys import access_key_create
from awsbatch.models import InstanceType, ServiceJob
from scheduler.models import Job
from shares.models import QuotaShare
from tests.aws.conftest import QUEUE, REGION, SEEDED_INSTANCE_TYPES
from tests.aws.test_aws_flow import training_job
from tests.conftest import make_node

pytestmark = pytest.mark.django_db

OTHER_QUEUE_SHARE = "arn:aws:batch:us-east-1:000000000000:job-queue/other-queue/quota-share/{}"
_unique = itertools.count()


@pytest.fixture
def api(client, world):
    """call(persona, operation, params) -> the Django response, signed with the persona's key."""
    for name, gpu_type, gpus in SEEDED_INSTANCE_TYPES:
        InstanceType.objects.get_or_create(name=name, defaults={"gpu_type": gpu_type, "gpus": gpus})
    make_node("review-a", "h100", 8)
    make_node("review-b", "h100", 8)
    keys = {persona: access_key_create(user=user) for persona, user in world.users.items()}

    def call(persona: str, operation: str, params: dict):
        new = keys[persona]
        body = json.dumps(params).encode()
        request = AWSRequest(method="POST", url=f"http://testserver/aws/v1/{operation}",
                             data=body, headers={"Content-Type": "application/json"})  # fmt: skip
        SigV4Auth(Credentials(new.key.access_key_id, new.secret), "batch", REGION).add_auth(request)
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-type"}
        return client.post(f"/aws/v1/{operation}", data=body, content_type="application/json",
                           headers=headers)  # fmt: skip

    return call


def error_of(response) -> tuple[int, str, str]:
    parsed = create_parser("rest-json").parse(
        {"status_code": response.status_code, "headers": dict(response.headers.items()),
         "body": response.content}, None,
    )  # fmt: skip
    return response.status_code, parsed["Error"]["Code"], parsed["Error"]["Message"]


def assert_refused(response, field: str) -> str:
    """A ClientException (400, JSON) whose message names `field`."""
    assert response.status_code == 400, (response.status_code, response.content)
    status, code, message = error_of(response)
    assert code == "ClientException", (code, message)
    assert field in message, message
    return message


def ok(response) -> dict:
    assert response.status_code == 200, (response.status_code, response.content)
    return json.loads(response.content)


def submit_params(name: str | None = None, payload: dict | None = None, **overrides) -> dict:
    name = name or f"review-{next(_unique)}"
    request = json.loads(training_job(name, "ml.p5.48xlarge"))
    for key, value in (payload or {}).items():
        request[key] = {**request.get(key, {}), **value} if isinstance(value, dict) else value
    return {"jobName": name, "jobQueue": QUEUE, "serviceJobType": "SAGEMAKER_TRAINING",
            "quotaShareName": "research", "serviceRequestPayload": json.dumps(request),
            **overrides}  # fmt: skip


def share_params(name: str, **overrides) -> dict:
    return {"quotaShareName": name, "jobQueue": QUEUE,
            "capacityLimits": [{"capacityUnit": "h100", "maxCapacity": 1}],
            "resourceSharingConfiguration": {"strategy": "LEND"},
            "preemptionConfiguration": {"inSharePreemption": "DISABLED"},
            "tags": {"team": "vision"}, **overrides}  # fmt: skip


# --- 500s -------------------------------------------------------------------------------------


def test_listing_jobs_by_every_status_aws_defines_is_answered(api, world):
    """ServiceJobStatus (botocore model) includes PENDING; a status outside the enum is a
    ClientException naming jobStatus; neither is a 500."""
    answer = ok(api("alice", "listservicejobs", {"jobStatus": "PENDING"}))
    assert answer["jobSummaryList"] == []
    assert_refused(api("alice", "listservicejobs", {"jobStatus": "BOGUS"}), "jobStatus")


@pytest.mark.parametrize("operation, params, field", [
    ("describeservicejob", {"jobId": "\u00b2"}, "jobId"),
    ("updateservicejob", {"jobId": "\u00b2", "schedulingPriority": 1}, "jobId"),
    ("terminateservicejob", {"jobId": "\u00b2", "reason": "stop"}, "jobId"),
])  # fmt: skip
def test_a_job_id_that_is_no_number_is_not_found_never_a_server_error(api, world, operation,
                                                                       params, field):  # fmt: skip
    """'²' passes str.isdigit() but is no number int() reads: not found, not a 500."""
    assert_refused(api("alice", operation, params), field)


def test_terminate_service_jobs_reports_a_bad_id_and_goes_on_with_the_others(api, world):
    job_id = ok(api("alice", "submitservicejob", submit_params()))["jobId"]
    answer = ok(api("alice", "terminateservicejobs", {"jobs": ["\u00b2", job_id],
                                                      "reason": "stop"}))  # fmt: skip
    assert answer["successful"] == [job_id]
    assert [e["job"] for e in answer["errors"]] == ["\u00b2"]


# --- Enums the validator does not check (docs/aws.md: "required members, types, enums") ------


def test_a_service_job_type_aws_does_not_have_is_refused_not_stored(api, world):
    response = api("alice", "submitservicejob", submit_params(serviceJobType="BOGUS"))
    assert_refused(response, "serviceJobType")
    assert not ServiceJob.objects.filter(service_job_type="BOGUS").exists()


def test_an_in_share_preemption_value_outside_the_enum_is_refused(api, world):
    bad = {"inSharePreemption": "MAYBE"}
    response = api("root", "createquotashare", share_params("maybe", preemptionConfiguration=bad))
    assert_refused(response, "inSharePreemption")
    assert not QuotaShare.objects.filter(name="maybe").exists()
    response = api("root", "updatequotashare", {"quotaShareArn": "research",
                                                "preemptionConfiguration": bad})  # fmt: skip
    assert_refused(response, "inSharePreemption")


# --- Successes that store something other than what was asked --------------------------------


def test_a_container_entrypoint_given_as_a_string_is_refused_not_split_into_letters(api, world):
    """A string is not a list: "python" must not become the command `p y t h o n`."""
    response = api("alice", "submitservicejob", submit_params(
        payload={"AlgorithmSpecification": {"ContainerEntrypoint": "python"}}))  # fmt: skip
    assert_refused(response, "ContainerEntrypoint")
    response = api("alice", "submitservicejob", submit_params(
        payload={"AlgorithmSpecification": {"ContainerArguments": "--steps 3"}}))  # fmt: skip
    assert_refused(response, "ContainerArguments")
    assert not Job.objects.exists()


def test_a_zero_timeout_is_refused_not_turned_into_no_timeout(api, world):
    """0, like -1, is refused naming the field: it must not mean "no timeout"."""
    response = api("alice", "submitservicejob",
                   submit_params(timeoutConfig={"attemptDurationSeconds": 0}))  # fmt: skip
    assert_refused(response, "attemptDurationSeconds")
    response = api("alice", "submitservicejob", submit_params(
        payload={"StoppingCondition": {"MaxRuntimeInSeconds": 0}}))  # fmt: skip
    assert_refused(response, "MaxRuntimeInSeconds")
    assert not Job.objects.exists()


@pytest.mark.parametrize("attempts", [0, 11])
def test_retry_attempts_outside_one_to_ten_are_refused(api, world, attempts):
    """ServiceJobRetryStrategy.attempts: "You can specify between 1 and 10 attempts."."""
    response = api("alice", "submitservicejob",
                   submit_params(retryStrategy={"attempts": attempts}))  # fmt: skip
    assert_refused(response, "retryStrategy.attempts")
    assert not Job.objects.exists()


def test_a_tag_key_longer_than_128_characters_is_refused(api, world):
    """TagrisTagsMap's key is TagKey (max 128); botocore's validator checks no max length."""
    response = api("alice", "submitservicejob", submit_params(tags={"k" * 129: "v"}))
    assert_refused(response, "tags")
    assert not Job.objects.exists()


def test_the_same_client_token_with_other_tags_is_a_conflict_not_silently_the_old_job(api, world):
    first = ok(api("alice", "submitservicejob",
                   submit_params("tok-job", clientToken="tok-1", tags={"a": "1"})))  # fmt: skip
    response = api("alice", "submitservicejob",
                   submit_params("tok-job", clientToken="tok-1", tags={"a": "2"}))  # fmt: skip
    if response.status_code == 200:
        # The answer claims the request was applied, yet its tags are not the job's.
        shown = ok(api("alice", "describeservicejob", {"jobId": first["jobId"]}))["tags"]
        assert shown == {"a": "2"}, "the second request's tags were dropped"
    else:
        assert_refused(response, "clientToken")


def test_a_quota_share_arn_of_another_job_queue_names_no_share_here(api, world):
    """The portal is one job queue: a share ARN under another queue is not found, and
    DeleteQuotaShare given one deletes nothing here (not the share of that name)."""
    arn = OTHER_QUEUE_SHARE.format("vision")
    assert_refused(api("root", "describequotashare", {"quotaShareArn": arn}), "quotaShareArn")
    assert_refused(api("root", "deletequotashare", {"quotaShareArn": arn}), "quotaShareArn")
    assert QuotaShare.objects.filter(name="vision").exists()


def test_the_termination_reason_is_shown_by_describe_service_job(api, world):
    """TerminateServiceJobRequest.reason: "This message is returned by DescribeServiceJob"."""
    job_id = ok(api("alice", "submitservicejob", submit_params()))["jobId"]
    ok(api("alice", "terminateservicejob", {"jobId": job_id, "reason": "budget exhausted"}))
    described = ok(api("alice", "describeservicejob", {"jobId": job_id}))
    assert "budget exhausted" in described["statusReason"], described["statusReason"]


# --- Pages and messages -----------------------------------------------------------------------


def test_list_quota_shares_refuses_a_token_it_did_not_give(api, world):
    """A garbage token and ListServiceJobs' token are refused, not read as the first page."""
    assert_refused(api("alice", "listquotashares", {"jobQueue": QUEUE, "nextToken": "!!!!"}),
                   "nextToken")  # fmt: skip
    for _ in range(3):
        ok(api("alice", "submitservicejob", submit_params()))
    token = ok(api("alice", "listservicejobs", {"maxResults": 1}))["nextToken"]
    assert_refused(api("alice", "listquotashares", {"jobQueue": QUEUE, "nextToken": token}),
                   "nextToken")  # fmt: skip


@pytest.mark.parametrize("overrides, field", [
    ({"quotaShareName": "bad name!"}, "quotaShareName"),
    ({"capacityLimits": [{"capacityUnit": "h100", "maxCapacity": -3}]}, "maxCapacity"),
    ({"resourceSharingConfiguration": {"strategy": "LEND_AND_BORROW", "borrowLimit": -7}},
     "borrowLimit"),
])  # fmt: skip
def test_create_quota_share_errors_name_the_field_as_aws_calls_it(api, world, overrides, field):
    """Not only the portal's model fields (`name`, `max_gpus`, `borrow_limit`), which the caller
    never sent."""
    assert_refused(api("root", "createquotashare", share_params("good", **overrides)), field)


def test_a_nul_character_is_refused_before_anything_is_stored(api, world):
    """PostgreSQL stores no NUL character: a tag holding one would fail the insert of the AWS
    fields after the job was accepted (a 500 for a job that runs)."""
    response = api("alice", "submitservicejob", submit_params(tags={"team": "a\u0000b"}))
    assert_refused(response, "tags")
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("environment", "said"),
    [({"TAG": "a\ud800"}, "a lone surrogate"), ({"1BAD": "x"}, "not a valid variable name"),
     ({"BIG": "x" * 5000}, "longer than 4096")],
)  # fmt: skip
def test_an_environment_the_rest_api_refuses_is_refused_here_too_naming_it(
    api, world, environment, said
):
    """The env rules were the REST API's serializer's only: through the AWS API a lone surrogate
    was stored (every later read of the job a 500) or refused by PostgreSQL with a 500, and a
    bad variable name reached the node. The model checks them on every way in."""
    response = api("alice", "submitservicejob", submit_params(payload={"Environment": environment}))
    message = assert_refused(response, "serviceRequestPayload.Environment")
    assert said in message, message
    assert not Job.objects.exists()

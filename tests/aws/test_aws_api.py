"""The AWS API's answers beyond the sample flow: bad input as a ClientException naming the field
(never a 500, never HTML), pages with maxResults and nextToken, filters, client tokens, the
queue snapshot, priorities and termination, the AWS CLI, and `manage.py aws_access_key`."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from awsbatch.models import AccessKey, ServiceJob
from scheduler.models import Job
from shares.models import QuotaShare
from tests.aws.conftest import QUEUE
from tests.aws.helpers import (
    instance_types,
    refused,
    sign,
    submit,
)
from tests.aws.test_aws_flow import share, training_job
from tests.live import wait_for

pytestmark = [pytest.mark.live]

AWS_CLI = Path(sys.executable).parent / "aws"


def states(job_ids: list[str]) -> list[str]:
    found = dict(Job.objects.filter(pk__in=job_ids).values_list("pk", "state"))
    return [found[int(j)] for j in job_ids]


def submit_params(name: str, **overrides) -> dict:
    return {"jobName": name, "jobQueue": QUEUE, "serviceJobType": "SAGEMAKER_TRAINING",
            "quotaShareName": "research",
            "serviceRequestPayload": training_job(name, "ml.p5.48xlarge"), **overrides}  # fmt: skip


def test_bad_input_is_a_client_exception_naming_the_field(aws, world):
    """Each bad request is a ClientException (400, JSON) whose message starts with, or names,
    the field at fault; nothing is created. A share with a running job is not deleted, and the
    job runs on; terminated, it ends CANCELLED, which AWS's client reads as FAILED."""
    instance_types()
    admin = aws.client("root", validate=False)
    extra = share("extra", "h100", 1, "LEND", team="vision")
    bad_shares = {
        "capacityLimits[0].capacityUnit": {
            **extra, "capacityLimits": [{"capacityUnit": "ml.nope.9xlarge", "maxCapacity": 1}]
        },
        "resourceSharingConfiguration.borrowLimit": {
            **extra, "resourceSharingConfiguration": {"strategy": "LEND", "borrowLimit": 50}
        },
        "jobQueue": {**extra, "jobQueue": "someone-elses-queue"},
        "jobQueue: arn:aws:batch:us-east-1:999999999999": {
            **extra, "jobQueue": "arn:aws:batch:us-east-1:999999999999:job-queue/gpu-portal"
        },
    }  # fmt: skip
    for field, params in bad_shares.items():
        message = refused(lambda params=params: admin.create_quota_share(**params))
        assert message.startswith(field), message
    missing = {k: v for k, v in extra.items() if k != "capacityLimits"}
    message = refused(lambda: admin.create_quota_share(**missing))
    assert 'Missing required parameter in input: "capacityLimits"' in message, message
    assert not QuotaShare.objects.filter(name="extra").exists()

    alice = aws.client("alice", validate=False)
    payload = json.loads(training_job("bad", "ml.p5.48xlarge"))
    no_entrypoint = {**payload, "AlgorithmSpecification": {"TrainingImage": "train:latest"}}
    bad_image = {**payload, "AlgorithmSpecification": {
        **payload["AlgorithmSpecification"], "TrainingImage": "Train Image"}}  # fmt: skip
    unknown_instance = {**payload, "ResourceConfig": {"InstanceType": "ml.nope.1xlarge"}}
    bad_jobs = [
        ("serviceRequestPayload:", submit_params("bad", serviceRequestPayload="{not json")),
        ("serviceRequestPayload.ResourceConfig.InstanceType: ml.nope.1xlarge", submit_params(
            "bad", serviceRequestPayload=json.dumps(unknown_instance))),
        ("serviceRequestPayload.AlgorithmSpecification.ContainerEntrypoint", submit_params(
            "bad", serviceRequestPayload=json.dumps(no_entrypoint))),
        ("serviceRequestPayload.AlgorithmSpecification.TrainingImage (image)", submit_params(
            "bad", serviceRequestPayload=json.dumps(bad_image))),
        ("quotaShareName", {k: v for k, v in submit_params("bad").items()
                            if k != "quotaShareName"}),
        ("schedulingPriority", submit_params("bad", schedulingPriority=10000)),
        ("schedulingPriority", submit_params("bad", schedulingPriority=-1)),
    ]  # fmt: skip
    for field, params in bad_jobs:
        message = refused(lambda params=params: alice.submit_service_job(**params))
        assert message.startswith(field), message
    missing = {k: v for k, v in submit_params("bad").items() if k != "jobName"}
    message = refused(lambda: alice.submit_service_job(**missing))
    assert 'Missing required parameter in input: "jobName"' in message, message
    assert not Job.objects.exists()

    for params in ({"maxResults": -1}, {"maxResults": 0}, {"nextToken": "not-a-token"}):
        for call in (alice.list_service_jobs, alice.list_quota_shares):
            message = refused(lambda call=call, params=params: call(jobQueue=QUEUE, **params))
            assert message.startswith(next(iter(params))), message
    beyond = base64.urlsafe_b64encode(b"9" * 30).decode()  # a job id no database holds
    assert alice.list_service_jobs(jobQueue=QUEUE, nextToken=beyond)["jobSummaryList"] == []
    message = refused(lambda: alice.list_service_jobs(filters=[{"name": "COLOUR", "values": []}]))
    assert message.startswith("filters[0].name"), message

    message = refused(lambda: admin.describe_compute_environments())
    assert message.startswith("DescribeComputeEnvironments") and "the portal does not" in message

    job_id = submit(alice, "research", "running")
    wait_for(lambda: states([job_id]) == [Job.State.RUNNING], what="the job running")
    message = refused(lambda: admin.delete_quota_share(quotaShareArn="research"))
    assert "research" in message and "not finished" in message, message
    assert states([job_id]) == [Job.State.RUNNING]
    assert alice.describe_service_job(jobId=job_id)["status"] == "RUNNING"
    for bad_priority in (10000, -5):
        message = refused(lambda p=bad_priority: alice.update_service_job(
            jobId=job_id, schedulingPriority=p))  # fmt: skip
        assert message.startswith("schedulingPriority"), message
    assert Job.objects.get(pk=job_id).priority == 0

    alice.terminate_service_job(jobId=job_id, reason="not needed")
    wait_for(lambda: states([job_id]) == [Job.State.CANCELLED], what="the job cancelled")
    detail = alice.describe_service_job(jobId=job_id)
    assert (detail["status"], detail["isTerminated"]) == ("FAILED", True)
    assert "cancel" in detail["statusReason"], detail["statusReason"]
    # By ARN this time: the same request signed within the same second would be a replay.
    research = admin.describe_quota_share(quotaShareArn="research")["quotaShareArn"]
    message = refused(lambda: admin.delete_quota_share(quotaShareArn=research))
    assert "records" in message and "DISABLED" in message, message


def test_pages_filters_client_tokens_and_the_queue(aws, world):
    """ListQuotaShares and ListServiceJobs walk every item once, a page at a time, newest job
    first; jobStatus and filters narrow the list; a client token gives one job however often it
    is sent; the snapshot shows the waiting jobs in order and each share's GPUs in use;
    UpdateServiceJob reorders; TerminateServiceJobs reports each job."""
    instance_types()
    root = aws.client("root")
    root.create_quota_share(**share("spare", "l4", 1, "RESERVE", team="vision"))
    names, token, pages = [], None, 0
    while True:
        more = {"nextToken": token} if token else {}
        page = root.list_quota_shares(jobQueue=QUEUE, maxResults=1, **more)
        names += [s["quotaShareName"] for s in page["quotaShares"]]
        pages += 1
        token = page.get("nextToken")
        if not token:
            break
    assert (pages, names) == (3, ["research", "spare", "vision"])

    alice = aws.client("alice")
    # 16 h100: the first job runs within research's limit, the second on vision's idle GPUs,
    # the other three wait.
    jobs = [submit(alice, "research", f"job-{i}") for i in range(5)]
    running, waiting = Job.State.RUNNING, Job.State.RUNNABLE
    wait_for(lambda: states(jobs) == [running, running, waiting, waiting, waiting],
             what="two jobs running, three waiting")  # fmt: skip
    pages, token = [], None
    while True:
        more = {"nextToken": token} if token else {}
        page = alice.list_service_jobs(jobQueue=QUEUE, maxResults=2, **more)
        pages.append([j["jobId"] for j in page["jobSummaryList"]])
        token = page.get("nextToken")
        if not token:
            break
    newest_first = jobs[::-1]
    assert pages == [newest_first[0:2], newest_first[2:4], newest_first[4:]]

    def listed(client=alice, **params) -> list[str]:
        return [j["jobId"] for j in client.list_service_jobs(jobQueue=QUEUE, **params)
                ["jobSummaryList"]]  # fmt: skip

    assert listed(jobStatus="RUNNING") == [jobs[1], jobs[0]]
    assert listed(jobStatus="RUNNABLE") == newest_first[:3]
    assert listed(jobStatus="SUCCEEDED") == []
    by_share = [{"name": "QUOTA_SHARE_NAME", "values": ["research"]}]
    assert listed(root, filters=by_share) == newest_first
    assert listed(root, filters=[{"name": "QUOTA_SHARE_NAME", "values": ["vision"]}]) == []
    assert listed(filters=[{"name": "JOB_NAME", "values": ["job-2"]}]) == [jobs[2]]

    snapshot = alice.get_job_queue_snapshot(jobQueue=QUEUE)
    front = [j["jobArn"].rsplit("/", 1)[1] for j in snapshot["frontOfQueue"]["jobs"]]
    assert front == jobs[2:]
    first = snapshot["frontOfQuotaShares"]["quotaShares"]["research"]
    assert [j["jobArn"].rsplit("/", 1)[1] for j in first] == [jobs[2]]
    utilization = snapshot["queueUtilization"]
    usage = {s["quotaShareName"]: {u["capacityUnit"]: u["quantity"] for u in s["capacityUsage"]}
             for s in utilization["quotaShareUtilization"]["topCapacityUtilization"]}  # fmt: skip
    assert usage["research"]["h100"] == 16.0 and usage["vision"].get("h100", 0.0) == 0.0
    assert {"capacityUnit": "h100", "quantity": 16.0} in utilization["totalCapacityUsage"]

    alice.update_service_job(jobId=jobs[4], schedulingPriority=50)
    assert Job.objects.get(pk=jobs[4]).priority == 50
    assert alice.describe_service_job(jobId=jobs[4])["schedulingPriority"] == 50
    snapshot = alice.get_job_queue_snapshot(jobQueue=QUEUE)
    front = [j["jobArn"].rsplit("/", 1)[1] for j in snapshot["frontOfQueue"]["jobs"]]
    assert front == [jobs[4], jobs[2], jobs[3]]

    once = submit_params("once", clientToken="retry-of-once")
    assert alice.submit_service_job(**once)["jobId"] == alice.submit_service_job(**once)["jobId"]
    assert Job.objects.filter(client_token="retry-of-once").count() == 1
    assert ServiceJob.objects.filter(job__client_token="retry-of-once").count() == 1
    other = {**once, "schedulingPriority": 9}
    message = refused(lambda: alice.submit_service_job(**other))
    assert message.startswith("clientToken: retry-of-once"), message
    assert Job.objects.count() == 6

    answer = alice.terminate_service_jobs(jobs=[jobs[3], "999999"], reason="tidy up")
    assert answer["successful"] == [jobs[3]]
    [error] = answer["errors"]
    assert (error["job"], error["code"]) == ("999999", "ClientException")
    assert "no job 999999" in error["message"]
    assert states([jobs[3]]) == [Job.State.CANCELLED]
    detail = alice.describe_service_job(jobId=jobs[3])
    assert (detail["status"], detail["isTerminated"]) == ("FAILED", True)
    assert "cancelled by alice" in detail["statusReason"]


def test_the_aws_cli_and_the_access_key_command(aws, world):
    """`aws batch list-quota-shares` (the AWS CLI, root's key) lists both shares; `manage.py
    aws_access_key alice` prints a key that signs, `--revoke` revokes it, and an unknown user
    or key is an error."""
    assert "list-quota-shares" in subprocess.run(
        [AWS_CLI, "batch", "help"], capture_output=True, text=True, check=True,
        env={**os.environ, "PAGER": "cat", "AWS_CONFIG_FILE": os.devnull},
    ).stdout  # fmt: skip
    key_id, secret = aws.keys["root"]
    cli = subprocess.run(
        [AWS_CLI, "batch", "list-quota-shares", "--job-queue", QUEUE,
         "--endpoint-url", aws.endpoint, "--region", "us-east-1", "--output", "json"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret,
             "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull},
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    shares = json.loads(cli.stdout)["quotaShares"]
    assert sorted(s["quotaShareName"] for s in shares) == ["research", "vision"]

    out = StringIO()
    call_command("aws_access_key", "alice", stdout=out)
    lines = out.getvalue().splitlines()
    assert [line.split("=", 1)[0] for line in lines] == [
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"
    ]  # fmt: skip
    new_id, new_secret = (line.split("=", 1)[1] for line in lines)
    assert AccessKey.objects.get(access_key_id=new_id).user == world.users["alice"]
    client = aws.client("alice", key_id=new_id, secret=new_secret)
    assert [s["quotaShareName"] for s in client.list_quota_shares(jobQueue=QUEUE)
            ["quotaShares"]] == ["research"]  # fmt: skip
    aws.keys["alice-new"] = (new_id, new_secret)
    assert sign(aws, "alice-new", "listquotashares", {"jobQueue": QUEUE}).send().ok

    call_command("aws_access_key", "alice", "--revoke", new_id, stdout=StringIO(),
                 stderr=StringIO())  # fmt: skip
    assert AccessKey.objects.get(access_key_id=new_id).revoked_at is not None
    refused(lambda: client.list_quota_shares(jobQueue=QUEUE), "UnrecognizedClientException", 403)
    with pytest.raises(CommandError, match="no user named nobody"):
        call_command("aws_access_key", "nobody", stdout=StringIO())
    with pytest.raises(CommandError, match="has no access key"):
        call_command("aws_access_key", "bob", "--revoke", new_id, stdout=StringIO())

"""The AWS API's door: SigV4 as AWS refuses it (wrong secret, unknown, revoked or inactive key,
no signature, a clock off by ten minutes, a replayed or tampered request), each with the error
code botocore raises and 403; the native API's permissions (only an admin changes shares;
another team's share or job is not found); and access keys that a copy of the database alone
cannot use."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import requests
from django.conf import settings
from django.test import override_settings

from awsbatch.keys import access_key_create, access_key_revoke, access_key_secret
from awsbatch.models import AccessKey
from awsbatch.operations.jobs import NO_SUCH_JOB
from scheduler.models import Job
from shares.models import QuotaShare
from tests.aws.conftest import QUEUE
from tests.aws.helpers import (
    botocore_error,
    instance_types,
    refused,
    sign,
    submit,
)
from tests.aws.test_aws_flow import share, training_job

INVALID_SIGNATURE = "InvalidSignatureException"
UNRECOGNIZED = "UnrecognizedClientException"
OTHER_SECRET_KEY = "another-portal-secret-key-" + "y" * 40


def forbidden(call, code: str) -> str:
    return refused(call, code, status=403)


@pytest.mark.live
def test_only_a_fresh_unseen_signature_of_an_active_key_is_accepted(aws, world):
    """A wrong secret, an unknown key id, a revoked key, an inactive user's key, a key under
    another SECRET_KEY, no signature, a request signed ten minutes ago or ahead, a request that
    changes something sent again, and a body changed under its signature are all refused
    (403, the code botocore raises); the same signer, on time, once, is answered."""
    list_shares = {"jobQueue": QUEUE}
    assert aws.client("alice").list_quota_shares(**list_shares)["quotaShares"]

    wrong_secret = aws.client("alice", secret="s" * 40)
    assert "does not match" in forbidden(
        lambda: wrong_secret.list_quota_shares(**list_shares), INVALID_SIGNATURE
    )
    unknown = aws.client("alice", key_id="AKIA" + "Q" * 16)
    forbidden(lambda: unknown.list_quota_shares(**list_shares), UNRECOGNIZED)

    carol = aws.client("carol")
    carol.list_quota_shares(**list_shares)
    access_key_revoke(key=AccessKey.objects.get(access_key_id=aws.keys["carol"][0]))
    forbidden(lambda: carol.list_quota_shares(**list_shares), UNRECOGNIZED)

    bob = world.users["bob"]
    bob.is_active = False
    bob.save(update_fields=["is_active"])
    forbidden(lambda: aws.client("bob").list_quota_shares(**list_shares), UNRECOGNIZED)

    # A key whose secret was encrypted under another SECRET_KEY: the portal cannot read it.
    with override_settings(SECRET_KEY=OTHER_SECRET_KEY, SECRET_KEY_FALLBACKS=[]):
        foreign = access_key_create(user=world.users["alice"])
    foreign_client = aws.client("alice", key_id=foreign.key.access_key_id, secret=foreign.secret)
    forbidden(lambda: foreign_client.list_quota_shares(**list_shares), UNRECOGNIZED)

    unsigned = requests.post(f"{aws.endpoint}/v1/listquotashares", json=list_shares, timeout=10)
    assert unsigned.status_code == 403
    assert botocore_error(unsigned)[0] == "MissingAuthenticationTokenException"

    # Signed by hand with a chosen time: now is answered, ten minutes off either way is not.
    now = datetime.now(UTC)
    assert sign(aws, "alice", "listquotashares", list_shares, at=now).send().status_code == 200
    for moment, says in ((now - timedelta(minutes=10), "expired"),
                         (now + timedelta(minutes=10), "not yet current")):  # fmt: skip
        response = sign(aws, "alice", "listquotashares", list_shares, at=moment).send()
        assert response.status_code == 403
        code, message = botocore_error(response)
        assert code == INVALID_SIGNATURE and says in message, message

    # A read may be sent twice (SigV4 has no nonce; a poller signs alike within a second).
    twice = sign(aws, "alice", "listquotashares", list_shares)
    assert [twice.send().status_code, twice.send().status_code] == [200, 200]

    # A request that changes something is answered once.
    instance_types()
    alice = aws.client("alice")
    job_id = submit(alice, "research", "replayed", "ml.test.h100x1")
    update = sign(aws, "alice", "updateservicejob", {"jobId": job_id, "schedulingPriority": 7})
    assert update.send().status_code == 200
    assert Job.objects.get(pk=job_id).priority == 7
    alice.update_service_job(jobId=job_id, schedulingPriority=3)
    replayed = update.send()
    assert replayed.status_code == 403
    code, message = botocore_error(replayed)
    assert code == INVALID_SIGNATURE and "replayed" in message, message
    assert Job.objects.get(pk=job_id).priority == 3

    # A body changed under a valid signature.
    tampered = sign(aws, "alice", "updateservicejob", {"jobId": job_id, "schedulingPriority": 8})
    response = tampered.send(tampered.body.replace(b"8", b"9"))
    assert response.status_code == 403 and botocore_error(response)[0] == INVALID_SIGNATURE
    assert Job.objects.get(pk=job_id).priority == 3
    terminate = sign(aws, "alice", "terminateservicejob", {"jobId": job_id, "reason": "done"})
    assert [terminate.send().status_code, terminate.send().status_code] == [200, 403]

    # A submit without a clientToken is answered once; with one, it may come again (botocore
    # retries with the same token, signed alike within a second) and gives the same job.
    params = {"jobName": "again", "jobQueue": QUEUE, "serviceJobType": "SAGEMAKER_TRAINING",
              "quotaShareName": "research",
              "serviceRequestPayload": training_job("again", "ml.test.h100x1")}  # fmt: skip
    untokened = sign(aws, "alice", "submitservicejob", params)
    assert [untokened.send().status_code, untokened.send().status_code] == [200, 403]
    tokened = sign(aws, "alice", "submitservicejob", {**params, "clientToken": "again-1"})
    answers = [tokened.send(), tokened.send()]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json()["jobId"] == answers[1].json()["jobId"]
    assert Job.objects.filter(name="again").count() == 2  # the untokened one, the tokened one


@pytest.mark.live
def test_members_see_and_change_only_what_their_team_and_role_allow(aws, world):
    """alice (a lead, not an admin) cannot create, change or delete a share; she cannot see or
    submit to vision (not found, like a share that does not exist); oscar, on no team, finds
    none of her jobs (not found, like a job id that does not exist); bob, on her team, submits
    to research and sees her job."""
    instance_types()
    alice = aws.client("alice")
    changes = {
        "CreateQuotaShare": lambda: alice.create_quota_share(
            **share("alices", "h100", 1, "LEND", team="ml-research")
        ),
        "UpdateQuotaShare": lambda: alice.update_quota_share(
            quotaShareArn="research", state="DISABLED"
        ),
        "DeleteQuotaShare": lambda: alice.delete_quota_share(quotaShareArn="research"),
    }
    for name, call in changes.items():
        message = refused(call)
        assert message.startswith(name) and "only an admin" in message, message
    assert sorted(QuotaShare.objects.values_list("name", "state")) == [
        ("research", "ENABLED"), ("vision", "ENABLED")
    ]  # fmt: skip

    not_found = refused(lambda: alice.describe_quota_share(quotaShareArn="vision"))
    assert "no quota share vision" in not_found
    assert refused(lambda: alice.describe_quota_share(quotaShareArn="nowhere")) == (
        not_found.replace("vision", "nowhere")
    )
    listed = alice.list_quota_shares(jobQueue=QUEUE)["quotaShares"]
    assert [s["quotaShareName"] for s in listed] == ["research"]
    message = refused(lambda: submit(alice, "vision", "not-mine", "ml.test.h100x1"))
    assert "no quota share vision" in message
    assert not Job.objects.filter(share__name="vision").exists()

    job_id = submit(alice, "research", "alices", "ml.test.h100x1")
    oscar = aws.client("oscar")
    for job in (job_id, "999999"):
        message = refused(lambda job=job: oscar.describe_service_job(jobId=job))
        assert message == NO_SUCH_JOB.format(job_id=job, queue=QUEUE)
    assert oscar.list_service_jobs(jobQueue=QUEUE)["jobSummaryList"] == []
    assert oscar.list_quota_shares(jobQueue=QUEUE)["quotaShares"] == []
    refused(lambda: oscar.terminate_service_job(jobId=job_id, reason="not mine"))
    refused(lambda: aws.client("carol").describe_service_job(jobId=job_id))
    assert not Job.objects.get(pk=job_id).cancel_requested
    assert Job.objects.get(pk=job_id).state not in Job.FINAL_STATES

    bob = aws.client("bob")
    bobs = submit(bob, "research", "bobs", "ml.test.h100x1")
    seen = bob.list_service_jobs(jobQueue=QUEUE)["jobSummaryList"]
    assert [j["jobId"] for j in seen] == [bobs, job_id]
    assert bob.describe_service_job(jobId=job_id)["jobName"] == "alices"
    assert refused(lambda: bob.delete_quota_share(quotaShareArn="research")).startswith(
        "DeleteQuotaShare"
    )
    everyone = aws.client("root").list_service_jobs(jobQueue=QUEUE)["jobSummaryList"]
    assert {j["jobId"] for j in everyone} == {bobs, job_id}


@pytest.mark.django_db
def test_a_copy_of_the_database_alone_cannot_sign(world):
    """The secret is stored only encrypted; with another SECRET_KEY it cannot be recovered,
    unless the old key stays in SECRET_KEY_FALLBACKS."""
    new = access_key_create(user=world.users["alice"])
    row = AccessKey.objects.filter(pk=new.key.pk).values().get()
    assert all(new.secret not in str(value) for value in row.values())
    key = AccessKey.objects.get(pk=new.key.pk)
    assert access_key_secret(key) == new.secret
    with override_settings(SECRET_KEY=OTHER_SECRET_KEY, SECRET_KEY_FALLBACKS=[]):
        assert access_key_secret(key) is None
    with override_settings(SECRET_KEY=OTHER_SECRET_KEY,
                           SECRET_KEY_FALLBACKS=[settings.SECRET_KEY]):  # fmt: skip
        assert access_key_secret(key) == new.secret

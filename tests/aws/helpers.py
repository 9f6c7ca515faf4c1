"""What the AWS API tests share: requests signed by hand (a chosen time, bytes sent as they
are), botocore's reading of an error response, and the refusals as botocore raises them."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from botocore.parsers import create_parser

from awsbatch.models import InstanceType
from tests.aws.conftest import QUEUE, REGION, AwsPortal
from tests.aws.test_aws_flow import training_job

AMZ_DATE = "%Y%m%dT%H%M%SZ"


@dataclass(frozen=True)
class Signed:
    """A request signed once: its URL, headers (Authorization included) and body bytes."""

    url: str
    headers: dict[str, str]
    body: bytes

    def send(self, body: bytes | None = None) -> requests.Response:
        """Send these bytes (or `body` under this signature) as they are."""
        return requests.post(self.url, data=self.body if body is None else body,
                             headers=self.headers, timeout=10)  # fmt: skip


def sign(
    aws: AwsPortal, persona: str, path: str, params: dict, *, at: datetime | None = None
) -> Signed:
    """`POST /aws/v1/<path>` signed with `persona`'s key by botocore's SigV4Auth, as at `at`
    (now by default): what `SigV4Auth.add_auth` does, with the timestamp chosen."""
    key_id, secret = aws.keys[persona]
    body = json.dumps(params).encode()
    request = AWSRequest(method="POST", url=f"{aws.endpoint}/v1/{path}", data=body,
                         headers={"Content-Type": "application/json"})  # fmt: skip
    timestamp = (at or datetime.now(UTC)).strftime(AMZ_DATE)
    request.context["timestamp"] = timestamp
    request.headers["X-Amz-Date"] = timestamp
    auth = SigV4Auth(Credentials(key_id, secret), "batch", REGION)
    signature = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)),
                               request)  # fmt: skip
    signed_headers = auth.signed_headers(auth.headers_to_sign(request))
    request.headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={auth.scope(request)}, SignedHeaders={signed_headers}, "
        f"Signature={signature}"
    )
    return Signed(url=request.url, headers=dict(request.headers.items()), body=body)


def botocore_error(response: requests.Response) -> tuple[str, str]:
    """(code, message) as botocore reads the error response (rest-json)."""
    assert response.status_code >= 400, response.text
    assert response.headers["content-type"].startswith("application/json"), response.text
    parsed = create_parser("rest-json").parse(
        {"status_code": response.status_code, "headers": response.headers,
         "body": response.content}, None,
    )  # fmt: skip
    return parsed["Error"]["Code"], parsed["Error"]["Message"]


def refused(call: Callable[[], object], code: str = "ClientException", status: int = 400) -> str:
    """The message of the ClientError that `call` raises, after checking its code, its HTTP
    status and that the body was JSON (never an HTML page, never a 500)."""
    with pytest.raises(ClientError) as raised:
        call()
    response = raised.value.response
    meta = response["ResponseMetadata"]
    assert (response["Error"]["Code"], meta["HTTPStatusCode"]) == (code, status), response
    assert meta["HTTPHeaders"]["content-type"].startswith("application/json"), response
    return response["Error"]["Message"]


def instance_types() -> None:
    """The tests' own instance types, beside those the seed migration made (conftest.py)."""
    for name, gpu_type, gpus in TEST_INSTANCE_TYPES:
        InstanceType.objects.get_or_create(name=name, defaults={"gpu_type": gpu_type, "gpus": gpus})


TEST_INSTANCE_TYPES = [("ml.test.h100x1", "h100", 1)]


def submit(client, share: str, name: str, instance: str = "ml.p5.48xlarge", *, steps: int = 600,
           **params) -> str:  # fmt: skip
    """SubmitServiceJob of the demo job (`steps` × 0.1 s); its jobId."""
    return client.submit_service_job(
        jobName=name, jobQueue=QUEUE, serviceJobType="SAGEMAKER_TRAINING", quotaShareName=share,
        serviceRequestPayload=training_job(name, instance, steps), **params,
    )["jobId"]  # fmt: skip

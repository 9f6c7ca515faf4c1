"""Signature Version 4, verified: the request's signature is computed again with botocore's own
signer (`SigV4Auth`) from the secret of the access key it names, and compared. Refused, with
the error code an AWS client expects (403): a request not signed, an unknown or revoked key
(UnrecognizedClientException), a wrong signature, one older (or newer) than five minutes, and
one seen before (InvalidSignatureException)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import redis
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from awsbatch.errors import (
    INVALID_SIGNATURE,
    MISSING_AUTHENTICATION,
    UNRECOGNIZED_CLIENT,
    forbidden,
)
from awsbatch.keys import access_key_secret, active_key
from awsbatch.models import AccessKey
from portal.redis import redis_client

logger = logging.getLogger(__name__)

SERVICE = "batch"
ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = timedelta(minutes=5)
AMZ_DATE = "%Y%m%dT%H%M%SZ"
# Seen signatures are kept this long: a request older than MAX_SKEW is refused anyway.
REPLAY_KEY = "portal:{db}:aws:signature:{signature}"

NOT_SIGNED = "Missing Authentication Token: sign the request with SigV4 (an access key)."
MALFORMED = "Authorization: not a SigV4 header ({detail})."
UNKNOWN_KEY = (
    "The security token included in the request is invalid: no such access key, or it was revoked."
)
BAD_SIGNATURE = (
    "The request signature we calculated does not match the signature you provided. Check "
    "your AWS Secret Access Key and signing method."
)
EXPIRED = "Signature expired: {date} is now earlier than {limit} (5 minutes ago)."
NOT_YET = "Signature not yet current: {date} is still later than {limit} (5 minutes from now)."
REPLAYED = "Signature already used: this request was received before (replayed)."
BODY_HASH = "X-Amz-Content-SHA256 does not match the request's body."

_HEADER = re.compile(
    rf"{ALGORITHM} Credential=(?P<credential>[^,\s]+),\s*SignedHeaders=(?P<signed>[^,\s]+),"
    r"\s*Signature=(?P<signature>[0-9a-f]{64})$"
)


@dataclass(frozen=True)
class Signed:
    """A verified request: who signed it, with which key and region."""

    key: AccessKey
    region: str


def verify(
    *, method: str, host: str, path: str, headers, body: bytes, now: datetime, replay_check: bool
) -> Signed:
    """Verify a request's SigV4 signature; raise AwsError (403) if it does not hold.
    `replay_check`: refuse a signature seen before. SigV4 has no nonce, so a client that sends
    the same request twice within a second signs it the same: only requests that would change
    something if received twice are checked (awsbatch.views says which: not a read, whose
    replay shows what its signer could read anyway, nor a SubmitServiceJob with a clientToken,
    whose replay gives the same job)."""
    authorization = headers.get("Authorization", "")
    if not authorization:
        raise forbidden(MISSING_AUTHENTICATION, NOT_SIGNED)
    match = _HEADER.match(authorization.strip())
    if match is None:
        raise forbidden(INVALID_SIGNATURE, MALFORMED.format(detail="AWS4-HMAC-SHA256 "
                        "Credential=..., SignedHeaders=..., Signature=..."))  # fmt: skip
    parts = match["credential"].split("/")
    if len(parts) != 5 or parts[3] != SERVICE or parts[4] != "aws4_request":
        raise forbidden(INVALID_SIGNATURE, MALFORMED.format(detail="Credential must be "
                        "KEY/DATE/REGION/batch/aws4_request"))  # fmt: skip
    key_id, scope_date, region = parts[0], parts[1], parts[2]
    signed_headers = match["signed"].split(";")
    if "host" not in signed_headers or "x-amz-date" not in signed_headers:
        raise forbidden(INVALID_SIGNATURE, MALFORMED.format(detail="host and x-amz-date must "
                        "be signed"))  # fmt: skip
    amz_date = headers.get("X-Amz-Date", "")
    try:
        signed_at = datetime.strptime(amz_date, AMZ_DATE).replace(tzinfo=UTC)
    except ValueError:
        raise forbidden(INVALID_SIGNATURE, MALFORMED.format(detail="X-Amz-Date must be "
                        "YYYYMMDDTHHMMSSZ")) from None  # fmt: skip
    if scope_date != amz_date[:8]:
        raise forbidden(INVALID_SIGNATURE, MALFORMED.format(detail="the credential's date is "
                        "not X-Amz-Date's"))  # fmt: skip
    if signed_at < now - MAX_SKEW:
        raise forbidden(INVALID_SIGNATURE, EXPIRED.format(
            date=amz_date, limit=(now - MAX_SKEW).strftime(AMZ_DATE)))  # fmt: skip
    if signed_at > now + MAX_SKEW:
        raise forbidden(INVALID_SIGNATURE, NOT_YET.format(
            date=amz_date, limit=(now + MAX_SKEW).strftime(AMZ_DATE)))  # fmt: skip
    key = active_key(key_id)
    secret = access_key_secret(key) if key is not None else None
    if key is None or secret is None:
        raise forbidden(UNRECOGNIZED_CLIENT, UNKNOWN_KEY)
    content_hash = headers.get("X-Amz-Content-SHA256")
    if content_hash not in (None, "", "UNSIGNED-PAYLOAD") and not hmac.compare_digest(
        content_hash, hashlib.sha256(body).hexdigest()
    ):
        raise forbidden(INVALID_SIGNATURE, BODY_HASH)
    expected = _signature(method=method, host=host, path=path, headers=headers, body=body,
                          signed_headers=signed_headers, key_id=key_id, secret=secret,
                          region=region, amz_date=amz_date)  # fmt: skip
    if not hmac.compare_digest(expected, match["signature"]):
        raise forbidden(INVALID_SIGNATURE, BAD_SIGNATURE)
    if replay_check:
        _refuse_replay(match["signature"])
    return Signed(key=key, region=region)


def _signature(*, method, host, path, headers, body, signed_headers, key_id, secret, region,
               amz_date) -> str:  # fmt: skip
    """The signature botocore's signer gives the request as received, with only the headers
    it says were signed."""
    signed = {}
    for name in signed_headers:
        signed[name] = host if name == "host" else headers.get(name, "")
    request = AWSRequest(method=method, url=f"http://{host}{path}", data=body, headers=signed)
    request.context["timestamp"] = amz_date
    auth = SigV4Auth(Credentials(key_id, secret), SERVICE, region)
    canonical = auth.canonical_request(request)
    return auth.signature(auth.string_to_sign(request, canonical), request)


def _refuse_replay(signature: str) -> None:
    """A signature is accepted once: remembered in Redis for the time a request is valid.
    Without Redis the check is skipped (logged): signed requests still expire after five
    minutes, and refusing every request would stop the API altogether."""
    try:
        client = redis_client()
        db = client.connection_pool.connection_kwargs.get("db", 0)
        first = client.set(REPLAY_KEY.format(db=db, signature=signature), b"1", nx=True,
                           ex=int(MAX_SKEW.total_seconds() * 2))  # fmt: skip
    except redis.RedisError:
        logger.warning("Redis unreachable: replayed AWS requests cannot be refused", exc_info=True)
        return
    if not first:
        raise forbidden(INVALID_SIGNATURE, REPLAYED)

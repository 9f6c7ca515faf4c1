"""`POST /aws/v1/<operation>`: the AWS Batch API (rest-json, SigV4) for boto3 and the AWS CLI
pointed at the portal (`endpoint_url="https://PORTAL/aws"`). Each request: its signature
verified, its body checked against the operation's input shape from botocore's model, then
its handler (awsbatch.operations) run. Errors follow the protocol (awsbatch.errors); bad input
is a ClientException naming the field, never a 500 or an HTML page."""

from __future__ import annotations

import contextlib
import json
import logging
import uuid

from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from awsbatch import service, sigv4
from awsbatch.errors import SERVER, AwsError, client_error, error_response
from awsbatch.keys import access_key_used
from awsbatch.operations import Caller, handler_for

logger = logging.getLogger(__name__)

BODY_NOT_JSON = "body: must be a JSON object (rest-json)."
POST_ONLY = "{method}: AWS Batch operations are POST requests."
READS = ("Describe", "List", "Get")  # operations that change nothing
# Operations whose request, sent again with the same clientToken, gives the same result.
IDEMPOTENT_BY_TOKEN = ("SubmitServiceJob",)
_NOT_JSON = object()
INTERNAL = "The portal failed to answer; it logged the error (request id {request_id})."


@csrf_exempt
def operation(request: HttpRequest, path: str) -> HttpResponse:
    request_id = str(uuid.uuid4())
    try:
        if request.method != "POST":
            raise AwsError(POST_ONLY.format(method=request.method), status=405)
        op = service.operation_for(f"/v1/{path}")
        body = request.body
        try:
            params = json.loads(body or b"{}")
        except (ValueError, UnicodeDecodeError, RecursionError):
            params = _NOT_JSON  # said once the signature holds
        signed = sigv4.verify(method=request.method, host=request.get_host(),
                              path=request.get_full_path(), headers=request.headers, body=body,
                              now=timezone.now(),
                              replay_check=_changes_something(op.name, params))  # fmt: skip
        if params is _NOT_JSON:
            raise client_error(BODY_NOT_JSON)
        params = service.validate(op, params)
        handler, atomic = handler_for(op.name)
        if handler is None:
            raise client_error(service.NOT_SUPPORTED.format(operation=op.name))
        access_key_used(key=signed.key)
        caller = Caller(user=signed.key.user, region=signed.region)
        with transaction.atomic() if atomic else contextlib.nullcontext():
            result = handler(caller, params)
    except AwsError as error:
        return error_response(error, request_id)
    except ValidationError as error:
        return error_response(client_error(_validation_message(error)), request_id)
    except Exception:
        logger.exception("AWS API %s failed (request id %s)", path, request_id)
        error = AwsError(INTERNAL.format(request_id=request_id), code=SERVER, status=500)
        return error_response(error, request_id)
    response = HttpResponse(json.dumps(result), content_type="application/json")
    response["x-amzn-RequestId"] = request_id
    return response


def _changes_something(operation: str, params: object) -> bool:
    """Whether receiving the request twice could change more than receiving it once, so that
    a replayed signature must be refused. Not a read; not a SubmitServiceJob with a
    clientToken: sent again it gives the same job. botocore retries a request with the body it
    first sent (the same token) and signs the retry anew, alike within the same second: were
    that retry refused as a replay, a client whose answer was lost could not learn its job."""
    if operation.startswith(READS):
        return False
    if operation in IDEMPOTENT_BY_TOKEN and isinstance(params, dict):
        return not params.get("clientToken")
    return True


def _validation_message(error: ValidationError) -> str:
    """The portal's own rule, as its services state it, naming the field."""
    if hasattr(error, "message_dict"):
        return " ".join(
            message if message.startswith(f"{field}:") else f"{field}: {message}"
            for field, messages in error.message_dict.items()
            for message in messages
        )
    return " ".join(error.messages)

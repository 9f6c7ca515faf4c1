"""Errors as the rest-json protocol carries them, so that botocore raises ClientError with the
right code: the code in the `x-amzn-ErrorType` header and in the body's `__type`, the message in
the body's `message`."""

from __future__ import annotations

import json

from django.core.exceptions import ValidationError
from django.http import HttpResponse

CLIENT = "ClientException"  # 400: bad input, something that does not exist, not allowed
SERVER = "ServerException"  # 500: a fault of the portal's
UNRECOGNIZED_CLIENT = "UnrecognizedClientException"  # 403: unknown or revoked access key
INVALID_SIGNATURE = "InvalidSignatureException"  # 403: bad, expired or replayed signature
MISSING_AUTHENTICATION = "MissingAuthenticationTokenException"  # 403: not signed at all
UNKNOWN_OPERATION = "UnknownOperationException"  # 404


class AwsError(Exception):
    def __init__(self, message: str, *, code: str = CLIENT, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message


def client_error(message: str) -> AwsError:
    return AwsError(message, code=CLIENT, status=400)


def forbidden(code: str, message: str) -> AwsError:
    return AwsError(message, code=code, status=403)


def error_response(error: AwsError, request_id: str) -> HttpResponse:
    body = json.dumps({"__type": error.code, "message": error.message})
    response = HttpResponse(body, status=error.status, content_type="application/json")
    response["x-amzn-ErrorType"] = error.code
    response["x-amzn-RequestId"] = request_id
    return response


def in_aws_words(error: ValidationError, fields: dict[str, str]) -> AwsError:
    """A rule of the portal's, naming the request's field as AWS calls it (`fields`: the
    portal's field → the request's), the portal's own name beside it."""
    messages = getattr(error, "message_dict", {"": error.messages})
    return client_error(" ".join(
        f"{fields.get(field, field)} ({field}): {message.removeprefix(f'{field}: ')}"
        if field
        else message
        for field, items in messages.items()
        for message in items
    ))  # fmt: skip

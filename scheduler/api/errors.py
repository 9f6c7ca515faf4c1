"""Every bad request gets a clear 4xx: Django's ValidationError from services becomes a DRF 400
keeping field names and messages; an idempotency conflict a 409; an oversized body a 413."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import exceptions, status
from rest_framework.exceptions import ErrorDetail
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import exception_handler

from scheduler.jobs.services import ClientTokenConflict
from scheduler.models import LONE_SURROGATE_RE

BODY_TOO_LARGE = (
    "request body is {size} bytes; the limit is {limit} bytes (command and env are capped too: "
    "see the API documentation)."
)


JSON_TOO_DEEP = "JSON parse error - the body nests arrays or objects too deeply."
BODY_NOT_AN_OBJECT = "body: must be a JSON object of named fields, not {what}."
BODY_EMPTY = "body: is empty or null; send a JSON object of named fields."
# What DRF says of a body that is no JSON object ("... but got list.") or is none at all.
_DRF_NOT_AN_OBJECT = str(Serializer.default_error_messages["invalid"]).split("{", 1)[0]
_DRF_NO_DATA = "No data provided"
_JSON_KINDS = {"list": "an array", "str": "a string", "int": "a number", "float": "a number",
               "bool": "true or false"}  # fmt: skip


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "request body too large."
    default_code = "payload_too_large"


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "conflict."
    default_code = "conflict"


def _too_large(request) -> PayloadTooLarge | None:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        size = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        size = 0
    if limit is not None and size > limit:
        return PayloadTooLarge(BODY_TOO_LARGE.format(size=size, limit=limit))
    return None


class SizeLimitedJSONParser(JSONParser):
    """DRF may read a JSON body straight from the stream, without Django's
    DATA_UPLOAD_MAX_MEMORY_SIZE check: refuse an oversized body before reading it."""

    def parse(self, stream, media_type=None, parser_context=None):
        request = (parser_context or {}).get("request")
        if request is not None and (error := _too_large(request)) is not None:
            raise error
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            # Nesting deeper than the JSON parser's stack ("[[[[..."): bad input, not a crash.
            raise exceptions.ParseError(JSON_TOO_DEEP) from None


def django_validation_detail(error: DjangoValidationError) -> dict[str, list[str]]:
    if hasattr(error, "error_dict"):
        return {
            ("non_field_errors" if field == "__all__" else field): messages
            for field, messages in error.message_dict.items()
        }
    return {"non_field_errors": error.messages}


# Keys of a 400's body that name no field.
NOT_FIELDS = ("non_field_errors", "detail")


def _about_the_body(detail):
    """DRF's words for a body that is not a JSON object, or is empty, in the API's words."""
    text = str(detail)
    if text.startswith(_DRF_NOT_AN_OBJECT):
        kind = text[len(_DRF_NOT_AN_OBJECT) :].rstrip(".")
        return ErrorDetail(BODY_NOT_AN_OBJECT.format(what=_JSON_KINDS.get(kind, kind)), "invalid")
    if text == _DRF_NO_DATA:
        return ErrorDetail(BODY_EMPTY, "null")
    return detail


def _named(field: str, detail):
    """Each message under `field` begins with "field: ", as the API's own messages do, so
    that one DRF writes itself ("A valid integer is required.") names its field too."""
    if isinstance(detail, list):
        return [_named(field, item) for item in detail]
    if isinstance(detail, dict):
        return {key: _named(field, value) for key, value in detail.items()}
    if str(detail).startswith(f"{field}:"):
        return detail
    return ErrorDetail(f"{field}: {detail}", code=getattr(detail, "code", None))


def _encodable(detail):
    """`detail` with every lone surrogate written as its escape ("\\ud800"): a name or value the
    error repeats from the request (a field a job does not have) may hold one, which JSON can
    escape but no UTF-8 answer can carry, and the answer was a 500."""
    if isinstance(detail, list):
        return [_encodable(item) for item in detail]
    if isinstance(detail, dict):
        return {_encodable(key): _encodable(value) for key, value in detail.items()}
    if isinstance(detail, str) and LONE_SURROGATE_RE.search(detail):
        text = detail.encode("utf-8", "backslashreplace").decode("utf-8")
        return ErrorDetail(text, code=getattr(detail, "code", None))
    return detail


def api_exception_handler(exc, context):
    if isinstance(exc, RequestDataTooBig):
        # Django's own check fired first (the body was already read): same 413.
        exc = _too_large(context["request"]) or PayloadTooLarge()
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(django_validation_detail(exc))
    elif isinstance(exc, ClientTokenConflict):
        return Response(
            {"client_token": [str(exc)], "job_id": exc.job.pk}, status=status.HTTP_409_CONFLICT
        )
    if isinstance(exc, exceptions.ValidationError) and isinstance(exc.detail, dict):
        exc.detail = {
            key: value if key in NOT_FIELDS else _named(key, value)
            for key, value in exc.detail.items()
        }
        if isinstance(exc.detail.get("non_field_errors"), list):
            exc.detail["non_field_errors"] = [
                _about_the_body(item) for item in exc.detail["non_field_errors"]
            ]
    if isinstance(exc, exceptions.APIException):
        exc.detail = _encodable(exc.detail)
    return exception_handler(exc, context)

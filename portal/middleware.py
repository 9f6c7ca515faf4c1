"""Answer 503 with a JSON body while the database is unreachable, instead of a 500 page."""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, JsonResponse
from django.utils.deprecation import MiddlewareMixin

logger = logging.getLogger(__name__)

DATABASE_UNAVAILABLE = "the database is unavailable; nothing was changed, retry later."
RETRY_AFTER_SECONDS = 5


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """A view (the REST API, the agent API, the admin) that fails because the database is down
    or its connection broke gets 503 + Retry-After, so clients and agents retry rather than
    treat it as a bug. Whatever the view had written in its transaction was rolled back by the
    database; nothing reported as accepted (2xx) is lost."""

    def process_exception(self, request: HttpRequest, exception: Exception):
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        return database_unavailable(request, exception)


def database_unavailable(request: HttpRequest, exception: Exception) -> JsonResponse:
    """503 + Retry-After: the database is down or the connection broke; nothing was changed."""
    logger.warning("database unavailable for %s %s: %s", request.method, request.path,
                   exception)  # fmt: skip
    response = JsonResponse(
        {"detail": DATABASE_UNAVAILABLE, "code": "database_unavailable"}, status=503
    )
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response

"""The portal's middleware, each usable by the WSGI and the ASGI server alike: an async view
(the agents' long poll) must not pass through a sync-only middleware, which would hold a thread
for the whole of its wait. Static files (WhiteNoise) and a 503 while the database is down."""

from __future__ import annotations

import logging

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from whitenoise.middleware import WhiteNoiseMiddleware

logger = logging.getLogger(__name__)

DATABASE_UNAVAILABLE = "the database is unavailable; nothing was changed, retry later."
RETRY_AFTER_SECONDS = 5


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise's middleware (static files served by the portal itself), in the mode of the
    server: WhiteNoise's own is sync only."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response, *args, **kwargs) -> None:
        super().__init__(get_response, *args, **kwargs)
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self.__acall__(request)
        return super().__call__(request)

    async def __acall__(self, request: HttpRequest):
        if self.autorefresh:  # DEBUG: looks on disk
            static_file = await sync_to_async(self.find_file)(request.path_info)
        else:
            static_file = self.files.get(request.path_info)
        if static_file is not None:
            return await sync_to_async(self.serve)(static_file, request)
        return await self.get_response(request)


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

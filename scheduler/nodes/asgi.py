"""The agent endpoints under the production server (ASGI), served beside Django's request
handling rather than through it.

Django's request handling runs every request's steps (its `request_started` receivers, each
middleware) on a thread: a long poll that waits 20 s would hold a thread all that while, and a
thousand waiting agents a thousand threads. The agent endpoints need none of those steps: they
authenticate with their node token (no session, no CSRF), answer JSON, and do their database work
on the shared database threads (`portal.db.threads`). So requests under /api/v1/agent/ are
routed here, to the same views (async), and everything else to the rest of the portal."""

from __future__ import annotations

import logging

from django.core.exceptions import RequestAborted, RequestDataTooBig
from django.core.handlers.asgi import ASGIHandler
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse
from django.urls import Resolver404, resolve

from portal.db.threads import GaveUp
from portal.middleware import database_unavailable
from scheduler.nodes import views

logger = logging.getLogger(__name__)

PREFIX = "/api/v1/agent/"
GAVE_UP = (
    "the portal could not begin this request before its agent gave up waiting for the answer;"
    " send it again"
)
VIEWS = frozenset(
    (
        views.register, views.poll, views.start, views.report,
        views.connector_register, views.connector_poll, views.connector_start,
        views.connector_report,
    )
)  # fmt: skip


class AgentEndpoints:
    """ASGI application: the agent endpoints here, anything else to `rest` (an ASGI
    application). Requests are read and answered with Django's ASGI request and response
    handling (`ASGIHandler`'s), without its middleware and signals."""

    def __init__(self, rest) -> None:
        self.rest = rest
        self.django = ASGIHandler()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.rest(scope, receive, send)
            return
        try:
            body = await self.django.read_body(receive)
        except RequestAborted:  # the agent went away before it sent its body
            return
        try:
            response = await self._answer(scope, body)
        finally:
            body.close()
        await self.django.send_response(response, send)

    async def _answer(self, scope, body) -> HttpResponse:
        try:
            request = self.django.request_class(scope, body)
            match = resolve(request.path_info)
        except Resolver404:
            return JsonResponse({"detail": "no such agent endpoint"}, status=404)
        except (UnicodeDecodeError, RequestDataTooBig):
            return JsonResponse({"body": "body: too large, or not UTF-8."}, status=400)
        if match.func not in VIEWS:
            return JsonResponse({"detail": "no such agent endpoint"}, status=404)
        try:
            return await match.func(request)
        except GaveUp:  # no one reads this: the agent sends its request again
            return JsonResponse({"detail": GAVE_UP}, status=503)
        except (OperationalError, InterfaceError) as error:
            return database_unavailable(request, error)
        except Exception:
            logger.exception("agent endpoint %s failed", request.path)
            return JsonResponse({"detail": "internal error; the portal logged it."}, status=500)

"""The agent's HTTP client: JSON POSTs to the portal, over one kept-alive connection per thread
(the poller's long poll and the main thread's reports go side by side).

The standard library's http.client rather than requests: a report costs the agent a fraction of
the CPU, and an agent starts without importing requests (bench/soak.py runs 64 agents on two
cores). What requests did that this must do too: reconnect when the portal closed an idle
kept-alive connection, and turn every failure to reach the portal into one exception."""

from __future__ import annotations

import http.client
import json
import logging
import select
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

logger = logging.getLogger("scheduler.agent")


class PortalUnreachable(Exception):
    """The request did not get an answer (refused, reset, timed out, broken answer)."""


@dataclass
class Response:
    status_code: int
    content: bytes

    def json(self):
        return json.loads(self.content)

    def answer(self) -> dict | None:
        """The JSON object the portal answered; None for a body that is none (a proxy's page
        in front of the portal, sent with 200), which the caller takes as a failed request."""
        try:
            body = json.loads(self.content)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            logger.warning("answered with no JSON object (%s): %s", self.status_code,
                           self.text[:200])  # fmt: skip
            return None
        return body

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")


def _closed_by_peer(connection: http.client.HTTPConnection) -> bool:
    """Whether the server closed the idle connection (it is readable: EOF, or a stray byte)."""
    if connection.sock is None:
        return False
    try:
        readable, _, _ = select.select([connection.sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def checked_portal_url(base_url: str) -> str:
    """The portal's base URL as given, or ValueError saying what it must be."""
    try:
        parts = urlsplit(base_url)
        parts.port  # noqa: B018 — a port that is no number raises here
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"portal URL must be http(s)://host[:port][/path], not {base_url!r}")
    return base_url


class PortalClient:
    def __init__(self, base_url: str) -> None:
        parts = urlsplit(checked_portal_url(base_url))
        self.connection_class = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        self.host = parts.hostname
        self.port = parts.port
        self.prefix = parts.path.rstrip("/")
        self.local = threading.local()

    def _connection(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection, and whether it has carried requests before."""
        connection = getattr(self.local, "connection", None)
        if connection is not None and _closed_by_peer(connection):
            connection.close()
            connection = None
        reused = connection is not None and connection.sock is not None
        if connection is None:
            connection = self.connection_class(self.host, self.port, timeout=timeout)
            self.local.connection = connection
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        return connection, reused

    def close(self) -> None:
        connection = getattr(self.local, "connection", None)
        if connection is not None:
            connection.close()
            self.local.connection = None

    def post(self, path: str, *, json: dict, timeout: float, headers: dict | None = None):
        """POST `json` to the portal's `path`; raises PortalUnreachable without an answer."""
        body = _dumps(json)
        headers = {"Content-Type": "application/json", **(headers or {})}
        while True:
            connection, reused = self._connection(timeout)
            try:
                connection.request("POST", self.prefix + path, body=body, headers=headers)
                response = connection.getresponse()
                content = response.read()
            except (OSError, http.client.HTTPException) as error:
                self.close()
                # The server closed the kept-alive connection as the request went out: again on
                # a new one (what the request carries may have been applied; the portal ignores
                # a replay).
                if reused and isinstance(error, _CLOSED_UNDER_US):
                    continue
                raise PortalUnreachable(type(error).__name__) from error
            if response.will_close:
                self.close()
            return Response(response.status, content)


_CLOSED_UNDER_US = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def _dumps(value: dict) -> bytes:
    return json.dumps(value).encode()

"""Real receivers for the notifications' tests, each on its own thread: an SMTP server
(aiosmtpd) and an HTTP server (http.server) that records every request and answers as told,
one path answering with a status, one never answering. Nothing is mocked: deliveries go out
through Django's SMTP mail and `requests`, as in production. The HTTP receivers listen on
127.0.0.1, so their tests allow it (NOTIFICATIONS_WEBHOOK_ALLOWED_NETS); tests without one run
with the default, which refuses loopback."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiosmtpd.controller import Controller


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _Inbox:
    """aiosmtpd's handler: keeps every message it accepts."""

    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []

    async def handle_DATA(self, server, session, envelope) -> str:
        self.messages.append(message_from_bytes(envelope.content, policy=policy.default))
        return "250 OK"


@pytest.fixture
def smtp_server(settings) -> Iterator[_Inbox]:
    """A real SMTP server on 127.0.0.1; Django's mail sends to it. `.messages` are what it
    received."""
    inbox = _Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", controller.port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.DEFAULT_FROM_EMAIL = "portal@example.com"
    yield inbox
    controller.stop()


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class Receiver:
    """An HTTP server: `url(path)`; `requests` it got; `status[path]` the status it answers
    with (200 unless told, a list: in turn); `location[path]` a Location header it sends."""

    server: ThreadingHTTPServer
    requests: list[Request] = field(default_factory=list)
    status: dict[str, int | list[int]] = field(default_factory=dict)
    location: dict[str, str] = field(default_factory=dict)

    def url(self, path: str = "/hook") -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}{path}"

    def to(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path]


LOOPBACK = "127.0.0.1/32"


@pytest.fixture
def loopback_allowed(settings) -> None:
    """Webhooks may reach 127.0.0.1, where the test receivers listen."""
    settings.NOTIFICATIONS_WEBHOOK_ALLOWED_NETS = LOOPBACK


@pytest.fixture
def receiver(loopback_allowed) -> Iterator[Receiver]:
    holder: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            me = holder["receiver"]
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            me.requests.append(Request(self.path, dict(self.headers.items()), body))
            status = me.status.get(self.path, 200)
            if isinstance(status, list):  # answers in turn, the last one from then on
                status = status.pop(0) if len(status) > 1 else status[0]
            self.send_response(status)
            if self.path in me.location:
                self.send_header("Location", me.location[self.path])
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    holder["receiver"] = receiver = Receiver(server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield receiver
    server.shutdown()
    server.server_close()


@pytest.fixture
def dead_url(loopback_allowed) -> str:
    """An address where nothing listens: connections are refused."""
    return f"http://127.0.0.1:{free_port()}/hook"


@pytest.fixture
def hanging_url(loopback_allowed) -> Iterator[str]:
    """An address that accepts connections and never answers (the kernel completes them
    into the backlog of a socket nobody reads)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook"


@pytest.fixture(autouse=True)
def quick_notifications(settings):
    """Short timeouts and retries, so a test of a dead endpoint is short too."""
    settings.NOTIFICATIONS_TIMEOUT_SECONDS = 1.0
    settings.NOTIFICATIONS_RETRY_BASE_SECONDS = 30.0
    settings.NOTIFICATIONS_MAX_ATTEMPTS = 3

"""Django's WSGI application (the REST API, the admin, the dashboards) served by the production
server's event loop: a request's body is read on the loop, the request runs start to end on one
of a few threads, as under a WSGI server, and its answer is written on the loop. The request
crosses from the loop to its thread once and back once.

Before this, a2wsgi's bridge sent the status line and headers, each body chunk and the end of
the body from the request's thread one at a time, each time waiting for the loop to take it,
and it read the body the same way: three or four round trips between the thread and the loop per
request, each a wait for the loop on a busy machine (`bench/api.py` measures the difference).

A response is gathered on its thread up to BUFFER_BYTES and written at once; a larger one (a
static file) is streamed from its thread chunk by chunk, each chunk waiting for the loop to take
it, so a large file is never held in memory whole. The body of a request is read by Django's
ASGI reader (in memory up to FILE_UPLOAD_MAX_MEMORY_SIZE, on disk beyond), before a thread is
taken: a slow client holds no thread."""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler

# A response up to this size is written in one go; beyond it, it is streamed from its thread.
BUFFER_BYTES = 1024 * 1024


class ThreadedWsgi:
    """ASGI application serving the WSGI application `app` on `threads` threads."""

    def __init__(self, app: Callable, *, threads: int) -> None:
        self.app = app
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="web")
        self.reader = ASGIHandler()  # for its body reader only

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":  # a websocket: none is served (no lifespan: it is off)
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1000})
            return
        try:
            body = await self.reader.read_body(receive)
        except RequestAborted:  # the client went away before it sent its body
            return
        loop = asyncio.get_running_loop()
        request = _Request(self.app, environ(scope, body), loop, send)
        try:
            answer = await loop.run_in_executor(
                self.executor, contextvars.copy_context().run, request.run
            )
        finally:
            body.close()
        if answer is not None:  # gathered whole: written here, in one piece
            start, chunks = answer
            await send(start)
            await send({"type": "http.response.body", "body": b"".join(chunks)})


class _Request:
    """One request on its thread: `run` calls the WSGI application and returns the answer's
    start message and body chunks, or None once it has streamed a large answer itself."""

    def __init__(
        self, app: Callable, environ: dict, loop: asyncio.AbstractEventLoop, send: Callable
    ) -> None:
        self.app = app
        self.environ = environ
        self.loop = loop
        self.send = send
        self.start: dict | None = None
        self.chunks: list[bytes] = []
        self.sent = False  # the start message is written (a streamed answer)

    def run(self) -> tuple[dict, list[bytes]] | None:
        iterable = self.app(self.environ, self.start_response)
        try:
            size = sum(map(len, self.chunks))  # written with `write` by an older application
            chunks = iter(iterable)
            for chunk in chunks:
                if not chunk:
                    continue
                self.chunks.append(chunk)
                size += len(chunk)
                if size > BUFFER_BYTES:
                    self._stream(chunks)
                    return None
            return self._started(), self.chunks
        finally:
            close = getattr(iterable, "close", None)
            if close is not None:  # Django's request_finished: on this thread, as it began
                close()

    def start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Callable[[bytes], None]:
        if exc_info is not None and self.sent:
            raise exc_info[1].with_traceback(exc_info[2])  # too late to change the answer
        self.start = {
            "type": "http.response.start",
            "status": int(status.split(" ", 1)[0]),
            "headers": [
                (name.strip().lower().encode("latin1"), value.strip().encode("latin1"))
                for name, value in headers
            ],
        }
        return self.chunks.append

    def _started(self) -> dict:
        if self.start is None:
            raise RuntimeError("the WSGI application returned without calling start_response")
        return self.start

    def _stream(self, rest: Iterable[bytes]) -> None:
        """Write what is gathered, then each further chunk as it comes, each once the loop has
        taken the one before (a client that reads slowly slows this thread, not the loop)."""
        self._write(self._started())
        self.sent = True
        for chunk in self.chunks:
            self._write({"type": "http.response.body", "body": chunk, "more_body": True})
        self.chunks.clear()
        for chunk in rest:
            if chunk:
                self._write({"type": "http.response.body", "body": chunk, "more_body": True})
        self._write({"type": "http.response.body", "body": b""})

    def _write(self, message: dict) -> None:
        asyncio.run_coroutine_threadsafe(self.send(message), self.loop).result()


def environ(scope: dict, body: BinaryIO) -> dict:
    """The WSGI environ (PEP 3333) of an ASGI HTTP request whose body is the file `body`."""
    root = scope.get("root_path", "")
    path = scope["path"]
    if root and path.startswith(root):
        path = path[len(root) :]
    server = scope.get("server") or ("localhost", 80)
    result = {
        "REQUEST_METHOD": scope["method"],
        # PEP 3333: the bytes of the path, as latin-1 text (Django decodes them as UTF-8).
        "SCRIPT_NAME": root.encode("utf-8").decode("latin-1"),
        "PATH_INFO": path.encode("utf-8").decode("latin-1"),
        "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1] or 0),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": body,
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    client = scope.get("client")
    if client:
        result["REMOTE_ADDR"], result["REMOTE_PORT"] = str(client[0]), str(client[1])
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        if name not in ("CONTENT_LENGTH", "CONTENT_TYPE"):
            name = f"HTTP_{name}"
        value = raw_value.decode("latin-1")
        # A header sent more than once: its values joined, as one header (RFC 9110 5.3).
        result[name] = f"{result[name]},{value}" if name in result else value
    return result

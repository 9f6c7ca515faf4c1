"""The agent's HTTP client: answers whatever their status, a new connection when the portal
closed the kept-alive one, and one exception for every way of not getting an answer."""

from __future__ import annotations

import http.server
import json
import socket
import threading

import pytest

from scheduler.agent.transport import PortalClient, PortalUnreachable


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept alive unless the handler closes

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((self.path, body, self.client_address[1]))
        answer = json.dumps({"echo": body}).encode()
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        # Like a server whose keep-alive timeout ran out: closed, without saying so before.
        self.close_connection = self.server.close_after_each

    def log_message(self, *args):
        pass


@pytest.fixture
def portal():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.seen, server.status, server.close_after_each = [], 200, False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/base/"


def test_posts_json_under_the_base_path_and_keeps_the_connection(portal):
    client = PortalClient(url(portal))
    for n in range(3):
        response = client.post("/api/v1/agent/poll/", json={"n": n}, timeout=5)
        assert (response.status_code, response.json()) == (200, {"echo": {"n": n}})
    assert [path for path, _, _ in portal.seen] == ["/base/api/v1/agent/poll/"] * 3
    assert len({port for _, _, port in portal.seen}) == 1


def test_a_connection_the_portal_closed_is_replaced(portal):
    """Every request gets its answer, each on a new connection; none is sent twice."""
    portal.close_after_each = True
    client = PortalClient(url(portal))
    for n in range(3):
        assert client.post("/report/", json={"n": n}, timeout=5).json() == {"echo": {"n": n}}
    assert [body for _, body, _ in portal.seen] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert len({port for _, _, port in portal.seen}) == 3


def test_an_error_status_is_an_answer(portal):
    portal.status = 401
    response = PortalClient(url(portal)).post("/poll/", json={}, timeout=5)
    assert response.status_code == 401
    assert json.loads(response.text) == {"echo": {}}


def test_no_portal_is_portal_unreachable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(PortalUnreachable, match="ConnectionRefusedError"):
        PortalClient(f"http://127.0.0.1:{port}").post("/poll/", json={}, timeout=5)


def test_a_portal_that_does_not_answer_in_time_is_portal_unreachable():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # accepts the connection, never answers
        client = PortalClient(f"http://127.0.0.1:{listener.getsockname()[1]}")
        with pytest.raises(PortalUnreachable, match="TimeoutError"):
            client.post("/poll/", json={}, timeout=0.2)

"""The client and `gpu-portal` as a script or a pipeline meets them: a portal behind a reverse
proxy (at a path prefix, redirecting http to https, answering HTML or 502 while the portal
restarts, over TLS with its own CA), URLs and tokens as people paste them, and the exit status
and stderr of what goes wrong: one line that names the cause, never a traceback."""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from django.utils import timezone

from portal_client import Client, PortalError, PortalUnreachable
from portal_client.cli import LOG_UNREACHABLE, LS_MORE, NO_TOKEN, NO_URL
from portal_client.client import BAD_URL, JOB_STATES
from scheduler.models import Job, JobAttempt
from tests.api.helpers import place
from tests.api.test_client import ROOT, bob_client, cli  # noqa: F401 (a fixture)
from tests.kubernetes.simkubelet import serving_certificate
from tests.live import free_port

NGINX_404 = b"<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n</body>\r\n</html>"
NGINX_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>"
)
LOGIN_PAGE = b"<!doctype html><html><title>Sign in</title><form>...</form></html>"
DATABASE_DOWN = b'{"detail": "the database is unavailable; nothing was changed, retry later."}'
DROP = "drop"  # the connection closes with no answer, as while the portal restarts


class Front(ThreadingHTTPServer):
    """A reverse proxy in front of the live server, as nginx is in production: it serves the
    portal under `prefix`, which it strips (`location /gpu/ { proxy_pass http://portal/; }`,
    the Host header passed on, so the portal does not know its prefix), and a plain HTML 404
    elsewhere; paths under `redirect` get a 301 to the same path under `prefix`, as a move to
    https does. First it gives the canned `answers`, one a request: DROP, or (status, content
    type, body)."""

    daemon_threads = True

    def __init__(self, backend: str, prefix: str = "", redirect: str | None = None,
                 tls: tuple[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(("127.0.0.1", 0), _FrontHandler)
        self.backend = urlsplit(backend)
        self.prefix, self.redirect = prefix, redirect
        self.answers: list = []
        self.requests = 0
        self.lock = threading.Lock()
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.socket = context.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _FrontHandler(BaseHTTPRequestHandler):
    server: Front

    def log_message(self, *args) -> None:
        pass

    def _serve(self) -> None:
        front = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with front.lock:
            front.requests += 1
            answer = front.answers.pop(0) if front.answers else None
        if answer == DROP:
            self.close_connection = True
            return
        if answer is not None:
            return self._answer(*answer)
        if front.redirect and self.path.startswith(front.redirect + "/"):
            location = front.prefix + self.path[len(front.redirect) :]
            return self._answer(301, "text/html", NGINX_404, location=location)
        if not self.path.startswith(front.prefix + "/"):
            return self._answer(404, "text/html", NGINX_404)
        backend = http.client.HTTPConnection(front.backend.hostname, front.backend.port, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        backend.request(self.command, self.path[len(front.prefix) :], body=body, headers=headers)
        response = backend.getresponse()
        self._answer(response.status, response.getheader("Content-Type"), response.read())
        backend.close()

    do_GET = do_POST = do_PATCH = _serve  # noqa: N815 — http.server's names

    def _answer(self, status: int, content_type: str, body: bytes, location: str = "") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if location:
            self.send_header("Location", location)
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def front(live_server):
    """`front(prefix=..., redirect=..., tls=...)`: the live server behind a reverse proxy."""
    fronts: list[Front] = []

    def make(**options) -> Front:
        fronts.append(Front(live_server.url, **options))
        return fronts[-1]

    yield make
    for server in fronts:
        server.shutdown()
        server.server_close()


def gpu_portal(*args: str, **env: str) -> subprocess.CompletedProcess:
    """`gpu-portal ARGS` with only the environment given (no PORTAL_* or proxy settings of the
    test run's)."""
    base = {key: value for key, value in os.environ.items()
            if not key.startswith("PORTAL_") and "PROXY" not in key.upper()}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "portal_client", *args], cwd=ROOT, env={**base, **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def assert_one_line(result: subprocess.CompletedProcess, status: int, *said: str) -> None:
    """The command exited with `status`, saying on stderr one line that holds each of `said`."""
    assert result.returncode == status, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    for text in said:
        assert text in result.stderr


def ran_and_failed(world, job_id: int) -> Job:
    """The job ran on h100-0, wrote "step 1", and failed."""
    job = Job.objects.get(pk=job_id)
    attempt = place(job, world.nodes["h100-0"], list(range(8)))
    JobAttempt.objects.filter(pk=attempt.pk).update(
        log_tail="step 1\n", outcome=JobAttempt.Outcome.FAILED, ended_at=timezone.now()
    )
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.FAILED, reason="exited with code 1", finished_at=timezone.now()
    )
    return job


def submit_args(*more: str) -> tuple[str, ...]:
    return ("submit", "--share", "research", "--gpus", "8", "--gpu-type", "h100", *more)


# --- Addresses: a reverse proxy, a path prefix, redirects, what is not the portal ---------------


def test_ls_reads_every_page_of_a_portal_behind_a_path_prefix(world, front):
    """Behind a proxy at /gpu/ the portal's `next` links lack the prefix: the client keeps to
    its own URL and reads every page (500 jobs a page)."""
    Job.objects.bulk_create(
        Job(share=world.shares["research"], submitted_by=world.bob, gpu_type="h100", gpus=1,
            command="x", state=Job.State.RUNNABLE)
        for _ in range(502)
    )  # fmt: skip
    gateway = front(prefix="/gpu")
    listed = gpu_portal("--json", "ls", "--limit", "1000", PORTAL_URL=f"{gateway.url}/gpu/",
                        PORTAL_TOKEN=world.tokens["bob"])  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 502


def test_ls_says_on_stderr_when_there_are_more_jobs_than_it_shows(world, bob_client, live_server):  # noqa: F811
    """`ls` shows the newest --limit jobs (50): stderr says when there are more, so that a
    script counting them knows it saw a part."""
    for _ in range(3):
        bob_client.submit(share="research", gpus=1, gpu_type="h100", command="x")
    listed = cli(live_server, world.tokens["bob"], "--json", "ls", "--limit", "2")
    assert len(json.loads(listed.stdout)) == 2
    assert listed.stderr == LS_MORE.format(limit=2) + "\n"
    everything = cli(live_server, world.tokens["bob"], "ls", "--limit", "3")
    assert everything.stdout.count("\n") == 4 and everything.stderr == ""


def test_a_redirect_is_not_followed_and_the_new_address_is_named(world, front):
    """An http → https redirect (nginx's `return 301`) turns a POST into a GET: a submit sent
    on would list jobs and submit nothing. The client stops and names the address to use."""
    gateway = front(prefix="/gpu", redirect="/old")
    client = Client(f"{gateway.url}/old", world.tokens["bob"])
    with pytest.raises(PortalUnreachable) as moved:
        client.submit(share="research", gpus=8, gpu_type="h100", command="x")
    assert f"redirects to {gateway.url}/gpu" in str(moved.value)
    submitted = gpu_portal(*submit_args("--", "x"), PORTAL_URL=f"{gateway.url}/old",
                           PORTAL_TOKEN=world.tokens["bob"])  # fmt: skip
    assert_one_line(submitted, 4, f"redirects to {gateway.url}/gpu", "check --url or PORTAL_URL")
    assert not Job.objects.exists()


def test_html_from_something_else_than_the_portal_is_said_in_one_line(world, front):
    """A wrong prefix gets the proxy's 404 page, a sign-in page answers 200: one line each,
    not the page and not a traceback."""
    gateway = front(prefix="/gpu")
    token = world.tokens["bob"]
    not_found = gpu_portal("ls", PORTAL_URL=gateway.url, PORTAL_TOKEN=token)
    assert_one_line(not_found, 2, "HTTP 404: Not Found", "not the portal's API", "--url")
    assert "<html" not in not_found.stderr
    gateway.answers.append((200, "text/html; charset=utf-8", LOGIN_PAGE))
    sign_in = gpu_portal("ls", PORTAL_URL=f"{gateway.url}/gpu", PORTAL_TOKEN=token)
    assert_one_line(sign_in, 4, "not the portal's API", "200 OK", "text/html", "--url")


def test_a_502_from_the_proxy_says_the_portal_does_not_answer(world, front):
    """The proxy's 502 page while the portal restarts: the portal does not answer (exit status
    4, not 2, a refusal), in one line, not the page."""
    gateway = front(prefix="/gpu")
    gateway.answers.append((502, "text/html", NGINX_502))
    shown = gpu_portal("ls", PORTAL_URL=f"{gateway.url}/gpu", PORTAL_TOKEN=world.tokens["bob"])
    assert_one_line(shown, 4, "does not answer", "502 Bad Gateway")
    assert "<html" not in shown.stderr


# --- Waiting and following while the portal restarts --------------------------------------------


def test_wait_goes_on_through_a_restart_of_the_portal(world, bob_client, front):  # noqa: F811
    """A connection closed, the proxy's 502 and the portal's own 503 while it restarts are
    waited out; the wait ends when the job does."""
    job = bob_client.submit(share="research", gpus=8, gpu_type="h100", command="x")
    bob_client.cancel(job["id"])
    gateway = front(prefix="/gpu")
    gateway.answers += [
        DROP, (502, "text/html", NGINX_502), (503, "application/json", DATABASE_DOWN),
    ]  # fmt: skip
    waiting = Client(f"{gateway.url}/gpu", world.tokens["bob"])
    assert waiting.wait(job["id"], poll=0.01)["state"] == "CANCELLED"
    assert gateway.requests == 4
    # Only an outage is waited out: a job one may not see is an error at once.
    gateway.answers += [DROP]
    with pytest.raises(PortalError) as refused:
        Client(f"{gateway.url}/gpu", world.tokens["oscar"]).wait(job["id"], poll=0.01)
    assert refused.value.status == 404


def test_wait_gives_up_when_the_portal_stays_away(world, bob_client, front):  # noqa: F811
    """After `outage` seconds in a row without an answer, `wait` gives up with the error."""
    job = bob_client.submit(share="research", gpus=8, gpu_type="h100", command="x")
    gateway = front(prefix="/gpu")
    gateway.answers += [DROP] * 1000
    with pytest.raises(PortalUnreachable):
        Client(f"{gateway.url}/gpu", world.tokens["bob"]).wait(job["id"], poll=0.01, outage=0.1)
    assert 1 < gateway.requests < 1000


def test_logs_follow_goes_on_through_a_restart_and_says_so_on_stderr(world, bob_client, front):  # noqa: F811
    """`logs -f` says on stderr that the portal does not answer and goes on once it does; the
    log on stdout is whole."""
    job = ran_and_failed(
        world, bob_client.submit(share="research", gpus=8, gpu_type="h100", command="x")["id"]
    )
    gateway = front(prefix="/gpu")
    gateway.answers += [DROP, (502, "text/html", NGINX_502)]
    url, token = f"{gateway.url}/gpu", world.tokens["bob"]
    followed = gpu_portal("logs", "-f", str(job.pk), "--every", "0.01", PORTAL_URL=url,
                          PORTAL_TOKEN=token)  # fmt: skip
    assert followed.stdout == "step 1\n"
    assert followed.returncode == 1  # failed: not a success
    assert followed.stderr.startswith(LOG_UNREACHABLE.split("{", 1)[0])
    assert "Traceback" not in followed.stderr


def test_ctrl_c_during_submit_wait_exits_130_and_says_the_job_goes_on(world, live_server):
    """`submit --wait` says at once which job it waits for; Ctrl-C then ends it with exit
    status 130 and a line saying the job goes on and how to cancel it, not a traceback."""
    process = subprocess.Popen(
        [sys.executable, "-m", "portal_client", *submit_args("--wait", "--", "train")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
        env={**os.environ, "PORTAL_URL": live_server.url, "PORTAL_TOKEN": world.tokens["bob"]},
    )  # fmt: skip
    try:
        ready, _, _ = select.select([process.stderr], [], [], 30)
        assert ready, "submit --wait did not say which job it waits for"
        said = process.stderr.readline()
        job_id = int(said.split()[1])
        assert said.startswith(f"job {job_id} RUNNABLE: ")
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 130
    assert out == "" and "Traceback" not in err
    assert f"gpu-portal cancel {job_id}" in err
    assert Job.objects.get(pk=job_id).state == Job.State.RUNNABLE


# --- URL, token and proxy settings as people give them -------------------------------------------


def test_a_token_read_from_a_file_with_its_newline_works(world, live_server):
    """`PORTAL_TOKEN=$(cat token)` drops the newline, a Kubernetes secret as an environment
    variable keeps it; a URL copied with its trailing slash works too."""
    token = world.tokens["bob"] + "\n"
    listed = gpu_portal("ls", PORTAL_URL=live_server.url + "/", PORTAL_TOKEN=token)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("    ID  SHARE")


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "http://[::1", "ftp://portal", "http://"])
def test_a_url_that_is_no_portal_address_is_refused_naming_the_rule(url):
    """A URL without http:// or https://, with a broken host, of another scheme: exit status
    2 and the rule, not a traceback from requests."""
    refused = gpu_portal("--url", url, "--token", "t", "ls")
    assert_one_line(refused, 2, BAD_URL.format(url=url), "--url or PORTAL_URL")


def test_a_token_that_cannot_be_one_is_refused_naming_the_rule(world, live_server):
    """A token that cannot be one (not ASCII, spaces inside): exit status 2 naming the token,
    not a traceback from requests' check of the header."""
    refused = gpu_portal("ls", PORTAL_URL=live_server.url, PORTAL_TOKEN="tøken → ünïcode")
    assert_one_line(refused, 2, "token: ", "--token or PORTAL_TOKEN")


def test_a_wrong_token_says_where_the_token_comes_from(world, live_server):
    """A 401 says where the token came from."""
    refused = gpu_portal("ls", PORTAL_URL=live_server.url, PORTAL_TOKEN="not-a-token")
    assert_one_line(refused, 2, "HTTP 401: Invalid token.", "check --token or PORTAL_TOKEN")


def test_settings_missing_or_bad_exit_2_not_1_which_means_the_job_failed(world, live_server):
    """`gpu-portal submit --wait ... || retry-the-training`: exit status 1 says the job failed;
    a CLI that was never told where the portal is did not run one."""
    assert_one_line(gpu_portal("ls"), 2, NO_URL)
    assert_one_line(gpu_portal("ls", PORTAL_URL=live_server.url), 2, NO_TOKEN)
    bad_env = gpu_portal(*submit_args("--env", "EPOCHS", "--", "x"), PORTAL_URL=live_server.url,
                         PORTAL_TOKEN=world.tokens["bob"])  # fmt: skip
    assert_one_line(bad_env, 2, "--env takes NAME=VALUE")
    no_command = gpu_portal(*submit_args(), PORTAL_URL=live_server.url,
                            PORTAL_TOKEN=world.tokens["bob"])  # fmt: skip
    assert_one_line(no_command, 2, "no command")


def test_an_http_proxy_that_does_not_answer_is_named(world, live_server):
    """requests takes HTTP(S)_PROXY and NO_PROXY from the environment: when the proxy is what
    fails, the error names it rather than the portal's URL."""
    proxy = f"http://127.0.0.1:{free_port()}"
    through = gpu_portal("ls", PORTAL_URL=live_server.url, PORTAL_TOKEN=world.tokens["bob"],
                         HTTP_PROXY=proxy)  # fmt: skip
    assert_one_line(through, 4, f"through the proxy {proxy}", "HTTP_PROXY")
    around = gpu_portal("ls", PORTAL_URL=live_server.url, PORTAL_TOKEN=world.tokens["bob"],
                        HTTP_PROXY=proxy, NO_PROXY="localhost,127.0.0.1")  # fmt: skip
    assert around.returncode == 0, around.stderr


def test_a_certificate_not_trusted_is_named_with_the_way_to_trust_it(world, front, tmp_path):
    """A portal whose certificate comes from a CA the client does not know: the error names
    the certificate problem and REQUESTS_CA_BUNDLE, which, set to that certificate, works."""
    cert, key = serving_certificate(tmp_path)
    gateway = front(prefix="/gpu", tls=(cert, key))
    url, token = f"{gateway.url}/gpu", world.tokens["bob"]
    untrusted = gpu_portal("ls", PORTAL_URL=url, PORTAL_TOKEN=token)
    assert_one_line(untrusted, 4, "certificate", "REQUESTS_CA_BUNDLE")
    trusted = gpu_portal("ls", PORTAL_URL=url, PORTAL_TOKEN=token, REQUESTS_CA_BUNDLE=cert)
    assert trusted.returncode == 0, trusted.stderr


# --- Arguments ------------------------------------------------------------------------------


def test_wait_for_a_state_no_job_has_is_refused_at_once(world, bob_client, live_server):  # noqa: F811
    """`wait --state RUNING` would wait the whole timeout for a state that never comes."""
    job = bob_client.submit(share="research", gpus=8, gpu_type="h100", command="x")
    token = world.tokens["bob"]
    misspelled = cli(live_server, token, "wait", str(job["id"]), "--state", "RUNING")
    assert misspelled.returncode == 2 and "--state" in misspelled.stderr
    assert "RUNNING" in misspelled.stderr  # the states it may be
    bob_client.cancel(job["id"])
    lower = cli(live_server, token, "wait", str(job["id"]), "--state", "cancelled")
    assert lower.returncode == 0, lower.stderr
    with pytest.raises(ValueError, match="states: 'RUNING' is not a job state"):
        bob_client.wait(job["id"], states={"RUNING"})
    assert set(JOB_STATES) == set(Job.State.values)


@pytest.mark.parametrize(
    "args", [("logs", "-f", "1", "--every", "-1"), ("logs", "-f", "1", "--every", "0"),
             ("ls", "--limit", "0"), ("ls", "--limit", "-5")],
)  # fmt: skip
def test_numbers_out_of_range_are_refused_naming_the_option(args):
    """`--every 0` would ask the portal without a pause, `--every -1` was a traceback,
    `--limit 0` an empty list: each is refused naming the option and its rule."""
    refused = gpu_portal("--url", "http://127.0.0.1:1", "--token", "t", *args)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"argument {args[-2]}: must be" in refused.stderr


def test_logs_json_is_json(world, bob_client, live_server):  # noqa: F811
    """`--json logs` prints the job's JSON (its log in `log_tail`), not the bare log; with
    --follow, once the job has ended."""
    job = ran_and_failed(
        world, bob_client.submit(share="research", gpus=8, gpu_type="h100", command="x")["id"]
    )
    shown = cli(live_server, world.tokens["bob"], "--json", "logs", str(job.pk))
    assert shown.returncode == 0 and json.loads(shown.stdout)["log_tail"] == "step 1\n"
    followed = cli(live_server, world.tokens["bob"], "logs", "-f", str(job.pk), "--json")
    assert followed.returncode == 1  # failed: not a success
    assert json.loads(followed.stdout)["state"] == "FAILED"

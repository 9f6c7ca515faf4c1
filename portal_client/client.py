"""A small client for `/api/v1/` (requests-based). Every method returns the API's JSON."""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests

JOB_STATES = ("SUBMITTED", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING", "PREEMPTING",
              "SUCCEEDED", "FAILED", "CANCELLED")  # fmt: skip
FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")
# Client.wait looks at the job every `poll` seconds for this long, then less and less often, up
# to every WAIT_POLL_MAX_SECONDS.
WAIT_POLL_STEADY_SECONDS = 60.0
WAIT_POLL_MAX_SECONDS = 15.0
# Client.wait and Client.follow_logs go on trying for this long while the portal does not
# answer (a restart, a database failover: refused connections, a proxy's 502, the portal's
# 503), then give up with the error.
OUTAGE_PATIENCE_SECONDS = 600.0
# The portal answers these while it restarts or its database is away: try again later.
_OUTAGE_STATUSES = (502, 503, 504)

BAD_URL = (
    "url: must be the portal's address, http:// or https:// and a host, like "
    "http://127.0.0.1:8000 or https://portal.example.org/gpu; not {url!r}"
)
BAD_TOKEN = (
    "token: must be the API token as the portal showed it (ASCII letters and digits, no "
    "spaces inside)"
)
BAD_STATE = "states: {state!r} is not a job state; one of {states}."
REDIRECTED = "the portal at {url} redirects to {to}: use that address"
REDIRECTED_AWAY = "{url} answers {status} {reason} with a redirect to {to}, not the portal's API"
NOT_THE_API = "what answers at {url} is not the portal's API ({status} {reason}, {kind})"
NOT_THE_API_DETAIL = "{reason}, {kind}: not the portal's API"
NOT_ANSWERING = (
    "the portal at {url} does not answer: {status} {reason} from the proxy in front of it"
)
UNTRUSTED = (
    "cannot reach the portal at {url}: its TLS certificate is not trusted ({why}); if the "
    "portal's certificate comes from your own CA, set REQUESTS_CA_BUNDLE to that CA's "
    "certificate file (PEM)"
)
PROXY_FAILED = (
    "cannot reach the portal at {url} through the proxy {proxy} ({why}); check HTTPS_PROXY, "
    "HTTP_PROXY and NO_PROXY"
)


# Below this much text in common, the end of a log seen before and the end seen now are not
# taken for overlapping: the log grew by more than the portal keeps in between.
_LEAST_OVERLAP = 32


def log_growth(shown: str, tail: str) -> tuple[str, bool]:
    """What `tail`, the end of a log as the portal keeps it now, adds to `shown`, the end of the
    same log seen earlier: (the new text, whether the log grew by more than the portal keeps in
    between, so that some of it was never seen). The end the portal keeps is cut at a byte, so
    it may begin with the remains of a character, which count for nothing."""
    tail = tail.lstrip("\ufffd")
    shown = shown.lstrip("\ufffd")
    if tail == shown:
        return "", False
    if not shown:
        return tail, False
    least = min(_LEAST_OVERLAP, len(shown), len(tail))
    # The longest start of `tail` that `shown` ends with: the rest of `tail` is new.
    for kept in range(min(len(shown), len(tail)), least - 1, -1):
        if shown.endswith(tail[:kept]):
            return tail[kept:], False
    return tail, True


class JobEnded(RuntimeError):
    """The job ended in a state that `wait` was not waiting for."""

    def __init__(self, job: dict) -> None:
        self.job = job
        super().__init__(f"job {job['id']} ended {job['state']}: {job.get('reason', '')}")


class PortalUnreachable(Exception):
    """No answer from the portal's API: nothing listens at its URL, the name does not resolve,
    it did not answer within the client's timeout, the proxy in front of it answers 502, 503 or
    504, its certificate is not trusted, or what answers is not the portal's API (another page,
    a redirect). A request that timed out may still have been carried out: a submit sent again
    with the same `client_token` returns the first job rather than making a second.
    `check_url`: whether the URL may be what is wrong; `outage`: whether it may pass by itself
    (a restart), so that `wait` tries again."""

    def __init__(self, message: str, *, check_url: bool = True, outage: bool = True) -> None:
        self.check_url = check_url
        self.outage = outage
        super().__init__(message)


class PortalError(Exception):
    """The API refused a request: `status` is the HTTP status, `detail` the JSON body (or, from
    something in front of the portal that answers no JSON, what it said, and `from_the_api`
    is False)."""

    def __init__(self, status: int, detail: Any, *, from_the_api: bool = True) -> None:
        self.status = status
        self.detail = detail
        self.from_the_api = from_the_api
        super().__init__(f"HTTP {status}: {format_detail(detail)}")


def _an_outage(error: Exception) -> bool:
    """Whether an error of a request may pass by itself: the portal restarting, its database
    away for a moment."""
    if isinstance(error, PortalUnreachable):
        return error.outage
    return isinstance(error, PortalError) and error.status in _OUTAGE_STATUSES


def format_detail(detail: Any) -> str:
    """{'gpus': ['gpus: must be ...']} → 'gpus: must be ...' (one message per line)."""
    if isinstance(detail, dict):
        lines = []
        for key, value in detail.items():
            values = value if isinstance(value, list) else [value]
            for message in values:
                text = str(message)
                lines.append(
                    text if key in ("detail", "non_field_errors") else _prefixed(key, text)
                )
        return "\n".join(lines)
    return str(detail)


def _why_unreachable(error: requests.ConnectionError) -> str:
    """The innermost reason of a failed connection, in a few words: "connection refused",
    "name or service not known", ..."""
    reason: BaseException = error
    while reason.__cause__ is not None or reason.__context__ is not None:
        reason = reason.__cause__ or reason.__context__
    text = str(reason)
    if "] " in text:  # "[Errno 111] Connection refused"
        text = text.split("] ", 1)[1]
    return text.strip().lower() or type(reason).__name__


def _prefixed(key: str, text: str) -> str:
    return text if text.startswith(f"{key}:") else f"{key}: {text}"


def portal_url(url: str) -> str:
    """The portal's root as `Client` takes it (http:// or https://, a host, maybe a path where
    a proxy serves it, like /gpu), without a trailing slash; ValueError (BAD_URL) otherwise."""
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port  # a port that is no number raises
    except ValueError:
        raise ValueError(BAD_URL.format(url=url)) from None
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError(BAD_URL.format(url=url))
    return url.rstrip("/")


def api_token(token: str) -> str:
    """A user's API token as it goes in a header: what surrounds it (the newline of a file it
    was read from) left out; ValueError (BAD_TOKEN) for one that cannot be a token."""
    token = token.strip()
    if not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError(BAD_TOKEN)
    return token


def _kind(response: requests.Response) -> str:
    """What a body that is no JSON is: its content type, in a few words."""
    content_type = response.headers.get("Content-Type", "").split(";")[0].strip()
    return content_type or ("an empty body" if not response.content else "no content type")


class Client:
    """`Client(url, token)`: url is the portal's root (http://host:port, or where a reverse
    proxy serves it: https://host/gpu), token a user's API token (`manage.py drf_create_token
    USER`; a trailing newline is left out). ValueError for a URL or token that cannot be one.
    requests' environment applies: HTTPS_PROXY, HTTP_PROXY, NO_PROXY, and REQUESTS_CA_BUNDLE
    for a portal whose certificate comes from your own CA."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        self.url = portal_url(url)
        self.timeout = timeout
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Token {api_token(token)}"

    # --- plumbing -----------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        url = f"{self.url}/api/v1/{path.lstrip('/')}"
        try:
            # Never followed: requests would send a POST on as a GET (a submit that lists jobs
            # and submits nothing).
            response = self.session.request(
                method, url, timeout=self.timeout, allow_redirects=False, **kwargs
            )
        except requests.Timeout as error:
            raise PortalUnreachable(
                f"the portal at {self.url} did not answer within {self.timeout:g} s"
            ) from error
        except requests.exceptions.SSLError as error:
            raise PortalUnreachable(
                UNTRUSTED.format(url=self.url, why=_why_unreachable(error)),
                check_url=False,
                outage=False,
            ) from error
        except requests.exceptions.ProxyError as error:
            proxies = requests.utils.get_environ_proxies(url)
            proxy = requests.utils.select_proxy(url, {**proxies, **self.session.proxies})
            raise PortalUnreachable(
                PROXY_FAILED.format(url=self.url, proxy=proxy, why=_why_unreachable(error)),
                check_url=False,
            ) from error
        except requests.ConnectionError as error:
            raise PortalUnreachable(
                f"cannot reach the portal at {self.url} ({_why_unreachable(error)})"
            ) from error
        except requests.RequestException as error:  # an answer broken off, ...
            raise PortalUnreachable(
                f"no whole answer from the portal at {self.url} ({error})", check_url=False
            ) from error
        return self._answer(url, response)

    def _answer(self, url: str, response: requests.Response) -> Any:
        """The JSON of the API's answer; PortalError for a refusal, PortalUnreachable for what
        is not the API answering (a redirect, a proxy's page)."""
        status, reason = response.status_code, response.reason
        if response.is_redirect:
            to = urljoin(url, response.headers["Location"])
            asked = url[len(self.url) :]  # /api/v1/...
            if urlsplit(to).path.endswith(urlsplit(asked).path):
                root = to.split("?", 1)[0][: -len(urlsplit(asked).path)]
                raise PortalUnreachable(REDIRECTED.format(url=self.url, to=root), outage=False)
            raise PortalUnreachable(
                REDIRECTED_AWAY.format(url=self.url, status=status, reason=reason, to=to),
                outage=False,
            )
        try:
            body = response.json() if response.content else None
            # An empty refusal is none of the API's: they all say why.
            of_the_api = body is not None or status < 400
        except ValueError:
            of_the_api = False
        if not of_the_api:
            if status in _OUTAGE_STATUSES:
                raise PortalUnreachable(
                    NOT_ANSWERING.format(url=self.url, status=status, reason=reason),
                    check_url=False,
                )
            if status >= 400:
                detail = NOT_THE_API_DETAIL.format(reason=reason, kind=_kind(response))
                raise PortalError(status, detail, from_the_api=False)
            raise PortalUnreachable(
                NOT_THE_API.format(
                    url=self.url, status=status, reason=reason, kind=_kind(response)
                ),
                outage=False,
            )
        if status >= 400:
            raise PortalError(status, body)
        return body

    def _pages(self, path: str, params: dict[str, Any], limit: int | None) -> list[dict]:
        items: list[dict] = []
        page = self._request("GET", path, params=params)
        while True:
            items.extend(page["results"])
            if not page.get("next") or (limit is not None and len(items) >= limit):
                break
            # Only the query of `next`, on this client's URL: behind a reverse proxy at a path
            # prefix the portal's own links lack the prefix.
            page = self._request("GET", f"{path}?{urlsplit(page['next']).query}")
        return items[:limit] if limit is not None else items

    def _job_through_outages(self, job_id: int, poll: float, patience: float) -> dict:
        """The job, looked at every `poll` seconds while the portal does not answer (an
        outage, `_an_outage`), for up to `patience` seconds in a row; then the error."""
        began = None
        while True:
            try:
                return self.job(job_id)
            except (PortalUnreachable, PortalError) as error:
                if not _an_outage(error):
                    raise
                began = time.monotonic() if began is None else began
                if time.monotonic() - began >= patience:
                    raise
            time.sleep(poll)

    # --- jobs (AWS SubmitServiceJob, ListServiceJobs, DescribeServiceJob, ...) -----------------

    def submit(
        self,
        *,
        share: str,
        gpus: int,
        gpu_type: str,
        command: str | Sequence[str],
        nodes: int = 1,
        priority: int = 0,
        name: str = "",
        env: dict[str, str] | None = None,
        image: str | None = None,
        working_dir: str | None = None,
        client_token: str | None = None,
        timeout_seconds: int | None = None,
        expected_seconds: int | None = None,
        max_preemptions: int | None = None,
        retry_attempts: int = 0,
        preemptible: bool = True,
    ) -> dict:
        """Submit a job; returns it. With a `client_token` already used for the same request,
        returns the first job instead of creating a second. `image`: the container image the
        command runs in on Kubernetes nodes (else the connector's default). `working_dir`: the
        absolute path the command starts in on the node (else its checkpoint directory)."""
        return self._request("POST", "jobs/", json=self._job_body(_arguments(locals())))

    def estimate(self, **request: Any) -> dict:
        """What-if: when a job of this request (the arguments of `submit`) would start if it
        were submitted now, and why it would wait: {estimated_start, estimated_nodes,
        estimated_allocations, estimate_basis, reason}. Nothing is stored."""
        return self._request("POST", "jobs/estimate/", json=self._job_body(request))

    @staticmethod
    def _job_body(request: dict[str, Any]) -> dict[str, Any]:
        """The API's body for a job request: the command as one string, unset options left
        out (the API's defaults)."""
        body = {key: value for key, value in request.items() if value is not None}
        command = body.get("command")
        if command is not None and not isinstance(command, str):
            body["command"] = shlex.join(command)
        return body

    def jobs(
        self,
        *,
        share: str | None = None,
        state: str | Iterable[str] | None = None,
        submitted_by: str | None = None,
        since: str | None = None,
        limit: int | None = None,
    ) -> list[dict]:
        """Jobs you may see, newest first, following `next` links (up to `limit`)."""
        params: dict[str, Any] = {"page_size": min(limit or 500, 500)}
        if share:
            params["share"] = share
        if state:
            params["state"] = [state] if isinstance(state, str) else list(state)
        if submitted_by:
            params["submitted_by"] = submitted_by
        if since:
            params["since"] = since
        return self._pages("jobs/", params, limit)

    def ahead(self, job_id: int) -> dict:
        """Where a waiting job stands in its GPU type's queue: {position, count, gpus, ahead,
        holders} (the jobs ahead of it, and whose jobs hold what it waits for)."""
        return self._request("GET", f"jobs/{job_id}/ahead/")

    def job(self, job_id: int) -> dict:
        """Describe a job: attempts, preemptions, nodes and GPU indices, log tail."""
        return self._request("GET", f"jobs/{int(job_id)}/")

    def update(self, job_id: int, *, priority: int) -> dict:
        return self._request("PATCH", f"jobs/{int(job_id)}/", json={"priority": priority})

    def cancel(self, job_id: int) -> dict:
        return self._request("POST", f"jobs/{int(job_id)}/cancel/")

    def wait(
        self,
        job_id: int,
        states: Iterable[str] = FINAL_STATES,
        timeout: float | None = 3600,
        poll: float = 1.0,
        outage: float = OUTAGE_PATIENCE_SECONDS,
    ) -> dict:
        """Poll until the job is in one of `states`; returns it. Raises JobEnded when the job
        ends in a state not asked for (it will never get there), TimeoutError at the timeout,
        ValueError (BAD_STATE) for a state no job has. It looks at the job every `poll`
        seconds for the first WAIT_POLL_STEADY_SECONDS, then half as long again after each
        look, up to WAIT_POLL_MAX_SECONDS (or `poll` if longer): a wait of days costs the
        portal a request every 15 s, not every second. While the portal does not answer (a
        restart: refused connections, 502, 503, 504) it goes on trying for up to `outage`
        seconds in a row, then raises that error."""
        wanted = {states} if isinstance(states, str) else set(states)
        unknown = sorted(wanted - set(JOB_STATES))
        if unknown:
            raise ValueError(BAD_STATE.format(state=unknown[0], states=", ".join(JOB_STATES)))
        began = time.monotonic()
        deadline = None if timeout is None else began + timeout
        interval = poll
        while True:
            patience = outage if deadline is None else min(outage, deadline - time.monotonic())
            job = self._job_through_outages(job_id, interval, patience)
            if job["state"] in wanted:
                return job
            if job["state"] in FINAL_STATES:
                raise JobEnded(job)
            if deadline is not None and time.monotonic() >= deadline:
                *others, last = sorted(wanted)
                either = f"{', '.join(others)} or {last}" if others else last
                raise TimeoutError(
                    f"job {job_id} is still {job['state']} after {timeout:g} s of waiting for "
                    f"{either}"
                )
            if deadline is not None:
                interval = min(interval, max(0.0, deadline - time.monotonic()))
            time.sleep(interval)
            if time.monotonic() - began >= WAIT_POLL_STEADY_SECONDS:
                interval = min(interval * 1.5, max(poll, WAIT_POLL_MAX_SECONDS))

    def logs(self, job_id: int) -> str:
        """The end of the job's log (latest attempt)."""
        return self.job(job_id)["log_tail"]

    def follow_logs(
        self, job_id: int, poll: float = 5.0, outage: float = OUTAGE_PATIENCE_SECONDS
    ) -> Iterator[tuple[str, Any]]:
        """The job's log as it grows, until the job ends: yields ("text", what the log added),
        ("skipped", None) when it grew by more than the portal keeps of it between two looks
        (that part is only on the node), ("attempt", n) when attempt n starts a new log (after
        a preemption or a retry), ("unreachable", the error) when the portal stops answering
        (it goes on trying for up to `outage` seconds in a row, as `wait` does), and last
        ("ended", the job). The portal holds the end of the latest attempt's log, which agents
        send every 15 s or so; `poll`: seconds between looks."""
        attempt, shown = None, ""
        while True:
            try:
                job = self.job(job_id)
            except (PortalUnreachable, PortalError) as error:
                if not _an_outage(error):
                    raise
                yield "unreachable", error
                job = self._job_through_outages(job_id, poll, outage)
            number, tail = job["attempt_count"], job["log_tail"]
            if number != attempt:
                if attempt:  # a log was followed before: this one is another attempt's
                    yield "attempt", number
                attempt, shown = number, ""
            added, skipped = log_growth(shown, tail)
            if skipped:
                yield "skipped", None
            if added:
                yield "text", added
                shown = tail
            if job["state"] in FINAL_STATES:
                yield "ended", job
                return
            time.sleep(poll)

    # --- queue, shares, nodes -----------------------------------------------------------------

    def queue(self) -> dict:
        """The front of the queue and per-share usage (AWS GetJobQueueSnapshot)."""
        return self._request("GET", "queue/")

    def shares(self) -> list[dict]:
        return self._request("GET", "shares/")

    def share(self, name: str) -> dict:
        return self._request("GET", f"shares/{name}/")

    def share_usage(self, name: str) -> dict:
        return self._request("GET", f"shares/{name}/usage/")

    def share_history(self, name: str, *, limit: int | None = None) -> list[dict]:
        return self._pages(f"shares/{name}/history/", {}, limit)

    def update_share(self, name: str, **changes: Any) -> dict:
        """Admins: change a share's settings (capacity_limits replaces the whole map)."""
        return self._request("PATCH", f"shares/{name}/", json=changes)

    def create_share(self, **fields: Any) -> dict:
        """Admins: create a share (name, team, capacity_limits, strategy, ...)."""
        return self._request("POST", "shares/", json=fields)

    def nodes(self) -> list[dict]:
        return self._request("GET", "nodes/")

    def drain(self, node: str, reason: str = "") -> dict:
        """Drain a node (admins): its jobs finish, it takes no new ones; `reason` is recorded
        with your name as the node's `state_reason`."""
        return self._request("POST", f"nodes/{node}/drain/", json={"reason": reason})

    def undrain(self, node: str, reason: str = "") -> dict:
        """Undrain a node (admins): it takes new jobs again; `reason` as for `drain`."""
        return self._request("POST", f"nodes/{node}/undrain/", json={"reason": reason})


def _arguments(frame_locals: dict[str, Any]) -> dict[str, Any]:
    """A method's keyword arguments, from its locals() taken first thing."""
    return {key: value for key, value in frame_locals.items() if key != "self"}

"""How the agent starts job processes: a dead agent leaves no job behind (PR_SET_PDEATHSIG,
through setpriv or set in the child), a command exec cannot find never starts, an older
portal, which grants no starts, gets its orders started, a stop order that comes as its start
is granted wins, and an answer that is no JSON (a proxy's page) is a failed request, not the
end of the thread that sent it (an agent's threads, a connector's poller and main loop)."""

from __future__ import annotations

import contextlib
import http.server
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from scheduler.agent.connector import Connector
from scheduler.agent.core import GRANT_FRESH_SECONDS, Process, _pdeathsig_launcher
from scheduler.agent.protocol import CONNECTOR_POLL_PATH, CONNECTOR_START_PATH, POLL_PATH
from scheduler.agent.slurm import SlurmCluster
from tests.agent.offline import offline_agent, run_order

# An agent in a process of its own starts `sleep 60` and prints its pid, then waits to be killed.
AGENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from scheduler.agent.core import Agent
    from scheduler.agent.gpus import fake_gpus

    work = Path(sys.argv[1])
    agent = Agent(portal="http://127.0.0.1:9", join_token="x", name="n", gpu_type="h100",
                  gpus=fake_gpus(1, "h100"), work_dir=work, checkpoint_root=work / "checkpoints")
    if sys.argv[2] == "without":
        agent.pdeathsig_launcher = None
    agent.start({"attempt": 1, "job": 1, "number": 1, "command": "sleep 60", "env": {},
                 "gpu_indices": [0], "timeout_seconds": None, "grace_seconds": 0})
    print(agent.processes[1].popen.pid, flush=True)
    time.sleep(60)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead: its parent (the killed agent) is gone, and init reaps it soon.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def _command(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as comm:
        return comm.read().strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("launcher", ["with", "without"])
def test_a_killed_agent_takes_its_jobs_with_it(tmp_path, launcher):
    if launcher == "with" and _pdeathsig_launcher() is None:
        pytest.skip("no setpriv with --pdeathsig here")
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(tmp_path), launcher],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )
    try:
        job = int(agent.stdout.readline())
        # Once the command runs (through setpriv: once setpriv has set PR_SET_PDEATHSIG and
        # exec'd it; an agent killed in that millisecond leaves its job to the restarted
        # agent's kill_leftovers).
        deadline = time.monotonic() + 10
        while _command(job) != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _alive(job)
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(job) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(job)
    finally:
        agent.kill()


def test_a_command_that_cannot_be_found_never_starts(tmp_path):
    """Reported as never started, with the error, whether or not a launcher is in between."""
    agent = offline_agent(tmp_path)
    agent.start(run_order(1, 1, "no-such-program --now"))
    (event,) = agent.outbox
    assert (event["type"], event["end"]) == ("exited", "never_started")
    assert "No such file or directory" in event["detail"]
    assert not agent.processes


def test_starts_granted_together_each_run_on_their_own_gpus(tmp_path):
    """One answer grants several starts: they start together (several at a time), each on
    the GPU of its own order with its own log; one whose program cannot be found never starts,
    and the others run."""
    agent = offline_agent(tmp_path, gpus=4)
    orders = {
        attempt: {**run_order(attempt, 10 + attempt, 'echo "$CUDA_VISIBLE_DEVICES" > gpus'),
                  "gpu_indices": [attempt - 1]}
        for attempt in (1, 2, 3)
    }  # fmt: skip
    orders[4] = {**run_order(4, 14, "no-such-program"), "gpu_indices": [3]}
    agent.claims.update(orders)
    agent.granted(list(orders), {"start": list(orders)})
    (event,) = agent.outbox
    assert (event["attempt"], event["end"]) == (4, "never_started")
    assert sorted(agent.processes) == [1, 2, 3]
    for attempt, process in agent.processes.items():
        assert process.popen.wait(10) == 0
        assert process.log_path.name == f"job-{10 + attempt}-attempt-1.log"
        written = (tmp_path / "checkpoints" / f"job-{10 + attempt}" / "gpus").read_text()
        assert written.strip() == str(attempt - 1)


def test_a_poll_s_body_is_made_while_the_main_thread_starts_and_ends_processes(tmp_path):
    """The poller makes each poll's body while the main thread adds and removes claims and
    processes. It always can: an error there would end the poller thread, and with it the
    node's heartbeats. Threads are made to switch as often as they can, so that the poller is
    interrupted in the middle of its reads."""
    agent = offline_agent(tmp_path)
    order = run_order(1, 1, "true")
    fields = {"job": 1, "popen": None, "log_path": tmp_path / "log", "started": 0.0,
              "timeout": None, "grace": 0.0}  # fmt: skip
    failures: list[BaseException] = []
    bodies = 0
    done = threading.Event()

    def poller():
        nonlocal bodies
        while not done.is_set():
            try:
                agent._poll_body([])
            except Exception as error:  # what would end the poller thread
                failures.append(error)
                return
            bodies += 1

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=poller)
    thread.start()
    try:
        deadline = time.monotonic() + 1.5
        first = 1
        while time.monotonic() < deadline and not failures:
            batch = range(first, first + 50)
            for attempt in batch:  # as `start_all` moves granted claims to processes
                agent.claims[attempt] = order
                agent.processes[attempt] = Process(attempt=attempt, **fields)
                agent.claims.pop(attempt)
            for attempt in batch:  # as `supervise` forgets those that ended
                del agent.processes[attempt]
            first += 50
    finally:
        done.set()
        thread.join()
        sys.setswitchinterval(switch)
    assert not failures and bodies > 0


class _StubPortal(http.server.BaseHTTPRequestHandler):
    """Stands for what answers the agent: records the paths posted to and answers each with
    `ANSWER` (status, body)."""

    protocol_version = "HTTP/1.1"
    ANSWER = (404, b"")

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.paths.append(self.path)
        status, body = self.ANSWER
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _OlderPortal(_StubPortal):
    """A portal from before start grants: it does not know the start endpoint."""


class _ProxyPage(_StubPortal):
    """A proxy in front of the portal that answers with a page of its own."""

    ANSWER = (200, b"<html>maintenance</html>")


@contextlib.contextmanager
def _served(portal: type[_StubPortal]):
    """`portal` served on a port of its own (its URL in `url`, the paths it was sent in
    `paths`)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), portal)
    server.paths = []
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _agent_of(portal: type[_StubPortal], tmp_path):
    """An agent that talks to `portal` (served beside it); the processes it started are
    killed after."""
    with _served(portal) as server:
        agent = offline_agent(tmp_path, portal=server.url)
        agent.token = "t"
        try:
            yield agent, server
        finally:
            agent.stopping.set()
            for process in agent.processes.values():
                os.killpg(process.popen.pid, signal.SIGKILL)


def _polled_twice(server, path: str) -> bool:
    """Whether `path` was posted to twice within 30 s (a poller that died posts once)."""
    deadline = time.monotonic() + 30
    while server.paths.count(path) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.paths.count(path) >= 2


def test_a_portal_that_grants_no_starts_gets_its_orders_started_and_reported(tmp_path):
    """The agent asks to start its new run orders; a portal that does not know how to grant
    (404) gets them started as ordered, reported with a started event, as before grants."""
    with _agent_of(_OlderPortal, tmp_path) as (agent, server):
        order = run_order(7, 3, "sleep 30")
        agent.apply({"run": [order], "stop": []})
        assert server.paths == ["/api/v1/agent/start/"]
        assert 7 in agent.processes and not agent.claims
        assert [(e["type"], e["attempt"]) for e in agent.outbox] == [("started", 7)]
        agent.apply({"run": [{**order, "attempt": 8}], "stop": []})  # no more asking
        assert server.paths == ["/api/v1/agent/start/"] and 8 in agent.processes


def test_a_run_order_granted_in_a_poll_s_answer_starts_without_asking(tmp_path):
    """The agent's polls ask the portal to grant the starts of one-node attempts in their
    answers (`grants`): such a run order starts at once, with no request to start it (the
    agent has no portal here to ask) and no started event (the portal recorded the start when
    it granted it). A run order that is not granted (a gang's) is claimed and asked for."""
    agent = offline_agent(tmp_path, gpus=2)
    assert agent._poll_body([])["grants"] is True
    agent.to_ask = queue.Queue()
    gang = {**run_order(8, 4, "true"), "gpu_indices": [1], "node_count": 2}
    agent.apply({"run": [{**run_order(7, 3, "true"), "node_count": 1, "granted": True}, gang],
                 "stop": []})  # fmt: skip
    assert 7 in agent.processes and 7 not in agent.claims
    assert agent.to_ask.get_nowait() == [8] and agent.to_ask.empty() and 8 not in agent.processes
    assert agent._poll_body([])["running"] == [7, 8]
    assert not [e for e in agent.outbox if e["type"] == "started"]


def test_a_start_granted_in_an_answer_the_agent_was_slow_to_act_on_is_asked_for(tmp_path):
    """The answer that granted a start came longer ago than GRANT_FRESH_SECONDS when the agent
    acts on it (a loaded node): the agent does not start it on that grant, which a stop
    ordered since would not have withdrawn, but asks (`start/`), which refuses an attempt whose
    stop came first."""
    agent = offline_agent(tmp_path)
    agent.to_ask = queue.Queue()
    stale = time.monotonic() - GRANT_FRESH_SECONDS - 1
    agent.apply({"run": [{**run_order(7, 3, "true"), "node_count": 1, "granted": True}],
                 "stop": []}, received=stale)  # fmt: skip
    assert agent.to_ask.get_nowait() == [7] and 7 in agent.claims and not agent.processes


def test_a_start_answered_with_no_json_is_asked_again_later(tmp_path):
    """The starter thread gets a proxy's page for an answer: it hands back no answer (and goes
    on, or the agent would start nothing again); the claim stays, to be asked again once the
    backoff allows, and nothing starts."""
    with _agent_of(_ProxyPage, tmp_path) as (agent, server):
        agent.to_ask = queue.Queue()
        threading.Thread(target=agent.starter, daemon=True).start()
        agent.apply({"run": [run_order(7, 3, "sleep 30")], "stop": []})
        attempts, answer = agent.grants.get(timeout=30)
        agent.granted(attempts, answer)
        assert server.paths == ["/api/v1/agent/start/"] and answer is None
        assert 7 in agent.claims and not agent.asking and not agent.processes
        assert not agent.claim_backoff.ready()


def test_a_stop_that_comes_with_the_grant_of_its_start_wins(tmp_path):
    """The starter's answer granting attempt 7 and a poll's answer ordering its stop wait for
    the same turn of the main loop (the portal granted the start just before the stop was
    ordered): the stop is applied first, so the process never begins; it is reported as never
    started."""
    agent = offline_agent(tmp_path)
    agent.to_ask = queue.Queue()
    agent.apply({"run": [run_order(7, 3, "sleep 30")], "stop": []})
    assert agent.to_ask.get_nowait() == [7] and agent.asking == {7}
    agent.grants.put(([7], {"start": [7], "stop": []}))
    agent.answers.put((agent.finished.poll_sent(), {"run": [], "stop": [
        {"attempt": 7, "grace_seconds": 0, "started": True}]}, time.monotonic()))  # fmt: skip
    agent.step(0)
    assert not agent.processes and not agent.claims and not agent.asking
    assert [(e["type"], e["attempt"], e["end"]) for e in agent.outbox] == [
        ("exited", 7, "never_started")
    ]


def test_a_poll_answered_with_no_json_is_sent_again(tmp_path):
    """The poller gets a proxy's page for an answer: it keeps the events it carried and polls
    again after its backoff (it does not die, which would leave the node without heartbeats
    and orders)."""
    with _agent_of(_ProxyPage, tmp_path) as (agent, server):
        agent._event(type="log", attempt=7, log_tail="step 1")
        threading.Thread(target=agent.poller, daemon=True).start()
        assert _polled_twice(server, POLL_PATH)
        assert [e["type"] for e in agent.outbox] == ["log"] and agent.poll_events


def _connector(portal: str, tmp_path) -> Connector:
    """A connector of a Slurm cluster it never has to ask (the tests only make it talk to the
    portal)."""
    connector = Connector(portal=portal, join_token="x", name="c",
                          cluster=SlurmCluster(partitions=("gpu",),
                                               script_dir=tmp_path / "scripts"),
                          work_dir=tmp_path / "work",
                          checkpoint_root=tmp_path / "checkpoints")  # fmt: skip
    connector.token = "t"
    return connector


def test_a_connector_s_start_answered_with_no_json_is_asked_again_later(tmp_path):
    """A connector asks to start in its main loop: a proxy's page for an answer keeps the
    claim for later (after the backoff) instead of ending the connector."""
    with _served(_ProxyPage) as server:
        connector = _connector(server.url, tmp_path)
        connector.claims[7] = run_order(7, 3, "sleep 30")
        connector.claim()
        assert server.paths == [CONNECTOR_START_PATH] and 7 in connector.claims
        assert not connector.attempts and not connector.claim_backoff.ready()


def test_a_connector_poll_answered_with_no_json_is_sent_again(tmp_path):
    """The same for a connector's poller."""
    with _served(_ProxyPage) as server:
        connector = _connector(server.url, tmp_path)
        connector.cluster_ok.set()
        connector.outbox.add({"type": "log", "attempt": 7, "log_tail": "step 1"})
        threading.Thread(target=connector.poller, daemon=True).start()
        try:
            assert _polled_twice(server, CONNECTOR_POLL_PATH)
            assert [e["type"] for e in connector.outbox] == ["log"]
        finally:
            connector.stopping.set()

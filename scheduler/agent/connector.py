"""The connector's work (`gpu-agent slurm`, `gpu-agent kubernetes`): the portal decides, the
cluster manager runs. The cluster manager is driven through `scheduler.agent.cluster.Cluster`.

One process for a whole cluster. It registers every GPU node of its cluster as a portal
node, long-polls for the orders of all of them at once, and carries them out through the
cluster manager: each attempt is one job there (a gang's nodes together), submitted only once
the portal grants its start (as an agent's), signalled with SIGTERM on a stop order and
ended after the share's grace period. It watches the cluster's jobs and reports each
start (with the GPU indices the cluster gave), each end (with its exit code), and what the
cluster says of its nodes: their state, and the GPUs jobs the portal did not submit hold.
A job that ran and waits again (Slurm requeued it) is no longer running: its attempt ends
lost, as on a node that failed. Once an attempt has ended, what the cluster keeps of its job
goes (`Cluster.forget`): a job still in the cluster's queue would run outside the portal.

Threads, as the agent's: the poller long-polls the portal and hands each answer to the main
thread, which alone talks to the cluster manager; the reporter sends what the main thread has
to report. The main thread submits granted attempts one at a time, and applies an answer that
comes meanwhile before the next (`submit_granted`). While the cluster manager does not answer,
the connector stops polling: the portal hears no heartbeat, and after its timeout marks the
nodes DOWN and requeues their attempts.
When it answers again, what the cluster runs is reconciled with what the portal believes:
attempts the portal ended are cancelled, their GPUs counted as outside the portal's until
they are free."""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.agent.cluster import (
    Cluster,
    ClusterJob,
    ClusterNode,
    ClusterRefused,
    ClusterUnreachable,
)
from scheduler.agent.core import (
    CHECKPOINT_EVERY_SECONDS,
    KEEP_LOGS_DAYS,
    checkpoint_dir_made,
    checkpoint_saved_at,
    log_retention,
)
from scheduler.agent.outbox import Backoff, EndedAttempts, Outbox
from scheduler.agent.protocol import (
    CHECKPOINT_MARKER,
    CONNECTOR_ANSWER_SECONDS,
    CONNECTOR_POLL_PATH,
    CONNECTOR_REGISTER_PATH,
    CONNECTOR_REPORT_PATH,
    CONNECTOR_START_PATH,
    END_EXIT,
    END_LOST,
    END_NEVER_STARTED,
    END_TIMEOUT,
    END_WITHDRAWN,
    EVENT_CHECKPOINT,
    EVENT_EXITED,
    EVENT_LOG,
    EVENT_STARTED,
    POLL_ANSWER_SECONDS,
)
from scheduler.agent.transport import PortalClient, PortalUnreachable

logger = logging.getLogger("scheduler.agent.connector")

OBSERVE_BUSY_SECONDS = 0.25  # how often the cluster's jobs are read while the portal's run
OBSERVE_IDLE_SECONDS = 2.0
INVENTORY_SECONDS = 2.0  # how often the nodes are read
LOG_EVERY_SECONDS = 15.0
REPORT_WAIT_SECONDS = 0.5
# A job the cluster manager no longer lists though it never ended there (its records were
# purged, or its controller lost its state): lost, after this long unseen.
UNSEEN_LOST_SECONDS = 30.0
SHUTDOWN_REPORT_SECONDS = 5.0


@dataclass
class Attempt:
    """An attempt the connector has in its cluster (or is about to submit)."""

    id: int
    order: dict | None  # None: found in the cluster, its order not received yet
    job_id: str | None = None  # the cluster's
    submitted: float = field(default_factory=time.monotonic)
    running_since: float | None = None
    seen: float = field(default_factory=time.monotonic)  # last listed by the cluster
    started_reported: bool = False
    term_sent_at: float | None = None
    grace: float = 0.0
    killed: bool = False
    timed_out: bool = False
    withdrawn: str = ""  # why, once the connector withdrew it
    state: str = ""  # its job's, as last read
    orphan: bool = False  # the portal holds no GPUs for it any more
    last_log: float = field(default_factory=time.monotonic)
    nodes: tuple[str, ...] = ()
    gpus_per_node: int = 0
    # The latest checkpoint reported (epoch seconds), and when the marker was last looked at.
    checkpoint_seen: float = field(default_factory=time.time)
    checkpoint_looked: float = field(default_factory=time.monotonic)


class Connector:
    def __init__(
        self,
        *,
        portal: str,
        join_token: str,
        name: str,
        cluster: Cluster,
        work_dir: Path,
        checkpoint_root: Path,
        poll_wait: float = 10.0,
        pending_timeout: float = 60.0,
        keep_logs_days: float = KEEP_LOGS_DAYS,
    ) -> None:
        self.portal = portal.rstrip("/")
        self.join_token = join_token
        self.name = name
        self.cluster = cluster
        self.work_dir = work_dir
        self.checkpoint_root = checkpoint_root
        self.poll_wait = poll_wait
        self.pending_timeout = pending_timeout
        self.token: str | None = None
        self.http = PortalClient(self.portal)
        self.attempts: dict[int, Attempt] = {}
        self.finished = EndedAttempts()  # never started again (`Agent.finished`)
        # The attempts whose cluster jobs the cluster manager listed when last read (an ended
        # one's until it forgets it): kept among the ended ones while it does.
        self.listed: set[int] = set()
        self.claims: dict[int, dict] = {}
        # Attempts whose start the portal granted, not submitted yet: submitted one by one
        # while no answer of the portal waits (`submit_granted`).
        self.granted: dict[int, dict] = {}
        self.claim_backoff = Backoff()
        self.outbox = Outbox(self.finished)
        self.lock = threading.Lock()
        self.answers: queue.Queue[tuple[int, dict]] = queue.Queue()  # (poll number, answer)
        self.applied = threading.Event()
        self.poll_due = threading.Event()
        self.stopping = threading.Event()
        # Set while the cluster manager answers: the poller polls (a heartbeat) only then.
        self.cluster_ok = threading.Event()
        self.full_orders = True  # the next poll asks for every order (after a (re)start)
        self.registered: set[str] = set()  # the nodes of the last registration
        self.register_due = threading.Event()  # the cluster's nodes are not those any more
        self.nodes: dict[str, ClusterNode] = {}  # as last read
        self.inventory_sent: dict[str, dict] = {}  # node name → as the portal last took it
        self.inventory_due = True  # send every node with the next poll
        self.last_observe = 0.0
        self.last_inventory = 0.0
        # Attempts that ended after the nodes were last read began: (when, nodes, GPUs per
        # node). That reading still counts their GPUs as used, though nobody holds them now.
        self.ended_since_inventory: list[tuple[float, tuple[str, ...], int]] = []
        self.log_retention = log_retention(work_dir, keep_logs_days)
        (work_dir / "logs").mkdir(parents=True, exist_ok=True)
        checkpoint_root.mkdir(parents=True, exist_ok=True)

    # --- The portal --------------------------------------------------------------------------

    def _headers(self) -> dict:
        return {"Authorization": f"Connector {self.token}"}

    def register(self) -> None:
        """Register with every node, once the cluster manager answers; a refused join token or
        node is fatal."""
        backoff = Backoff()
        while not self.stopping.is_set():
            try:
                self.read_inventory()
                body = {"join_token": self.join_token, "name": self.name,
                        "kind": self.cluster.kind, "nodes": self._inventory()}  # fmt: skip
                response = self.http.post(CONNECTOR_REGISTER_PATH, json=body,
                                          timeout=CONNECTOR_ANSWER_SECONDS)  # fmt: skip
            except ClusterUnreachable as error:
                logger.warning("%s does not answer (%s); retrying", self.cluster.manager, error)
            except PortalUnreachable as error:
                logger.warning("portal unreachable (%s); retrying", error)
            else:
                if response.status_code == 201:
                    self.token = response.json()["token"]
                    self.registered = {n["name"] for n in body["nodes"]}
                    self.register_due.clear()
                    self.inventory_sent = {n["name"]: n for n in body["nodes"]}
                    self.inventory_due = False
                    self.full_orders = True
                    logger.info("registered cluster %s: %d nodes", self.name, len(body["nodes"]))
                    return
                if 400 <= response.status_code < 500:
                    raise SystemExit(f"registration refused: {response.text}")
                logger.warning("registration failed (%s); retrying", response.status_code)
            backoff.failed()
            self.stopping.wait(backoff.delay)

    def _inventory(self) -> list[dict]:
        """Every node as the portal takes it, with the GPUs held outside the portal: those the
        cluster's jobs hold but for the portal's attempts that it still holds GPUs for."""
        ours: dict[str, int] = {}
        with self.lock:
            for attempt in self.attempts.values():
                if attempt.orphan or not self._holds_in_cluster(attempt):
                    continue
                for node in attempt.nodes:
                    ours[node] = ours.get(node, 0) + attempt.gpus_per_node
            # Freed since the nodes were read: not outside the portal's (counted so, an owner's
            # job would not be placed on the GPUs its victim just released, and the portal
            # would preempt a second borrower for it).
            for _, nodes, gpus_per_node in self.ended_since_inventory:
                for node in nodes:
                    ours[node] = ours.get(node, 0) + gpus_per_node
        return [
            {"name": node.name, "gpu_type": node.gpu_type, "gpus": node.gpus,
             "state": node.state, "reason": node.reason,
             "outside_gpus": min(node.gpus, max(0, node.used_gpus - ours.get(node.name, 0)))}
            for node in self.nodes.values()
        ]  # fmt: skip

    def _holds_in_cluster(self, attempt: Attempt) -> bool:
        """Whether the cluster counts the attempt's GPUs as used (once its job runs, or, where
        the cluster holds them while a job is pending, once it is submitted)."""
        if attempt.job_id is None:
            return False
        return attempt.running_since is not None or self.cluster.holds_while_pending

    def _inventory_changes(self) -> list[dict]:
        """The nodes to send: all of them when due, else those that changed."""
        nodes = self._inventory()
        if self.inventory_due:
            return nodes
        return [n for n in nodes if self.inventory_sent.get(n["name"]) != n]

    def _inventory_taken(self, nodes: list[dict]) -> None:
        for node in nodes:
            self.inventory_sent[node["name"]] = node

    def _poll_body(self, events: list[dict], nodes: list[dict]) -> dict:
        pending = self.outbox.pending_exits()
        with self.lock:
            body = {
                "running": sorted(set(self.attempts) | set(self.granted) | pending),
                "stopping": sorted(
                    {a for a, t in self.attempts.items() if t.term_sent_at is not None} | pending
                ),
                "wait": 0 if self.full_orders else self.poll_wait,
                "full": self.full_orders,
            }
        if events:
            body["events"] = events
        if nodes:
            body["nodes"] = nodes
        return body

    def poller(self) -> None:
        backoff = Backoff()
        while not self.stopping.is_set():
            if not self.cluster_ok.wait(0.5):
                continue  # no heartbeat while the cluster manager does not answer
            if self.register_due.is_set():
                self.register_due.clear()
                added, gone = set(self.nodes) - self.registered, self.registered - set(self.nodes)
                logger.info("the cluster's nodes changed (new: %s; gone: %s); registering again",
                            ", ".join(sorted(added)) or "none",
                            ", ".join(sorted(gone)) or "none")  # fmt: skip
                self.register()
                continue
            events = self.outbox.take()
            full = self.full_orders
            # After a (re)start or a time out of touch, the first poll asks for every order and
            # sends no node: the orphans its answer names are counted outside the portal's
            # GPUs in the inventory the next poll sends.
            nodes = [] if full else self._inventory_changes()
            self.poll_due.clear()
            poll = self.finished.poll_sent()
            try:
                response = self.http.post(
                    CONNECTOR_POLL_PATH,
                    json=self._poll_body(events, nodes),
                    headers=self._headers(),
                    timeout=self.poll_wait + POLL_ANSWER_SECONDS,
                )
            except PortalUnreachable as error:
                self.outbox.sent(events, delivered=False)
                logger.warning("poll failed (%s); jobs keep running", error)
                self.inventory_due = self.full_orders = True
                backoff.failed()
                self.stopping.wait(backoff.delay)
                continue
            answer = response.answer() if response.status_code == 200 else {}
            if answer is None:  # not the portal's answer (a proxy's page): as if unreachable
                self.outbox.sent(events, delivered=False)
                self.inventory_due = self.full_orders = True
                backoff.failed()
                self.stopping.wait(backoff.delay)
                continue
            delivered = "results" in answer
            if delivered or not self.outbox.refused(events, response, what="poll"):
                self.outbox.sent(events, delivered=delivered, poll=poll)
            if response.status_code == 401:
                logger.warning("the portal no longer knows this connector; registering again")
                self.register()
                continue
            if response.status_code != 200:
                logger.warning("poll answered %s: %s", response.status_code, response.text[:300])
                backoff.failed()
                self.stopping.wait(backoff.delay)
                continue
            backoff.succeeded()
            self._inventory_taken(nodes)
            if nodes and len(nodes) == len(self.nodes):
                self.inventory_due = False
            if answer.get("resend_nodes"):
                self.inventory_due = True
            if full:
                self.full_orders = False
            self.applied.clear()
            self.poll_due.set()
            self.answers.put((poll, answer))
            while not self.applied.wait(0.5):
                if self.stopping.is_set():
                    return

    def reporter(self) -> None:
        """Report events as they come, and node changes, unless a poll is about to carry
        them."""
        while not self.stopping.is_set():
            self.outbox.filled.wait(REPORT_WAIT_SECONDS)
            if self.poll_due.is_set() or self.token is None:
                self.stopping.wait(0.01)
                continue
            self.outbox.filled.clear()
            nodes = [] if self.inventory_due else self._inventory_changes()
            if self.outbox.report(self.http, CONNECTOR_REPORT_PATH, self._headers,
                                  extra={"nodes": nodes} if nodes else None):  # fmt: skip
                self._inventory_taken(nodes)

    def _event(self, **event) -> None:
        self.outbox.add(event)

    # --- Orders ------------------------------------------------------------------------------

    def apply(self, orders: dict, *, answered: int | None = None) -> None:
        """Reconcile with the portal's orders, as the agent does (`Agent.apply`). An attempt the
        connector has in the cluster and the portal no longer holds GPUs for comes as an orphan
        stop: the portal computes those from what the connector says it runs."""
        ordered = set()
        for order in orders.get("run", []):
            attempt_id = order["attempt"]
            ordered.add(attempt_id)
            if attempt_id in self.granted:
                continue  # its submission is on its way
            tracked = self.attempts.get(attempt_id)
            if tracked is not None:
                if tracked.order is None:  # found in the cluster after a restart: adopted
                    tracked.order = order
                    tracked.grace = float(order["grace_seconds"])
                continue
            if attempt_id in self.finished:
                continue
            if order.get("started"):
                # Started before, and not in the cluster any more (the connector's view of the
                # cluster is fresh, see run()).
                self._gone(attempt_id, order)
            else:
                self.claims[attempt_id] = order
        for order in orders.get("stop", []):
            attempt_id = order["attempt"]
            ordered.add(attempt_id)
            self.claims.pop(attempt_id, None)
            if attempt_id in self.granted:
                # Its start was granted, and it has not been submitted yet: the stop wins.
                with self.lock:
                    del self.granted[attempt_id]
                self._end(attempt_id, end=END_NEVER_STARTED, detail="stopped before it started")
                continue
            tracked = self.attempts.get(attempt_id)
            if tracked is not None:
                tracked.orphan = tracked.orphan or bool(order.get("orphan"))
                if tracked.term_sent_at is None:
                    tracked.grace = float(order.get("grace_seconds", 0))
                    self.terminate(tracked)
            elif attempt_id not in self.finished and not order.get("orphan"):
                if order.get("started"):
                    self._gone(attempt_id, order)
                else:
                    self._end(attempt_id, end=END_NEVER_STARTED, detail="stopped before it started")
        for attempt_id in set(self.claims) - ordered:
            del self.claims[attempt_id]
        if answered is not None:
            self.finished.forget(answered=answered, keep=ordered | self.listed)
        self.claim()

    def _gone(self, attempt_id: int, order: dict) -> None:
        """An attempt the portal says started that the cluster no longer lists (it ended, and
        was purged, while the connector was away): its end as the cluster's records have it
        (Slurm's sacct or job-completion log), else lost (the portal runs it again)."""
        job_id = order.get("cluster_job_id")
        ended = None
        if job_id:
            with contextlib.suppress(ClusterUnreachable, ClusterRefused):
                ended = self.cluster.ended_job(str(job_id))
        if ended is None or ended.end is None:
            self._end(attempt_id, end=END_LOST, detail=f"not in {self.cluster.manager} any more")
            return
        tracked = Attempt(id=attempt_id, order=order if "command" in order else None,
                          job_id=str(job_id), running_since=time.monotonic(),
                          started_reported=True, nodes=ended.nodes)  # fmt: skip
        self._ended(tracked, ended)

    def claim(self) -> None:
        attempt_ids = sorted(self.claims)
        if not attempt_ids or not self.claim_backoff.ready():
            return
        try:
            response = self.http.post(
                CONNECTOR_START_PATH, json={"attempts": attempt_ids}, headers=self._headers(),
                timeout=CONNECTOR_ANSWER_SECONDS,
            )  # fmt: skip
        except PortalUnreachable as error:
            logger.warning("could not ask to start %d attempt(s) (%s)", len(attempt_ids), error)
            self.claim_backoff.failed()
            return
        if response.status_code != 200:
            logger.warning("start refused (%s): %s", response.status_code, response.text[:200])
            self.claim_backoff.failed()
            return
        answer = response.answer()
        if answer is None:  # not the portal's answer (a proxy's page): asked again later
            self.claim_backoff.failed()
            return
        self.claim_backoff.succeeded()
        granted = set(answer.get("start", []))
        for attempt_id in attempt_ids:
            order = self.claims.pop(attempt_id)
            if attempt_id in granted:
                with self.lock:
                    self.granted[attempt_id] = order

    def submit_granted(self) -> None:
        """Submit the granted attempts one by one, in the order of their ids, while no answer
        of the portal waits: its stop orders are applied first. So a stop that comes before its
        attempt is submitted wins (it never starts), and one for an attempt already in the
        cluster is not held up by a long batch of submissions (each an sbatch, or a pod)."""
        while self.granted and self.answers.empty() and not self.stopping.is_set():
            attempt_id = min(self.granted)
            self.submit(self.granted[attempt_id])
            with self.lock:  # after it is among the attempts: a poll lists it all along
                del self.granted[attempt_id]

    def submit(self, order: dict) -> None:
        attempt_id, job = order["attempt"], order["job"]
        checkpoint_dir, unusable = checkpoint_dir_made(
            self.checkpoint_root, job, where=f"the host of connector {self.name}"
        )
        if unusable:
            self._end(attempt_id, end=END_NEVER_STARTED, detail=unusable)
            return
        env = {str(k): str(v) for k, v in (order.get("env") or {}).items()}
        env.update(
            {
                "JOB_ID": str(job),
                "ATTEMPT": str(order["number"]),
                "CHECKPOINT_DIR": str(checkpoint_dir),
                "PREEMPT_GRACE_SECONDS": str(order["grace_seconds"]),
            }
        )
        nodes = [a["node"] for a in order["nodes"]]
        log = self._log_path(order)
        tracked = Attempt(id=attempt_id, order=order, grace=float(order["grace_seconds"]),
                          nodes=tuple(nodes),
                          gpus_per_node=len(order["nodes"][0]["gpu_indices"]))  # fmt: skip
        manager = self.cluster.manager
        try:
            tracked.job_id = self.cluster.submit(order, env=env, log=log)
        except ClusterRefused as error:
            self._end(attempt_id, end=END_NEVER_STARTED, detail=f"{manager} refused it: {error}")
            return
        except ClusterUnreachable as error:
            # Not known to be submitted: the portal hears it was withdrawn, and requeues it.
            self._end(attempt_id, end=END_WITHDRAWN, detail=f"{manager} did not answer: {error}")
            return
        with self.lock:
            self.attempts[attempt_id] = tracked
        logger.info("attempt %s (job %s) is %s job %s on %s", attempt_id, job, manager,
                    tracked.job_id, ",".join(nodes))  # fmt: skip

    def _logs_in_use(self) -> set[Path] | None:
        """The logs of the attempts the connector has; None while one found in the cluster after
        a restart has no order yet (its log is named by it)."""
        with self.lock:
            attempts = list(self.attempts.values())
        if any(attempt.order is None for attempt in attempts):
            return None
        return {self._log_path(attempt.order) for attempt in attempts}

    def _log_path(self, order: dict) -> Path:
        return self.work_dir / "logs" / f"job-{order['job']}-attempt-{order['number']}.log"

    def terminate(self, tracked: Attempt) -> None:
        tracked.term_sent_at = time.monotonic()
        if tracked.job_id is None:
            return
        started = tracked.running_since is not None
        if started:
            how = f"SIGTERM, {tracked.grace:.0f} s grace"
        elif self.cluster.holds_while_pending:
            # Bound to its nodes, it may be starting there already: it is stopped as if it ran.
            how = f"not seen running yet; SIGTERM, {tracked.grace:.0f} s grace"
        else:
            how = "not started; withdrawn"
        logger.info("attempt %s: %s job %s: %s", tracked.id, self.cluster.manager,
                    tracked.job_id, how)  # fmt: skip
        try:
            self.cluster.terminate(tracked.job_id, grace=tracked.grace, started=started)
        except (ClusterRefused, ClusterUnreachable) as error:
            logger.warning("attempt %s: stop failed (%s); trying again", tracked.id, error)
            tracked.term_sent_at = None

    def _end(self, attempt_id: int, *, end: str, exit_code=None, signalled=False, log_tail="",
             detail="") -> None:  # fmt: skip
        self.finished.add(attempt_id)
        with self.lock:
            tracked = self.attempts.pop(attempt_id, None)
            if tracked is not None and self._holds_in_cluster(tracked):
                self.ended_since_inventory.append(
                    (time.monotonic(), tracked.nodes, tracked.gpus_per_node)
                )
        said = {}
        if tracked is not None and tracked.job_id is not None:
            with contextlib.suppress(ClusterRefused, ClusterUnreachable):
                self.cluster.forget(tracked.job_id)
            if not tracked.started_reported and tracked.order is not None:
                # Ended before the connector saw it start (stopped while the cluster was still
                # starting it): the portal still learns which cluster job the attempt was.
                said["cluster_job"] = {"id": tracked.job_id, "allocations": []}
        self._event(type=EVENT_EXITED, attempt=attempt_id, end=end, exit_code=exit_code,
                    signalled=signalled, log_tail=log_tail, detail=detail, **said)  # fmt: skip

    # --- Watching the cluster ----------------------------------------------------------------

    def read_inventory(self) -> None:
        """Read the nodes; a node that joined the cluster, or left it, since the registration
        makes the connector register again (the portal takes its nodes from a registration:
        those that left go DOWN)."""
        began = time.monotonic()
        nodes = self.cluster.nodes()
        with self.lock:
            self.nodes = {node.name: node for node in nodes}
            self.ended_since_inventory = [
                ended for ended in self.ended_since_inventory if ended[0] >= began
            ]
        self.last_inventory = time.monotonic()
        if self.token is not None and set(self.nodes) != self.registered:
            self.register_due.set()

    def observe(self) -> None:
        """Read the cluster's jobs, and move each attempt on: started, ended, pending too
        long. Raises ClusterUnreachable."""
        listed = self.cluster.attempt_jobs()
        self.listed = set(listed)
        ours = {
            attempt_id: job for attempt_id, job in listed.items() if attempt_id not in self.finished
        }
        now = time.monotonic()
        self.last_observe = now
        for attempt_id, job in ours.items():
            if attempt_id not in self.attempts:
                # Submitted by an earlier run of the connector: adopted (an ended one is
                # reported at once); the next poll asks for every order.
                with self.lock:
                    self.attempts[attempt_id] = Attempt(
                        id=attempt_id, order=None, job_id=job.id, nodes=job.nodes,
                        gpus_per_node=job.gpus_per_node,
                    )  # fmt: skip
                self.full_orders = True
        for tracked in list(self.attempts.values()):
            job = ours.get(tracked.id)
            if job is None or job.id != tracked.job_id:
                if tracked.job_id is not None and now - tracked.seen > UNSEEN_LOST_SECONDS:
                    ended = self.cluster.ended_job(tracked.job_id)
                    if ended is not None:
                        self._follow(tracked, ended, now)
                    else:
                        self._end(tracked.id, end=END_LOST, detail=f"{self.cluster.manager} no "
                                  f"longer knows job {tracked.job_id}")  # fmt: skip
                continue
            tracked.seen = now
            self._follow(tracked, job, now)

    def _follow(self, tracked: Attempt, job: ClusterJob, now: float) -> None:
        if job.state != tracked.state:
            tracked.state = job.state
            logger.debug("attempt %s: %s job %s %s %s", tracked.id, self.cluster.manager,
                         job.id, job.state, job.reason)  # fmt: skip
        ran = job.holding or (job.end is not None and bool(job.nodes))
        if ran and tracked.running_since is None:
            tracked.running_since = now
            tracked.nodes = job.nodes or tracked.nodes
            if tracked.order is None:
                # Adopted already running after a restart: its start was reported before.
                tracked.started_reported = True
        if ran and not tracked.started_reported and tracked.order is not None:
            # An ended job's start is reported now, before its end.
            waited = math.inf if job.end is not None else now - tracked.running_since
            described = self.cluster.describe(job, waited=waited)
            if described is not None:
                tracked.started_reported = True
                self._event(type=EVENT_STARTED, attempt=tracked.id, cluster_job=described)
        if job.end is not None:
            self._ended(tracked, job)
            return
        if job.pending and tracked.running_since is not None:
            # It ran, and waits again: the cluster manager requeued it (Slurm, after a node
            # failure or a prolog that failed with PrologFlags=ForceRequeueOnFail, or an
            # operator's `scontrol requeue`). Its processes are gone, and no stop can signal a
            # job that waits: the attempt is lost, and `_end` has the cluster manager cancel the
            # job (`forget`), which would otherwise run again outside the portal.
            logger.info("attempt %s: %s requeued job %s after it ran (%s %s); lost", tracked.id,
                        self.cluster.manager, job.id, job.state, job.reason)  # fmt: skip
            self._lost(tracked, job, how=f"requeued job {job.id} after it ran",
                       log_tail=self._tail(tracked))  # fmt: skip
            return
        if job.pending and tracked.term_sent_at is None:
            if now - tracked.submitted >= self.pending_timeout:
                tracked.withdrawn = (
                    f"{self.cluster.manager} kept job {job.id} pending "
                    f"{self.pending_timeout:g} s ({job.reason})"
                )
                logger.info("attempt %s: %s; withdrawn", tracked.id, tracked.withdrawn)
                self.terminate(tracked)
        elif job.pending and tracked.term_sent_at is not None and not tracked.killed:
            tracked.killed = True
            with contextlib.suppress(ClusterRefused, ClusterUnreachable):
                self.cluster.kill(job.id)

    def _ended(self, tracked: Attempt, job: ClusterJob) -> None:
        signalled = tracked.term_sent_at is not None
        tail = self._tail(tracked)
        if tracked.withdrawn:
            # Withdrawn, even if Slurm started it just before the cancel reached it.
            self._end(tracked.id, end=END_WITHDRAWN, detail=tracked.withdrawn)
        elif job.end == END_WITHDRAWN:
            # The cluster manager would not run it where the portal placed it.
            self._end(tracked.id, end=END_WITHDRAWN, detail=job.reason)
        elif job.end == END_NEVER_STARTED:
            self._end(tracked.id, end=END_NEVER_STARTED, detail=job.reason)
        elif job.end == END_LOST and not signalled:
            # Its node went down, or the cluster took it (an eviction, someone's delete), before
            # or after it started.
            self._lost(tracked, job, how=f"job {job.id} ended {job.state}",
                       exit_code=job.exit_code, log_tail=tail)  # fmt: skip
        elif tracked.running_since is None or (job.state == "CANCELLED" and not job.nodes):
            self._end(tracked.id, end=END_NEVER_STARTED, detail=f"{self.cluster.manager} ended "
                      f"job {job.id} before it ran ({job.state})")  # fmt: skip
        elif tracked.timed_out or job.end == END_TIMEOUT:
            self._end(tracked.id, end=END_TIMEOUT, exit_code=job.exit_code, signalled=True,
                      log_tail=tail)  # fmt: skip
        else:
            exit_code = job.exit_code
            if job.state == "CANCELLED" and not signalled:
                # Cancelled in the cluster by someone else (an operator's scancel, a pod
                # deleted): not a success.
                exit_code = exit_code if exit_code else -15
            self._end(tracked.id, end=END_EXIT, exit_code=exit_code, signalled=signalled,
                      log_tail=tail, detail=f"{self.cluster.manager}: {job.state}")  # fmt: skip
        logger.info("attempt %s: %s job %s ended %s (exit %s)", tracked.id, self.cluster.manager,
                    job.id, job.state, job.exit_code)  # fmt: skip

    def _lost(self, tracked: Attempt, job: ClusterJob, *, how: str, exit_code: int | None = None,
              log_tail: str = "") -> None:  # fmt: skip
        """End the attempt lost, as on a node that failed: the portal runs the job again, as a
        new attempt, counting neither a failure nor a preemption. The portal hears of the
        nodes with the loss, so that it does not place the job again on a node that is down."""
        with contextlib.suppress(ClusterUnreachable, ClusterRefused):
            self.read_inventory()
        self._end(tracked.id, end=END_LOST, exit_code=exit_code, log_tail=log_tail,
                  detail=f"{self.cluster.manager} {how} ({job.reason})")  # fmt: skip

    def _tail(self, tracked: Attempt) -> str:
        if tracked.order is None or tracked.job_id is None:
            return ""
        try:
            return self.cluster.log_tail(tracked.job_id, self._log_path(tracked.order))
        except (ClusterRefused, ClusterUnreachable) as error:
            logger.debug("attempt %s: no log tail (%s)", tracked.id, error)
            return ""

    def _look_for_checkpoint(self, tracked: Attempt) -> None:
        """Report a checkpoint the job saved since the last one reported (docs/agent.md): its
        CHECKPOINT_DIR is on a file system the connector sees too (docs/slurm.md,
        docs/kubernetes.md)."""
        assert tracked.order is not None
        marker = self.checkpoint_root / f"job-{tracked.order['job']}" / CHECKPOINT_MARKER
        saved = checkpoint_saved_at(marker, after=tracked.checkpoint_seen)
        if saved is not None:
            tracked.checkpoint_seen = saved
            self._event(type=EVENT_CHECKPOINT, attempt=tracked.id,
                        age=max(0.0, time.time() - saved))  # fmt: skip

    def supervise(self) -> None:
        """Timeouts, grace periods, log tails, checkpoints."""
        now = time.monotonic()
        for tracked in list(self.attempts.values()):
            if tracked.term_sent_at is None:
                timeout = (tracked.order or {}).get("timeout_seconds")
                if (
                    tracked.running_since is not None
                    and timeout
                    and (now - tracked.running_since >= float(timeout))
                ):
                    tracked.timed_out = True
                    self.terminate(tracked)
                elif tracked.running_since is not None and now - tracked.last_log >= (
                    LOG_EVERY_SECONDS
                ):
                    tracked.last_log = now
                    self._event(type=EVENT_LOG, attempt=tracked.id, log_tail=self._tail(tracked))
                if (
                    tracked.running_since is not None
                    and tracked.order is not None
                    and now - tracked.checkpoint_looked >= CHECKPOINT_EVERY_SECONDS
                ):
                    tracked.checkpoint_looked = now
                    self._look_for_checkpoint(tracked)
            elif (
                not tracked.killed
                and not self.cluster.enforces_grace
                and now - tracked.term_sent_at >= tracked.grace
            ):
                tracked.killed = True
                logger.info("attempt %s: grace over, killed", tracked.id)
                try:
                    if tracked.job_id is not None:
                        self.cluster.kill(tracked.job_id)
                except (ClusterRefused, ClusterUnreachable) as error:
                    logger.warning("attempt %s: kill failed (%s)", tracked.id, error)
                    tracked.killed = False

    # --- Main loop ---------------------------------------------------------------------------

    def step(self) -> None:
        busy = bool(self.attempts or self.claims or self.granted)
        wait = OBSERVE_BUSY_SECONDS if busy else OBSERVE_IDLE_SECONDS
        try:
            answered, orders = self.answers.get(
                timeout=0 if self.granted else max(0.0, self.last_observe + wait - time.monotonic())
            )
        except queue.Empty:
            answered, orders = None, None
        now = time.monotonic()
        try:
            if orders is not None or now - self.last_observe >= wait:
                # The cluster's jobs are read before an answer is applied: an attempt the
                # portal says started, and that the cluster no longer has, is lost.
                self.observe()
            if now - self.last_inventory >= INVENTORY_SECONDS:
                self.read_inventory()
            if not self.cluster_ok.is_set():
                logger.info("%s answers again", self.cluster.manager)
                self.inventory_due = self.full_orders = True
                self.cluster_ok.set()
        except ClusterUnreachable as error:
            if self.cluster_ok.is_set():
                logger.warning("%s does not answer (%s): no heartbeat to the portal until it "
                               "does", self.cluster.manager, error)  # fmt: skip
            self.cluster_ok.clear()
            self.last_observe = now
        if orders is not None:
            self.apply(orders, answered=answered)
        elif self.claims:
            self.claim()
        if self.cluster_ok.is_set():
            self.supervise()
        if orders is not None:
            self.applied.set()  # the poller polls again while the granted ones are submitted
        self.submit_granted()
        self.log_retention.prune_when_due(self._logs_in_use)

    def run(self) -> None:
        self.cluster.start()
        self.register()
        if self.stopping.is_set():
            return
        try:
            self.cluster.discover()
            self.observe()  # what the cluster already runs for the portal, before the first poll
            self.cluster_ok.set()
        except ClusterUnreachable as error:
            logger.warning("%s does not answer (%s)", self.cluster.manager, error)
        for target in (self.poller, self.reporter):
            threading.Thread(target=target, name=target.__name__, daemon=True).start()
        while not self.stopping.is_set():
            self.step()
        self.shutdown()

    def shutdown(self) -> None:
        """Jobs keep running in the cluster when the connector stops (a restarted connector
        adopts them); the last reports go out first."""
        deadline = time.monotonic() + SHUTDOWN_REPORT_SECONDS
        while len(self.outbox) and time.monotonic() < deadline:
            self.outbox.backoff.succeeded()
            taken = self.outbox.report(self.http, CONNECTOR_REPORT_PATH, self._headers,
                                       everything=True)  # fmt: skip
            if len(self.outbox) and not taken:
                time.sleep(0.2)  # batch after batch while the portal takes them
        if len(self.outbox):
            logger.warning("leaving with %d unsent report(s)", len(self.outbox))

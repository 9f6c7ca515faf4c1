"""A Hypothesis state machine over the services layer, on the real database.

Random submits (valid and not), cancels, priority changes, what agents report (orders
delivered, attempts started, exits with 0 or not, stop confirmations, timeouts, lost processes,
replayed reports), share edits (limits lowered and raised, strategy switched, disabled and
enabled, lend_limit, borrow_limit), node joins, restarts, drains and losses, and scheduling
cycles, in any order. After every step the invariants below must hold; they are written here
as small functions, each stating one rule of DESIGN §2.

Each example starts from the same world: four shares (a LEND lender, a LEND_AND_BORROW
borrower with a borrow cap, a RESERVE share, a LEND_AND_BORROW share with in-share
preemption), two 8-GPU h100 nodes and one 4-GPU l4 node.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import Sum
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from portal.redis import redis_client
from scheduler.cycle.idle import _fingerprint_key
from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_cancel, job_set_priority, job_submit
from scheduler.models import (
    MAX_PRIORITY,
    MAX_TIMEOUT_SECONDS,
    ClusterSettings,
    GpuAssignment,
    Job,
    JobAttempt,
    JobEvent,
    Node,
)
from scheduler.nodes.attempts import (
    END_EXIT,
    END_LOST,
    END_NEVER_STARTED,
    END_TIMEOUT,
    attempt_exited,
    attempt_started,
    attempts_start,
)
from scheduler.nodes.services import node_heartbeat, node_orders, node_register, node_set_state
from shares.models import CapacityLimit, Membership, QuotaShare, ShareChange, Team
from shares.selectors import share_usage
from shares.services import share_create, share_set_state, share_update
from tests.conftest import create_persona

pytestmark = pytest.mark.django_db(transaction=True)

JOIN_TOKEN = "stateful-join-token"
GPU_TYPES = ("h100", "l4")
NODE_NAMES = tuple(f"node-{i}" for i in range(6))
SHARES = ("vision", "research", "infer", "batch")
USERS = ("alice", "carol", "ivan", "bea")
RESERVE, LEND, LEND_AND_BORROW = (
    QuotaShare.Strategy.RESERVE,
    QuotaShare.Strategy.LEND,
    QuotaShare.Strategy.LEND_AND_BORROW,
)
RUNNING_STATES = (Job.State.SCHEDULED, Job.State.STARTING, Job.State.RUNNING)


# --- Invariants ---------------------------------------------------------------------------------


def assert_no_gpu_held_twice() -> None:
    """No GPU index of a node is held by two open attempts; a GPU still held belongs to an open
    attempt; every held index exists on its node."""
    holder: dict[tuple[int, int], int] = {}
    sizes = dict(Node.objects.values_list("pk", "gpus"))
    for node_id, index, attempt_id, ended_at in GpuAssignment.objects.filter(
        released=False
    ).values_list("node_id", "gpu_index", "attempt_id", "attempt__ended_at"):
        assert ended_at is None, f"attempt {attempt_id} ended but still holds GPU {index}"
        assert holder.setdefault((node_id, index), attempt_id) == attempt_id, (
            f"GPU {index} of node {node_id} held by attempts {holder[(node_id, index)]} "
            f"and {attempt_id}"
        )
        assert 0 <= index < sizes[node_id], f"GPU index {index} beyond node {node_id}"


def assert_every_job_in_one_valid_state() -> None:
    """Every job is in one known state, and its attempts agree: a running job has exactly one
    open attempt, a stopping job at most one (none only while its cancel is being turned into
    CANCELLED), a queued or ended job none."""
    open_attempts = Counter(
        JobAttempt.objects.filter(ended_at__isnull=True).values_list("job_id", flat=True)
    )
    attempts = Counter(JobAttempt.objects.values_list("job_id", flat=True))
    for job in Job.objects.values(
        "pk", "state", "cancel_requested", "attempt_count", "finished_at"
    ):
        state, n_open = job["state"], open_attempts[job["pk"]]
        assert state in Job.State.values and state != Job.State.SUBMITTED, job
        if state in RUNNING_STATES:
            assert n_open == 1, f"job {job['pk']} {state} with {n_open} open attempts"
        elif state == Job.State.PREEMPTING:
            assert n_open == 1 or (n_open == 0 and job["cancel_requested"]), (
                f"job {job['pk']} PREEMPTING with {n_open} open attempts (lost)"
            )
        else:
            assert n_open == 0, f"job {job['pk']} {state} still has an open attempt"
        assert attempts[job["pk"]] == job["attempt_count"], job
        assert (job["finished_at"] is not None) == (state in Job.FINAL_STATES), job


def assert_preemptions_recorded() -> None:
    """A PREEMPTED attempt names the job it was preempted for, and its job is not lost: it is
    queued again, placed again, or ended (max_preemptions, cancel, success)."""
    for attempt in JobAttempt.objects.filter(outcome=JobAttempt.Outcome.PREEMPTED).values(
        "pk", "preempted_for_id", "job__state", "job__preemption_count", "job_id"
    ):
        assert attempt["preempted_for_id"] is not None, f"attempt {attempt['pk']}: for whom?"
        if attempt["job__state"] == Job.State.PREEMPTING:
            assert JobAttempt.objects.filter(
                job_id=attempt["job_id"], ended_at__isnull=True
            ).exists(), f"job {attempt['job_id']} lost after preemption"
    counts = Counter(
        JobAttempt.objects.filter(outcome=JobAttempt.Outcome.PREEMPTED).values_list(
            "job_id", flat=True
        )
    )
    for job_id, preemption_count in Job.objects.filter(pk__in=counts).values_list(
        "pk", "preemption_count"
    ):
        assert preemption_count == counts[job_id], f"job {job_id} miscounts its preemptions"
    # A stop order for a reclaim is only ever on a job that is stopping.
    for state in JobAttempt.objects.filter(
        ended_at__isnull=True, stop_requested_at__isnull=False
    ).values_list("job__state", flat=True):
        assert state == Job.State.PREEMPTING


def borrow_cap(share: QuotaShare, limit: int) -> int | None:
    """Extra GPUs the share may use above `limit`; None: no cap beyond the cluster."""
    if share.strategy != LEND_AND_BORROW:
        return 0
    if share.borrow_limit == -1:
        return None
    return limit * share.borrow_limit // 100


def placed_usage() -> dict[tuple[int, str], int]:
    return {
        (row["share_id"], row["gpu_type"]): row["total"]
        for row in Job.objects.filter(state__in=Job.PLACED_STATES)
        .values("share_id", "gpu_type")
        .annotate(total=Sum("gpus"))
    }


def assert_admissions_within_caps(new_attempts: list[JobAttempt]) -> None:
    """A job admitted by this cycle runs on READY nodes of its type with the GPUs it asked for,
    and leaves its share within its limit plus its borrow cap (a RESERVE or LEND share never
    borrows)."""
    usage = placed_usage()
    nodes = {node.name: node for node in Node.objects.all()}
    for attempt in new_attempts:
        job = attempt.job
        share = job.share
        per_node = job.gpus // job.nodes
        assert len(attempt.allocations) == job.nodes
        assert len({a["node"] for a in attempt.allocations}) == job.nodes
        for allocation in attempt.allocations:
            node = nodes[allocation["node"]]
            assert node.state == Node.State.READY, f"placed on {node.state} node {node.name}"
            assert node.gpu_type == job.gpu_type
            assert len(allocation["gpu_indices"]) == per_node
        assert 0 <= attempt.borrowed_gpus <= job.gpus
        limit = share.limits.get(job.gpu_type, 0)
        cap = borrow_cap(share, limit)
        used = usage.get((share.pk, job.gpu_type), 0)
        assert cap is None or used <= limit + cap, (
            f"share {share.name} uses {used} {job.gpu_type} after admitting job {job.pk}: "
            f"above its limit {limit} + borrow cap {cap}"
        )
        if attempt.borrowed_gpus:
            assert share.strategy == LEND_AND_BORROW, f"{share.strategy} share borrowed"


def borrowing_within_lendable() -> dict[str, bool]:
    """Per GPU type: do the GPUs borrowed by all shares fit in the free pool plus what lenders
    can lend (idle quota of non-RESERVE shares, within lend_limit)?"""
    report = share_usage()
    fits = {}
    for gpu_type, pool in report.pool.items():
        rows = [types[gpu_type] for types in report.shares.values() if gpu_type in types]
        borrowed = sum(row.borrowed for row in rows)
        lendable = sum(row.lent + row.lendable for row in rows)
        fits[gpu_type] = borrowed <= pool.free_pool + lendable
    return fits


# --- The machine --------------------------------------------------------------------------------


def pick(items, index: int):
    return items[index % len(items)] if items else None


def row_counts() -> dict[str, int]:
    return {
        model.__name__: model.objects.count()
        for model in (Job, JobEvent, JobAttempt, GpuAssignment, ShareChange, CapacityLimit)
    }


class PortalMachine(RuleBasedStateMachine):
    """Users, admins and agents acting on one cluster through the services layer."""

    users: dict = {}

    def __init__(self) -> None:
        super().__init__()
        for model in (GpuAssignment, JobAttempt, JobEvent, Job, Node, ShareChange):
            model.objects.all().delete()
        CapacityLimit.objects.all().delete()
        QuotaShare.objects.all().delete()
        ClusterSettings.objects.update_or_create(pk=1, defaults={"agent_join_token": JOIN_TOKEN})
        # The cycle skips planning when the database looks as it did at the last cycle; a
        # fingerprint left by an earlier example must not be mistaken for this one's.
        redis_client().delete(_fingerprint_key())
        teams = {team.slug: team for team in Team.objects.all()}
        share_create(
            name="vision", team=teams["vision"], capacity_limits={"h100": 8},
            strategy=LEND, grace_seconds=5,
        )  # fmt: skip
        share_create(
            name="research", team=teams["ml-research"], capacity_limits={"h100": 8, "l4": 2},
            strategy=LEND_AND_BORROW, grace_seconds=5,
        )  # fmt: skip
        share_create(
            name="infer", team=teams["infer"], capacity_limits={"l4": 2, "h100": 2},
            strategy=RESERVE,
        )  # fmt: skip
        share_create(
            name="batch", team=teams["batch"], capacity_limits={"h100": 4},
            strategy=LEND_AND_BORROW, in_share_preemption=True, lend_limit=2,
        )  # fmt: skip
        for name, gpu_type, gpus in (("node-0", "h100", 8), ("node-1", "h100", 8),
                                     ("node-2", "l4", 4)):  # fmt: skip
            node_register(
                join_token=JOIN_TOKEN, name=name, gpu_type=gpu_type, gpus=gpus, gpu_details=[]
            )
        self.accepted_submits = 0
        self.tokens_used: dict[str, int] = {}

    @initialize(
        borrowers=st.lists(st.sampled_from((8, 8, 4)), min_size=2, max_size=3),
        start=st.booleans(),
    )
    def borrowers_fill_the_cluster(self, borrowers, start):
        """Often the story starts with research borrowing (so that a lender's submit reclaims)."""
        for gpus in borrowers:
            job_submit(user=self.users["alice"], share_name="research", gpu_type="h100",
                       gpus=gpus, command="true")  # fmt: skip
            self.accepted_submits += 1
        if borrowers:
            self.cycle(force=True)
        if start:
            for attempt_id, node in self.held():
                attempt_started(node=node, attempt_id=attempt_id)

    # --- Users ---------------------------------------------------------------------------------

    @rule(
        user=st.sampled_from(USERS),
        share=st.sampled_from((*SHARES, "nope")),
        gpu_type=st.sampled_from((*GPU_TYPES, "a100")),
        gpus=st.sampled_from((1, 2, 3, 4, 8, 16, 24)),
        nodes=st.sampled_from((1, 1, 1, 2, 3)),
        priority=st.sampled_from((0, 0, 5, 100, MAX_PRIORITY, MAX_PRIORITY + 1)),
        command=st.sampled_from(("true", "true", "python train.py", "", "  ")),
        timeout=st.sampled_from((None, None, 60, 0, MAX_TIMEOUT_SECONDS + 1)),
        max_preemptions=st.sampled_from((None, None, 0, 1)),
        retry_attempts=st.sampled_from((0, 0, 1)),
        client_token=st.sampled_from(("", "", "", "tok-a", "tok-b")),
    )
    def submit_anything(self, **request):
        """Any submit, most of them breaking some rule."""
        self.submit(**request)

    @rule(
        user=st.sampled_from(USERS),
        share=st.sampled_from(SHARES),
        type_index=st.integers(0, 4),
        gpus=st.sampled_from((1, 2, 4, 4, 8)),
        priority=st.sampled_from((0, 0, 5, 100)),
        max_preemptions=st.sampled_from((None, None, 0, 1)),
        retry_attempts=st.sampled_from((0, 0, 1)),
    )
    def submit_plausible(self, share, type_index, **request):
        """A submit of a GPU type the share has a limit for; valid unless the share is disabled
        or no node could ever hold it."""
        gpu_type = pick(sorted(QuotaShare.objects.get(name=share).limits), type_index)
        self.submit(share=share, gpu_type=gpu_type, nodes=1, command="true", timeout=None,
                    client_token="", **request)  # fmt: skip

    @rule(
        share=st.sampled_from(("vision", "infer", "batch")),
        gpus=st.sampled_from((1, 2, 4, 8)),
        priority=st.sampled_from((0, 50)),
    )
    def owner_submits(self, share, gpus, priority):
        """A lender (or the RESERVE share) submits within its limit, and a cycle follows: a
        reclaim if borrowers hold its quota."""
        limits = QuotaShare.objects.get(name=share).limits
        gpu_type = "h100" if "h100" in limits else min(limits)
        self.submit(user="carol", share=share, gpu_type=gpu_type, gpus=min(gpus, limits[gpu_type]),
                    nodes=1, priority=priority, command="true", timeout=None,
                    max_preemptions=None, retry_attempts=0, client_token="")  # fmt: skip
        # As in production, a submit asks for a cycle at once.
        self.cycle(force=False)

    def submit(self, user, share, gpu_type, gpus, nodes, priority, command, timeout,
               max_preemptions, retry_attempts, client_token):  # fmt: skip
        """A submit is accepted exactly when every rule holds; a refused one writes nothing
        and names a field that breaks a rule."""
        violated = self.expected_violations(share, gpu_type, gpus, nodes, priority, command,
                                            timeout)  # fmt: skip
        before = row_counts()
        token_key = f"{user}:{client_token}"
        try:
            job, created = job_submit(
                user=self.users[user], share_name=share, gpu_type=gpu_type, gpus=gpus,
                nodes=nodes, priority=priority, command=command, timeout_seconds=timeout,
                max_preemptions=max_preemptions, retry_attempts=retry_attempts,
                client_token=client_token,
            )  # fmt: skip
        except ValidationError as error:
            assert row_counts() == before, "a refused submit wrote rows"
            if client_token and token_key in self.tokens_used:
                return  # the first job's token is checked first; any refusal is fine here
            assert violated, f"refused a valid submit: {error.message_dict}"
            assert set(error.message_dict) & violated, (error.message_dict, violated)
            return
        except Exception as error:  # noqa: BLE001
            from scheduler.jobs.services import ClientTokenConflict

            assert isinstance(error, ClientTokenConflict), repr(error)
            assert token_key in self.tokens_used
            assert row_counts() == before
            return
        if client_token and token_key in self.tokens_used:
            assert not created and job.pk == self.tokens_used[token_key]
            assert row_counts() == before
            return
        assert created and not violated, f"accepted a submit that breaks {violated}"
        self.accepted_submits += 1
        if client_token:
            self.tokens_used[token_key] = job.pk

    def expected_violations(self, share_name, gpu_type, gpus, nodes, priority, command,
                            timeout) -> set[str]:  # fmt: skip
        """The fields a submit breaks, judged from the rules of DESIGN §2 alone."""
        share = QuotaShare.objects.filter(name=share_name).first()
        if share is None or share.state == QuotaShare.State.DISABLED:
            return {"share"}
        if gpu_type not in share.limits:
            return {"gpu_type"}
        if not command.strip():
            return {"command"}
        violated = set()
        if gpus % nodes:
            violated.add("gpus")
        if priority > MAX_PRIORITY:
            violated.add("priority")
        if timeout is not None and not 1 <= timeout <= MAX_TIMEOUT_SECONDS:
            violated.add("timeout_seconds")
        if violated:
            return violated
        sizes = list(
            Node.objects.filter(gpu_type=gpu_type)
            .exclude(state=Node.State.DOWN)
            .values_list("gpus", flat=True)
        )
        if not sizes:
            return {"gpu_type"}
        per_node = gpus // nodes
        if per_node > max(sizes):
            return {"gpus"}
        if sum(1 for size in sizes if size >= per_node) < nodes:
            return {"nodes"}
        return set()

    @precondition(lambda self: Job.objects.exists())
    @rule(index=st.integers(0, 10_000))
    def cancel(self, index):
        """A cancel ends a queued job at once and stops a placed one; cancelling twice or an
        ended job changes nothing."""
        job = pick(list(Job.objects.order_by("pk")), index)
        before_state = job.state
        job = job_cancel(job=job, user=self.users["root"])
        if before_state in (Job.State.RUNNABLE,):
            assert job.state == Job.State.CANCELLED
        elif before_state in RUNNING_STATES:
            assert job.state == Job.State.PREEMPTING and job.cancel_requested
        else:
            assert job.state == before_state

    @precondition(lambda self: Job.objects.exists())
    @rule(index=st.integers(0, 10_000), priority=st.integers(0, MAX_PRIORITY))
    def set_priority(self, index, priority):
        job = pick(list(Job.objects.order_by("pk")), index)
        try:
            job_set_priority(job=job, priority=priority)
        except ValidationError as error:
            assert job.is_final and "priority" in error.message_dict
        else:
            assert not job.is_final
            assert Job.objects.get(pk=job.pk).priority == priority

    # --- Agents --------------------------------------------------------------------------------

    def held(self) -> list[tuple[int, Node]]:
        """(attempt id, node) for every attempt holding GPUs on a node, in a stable order."""
        rows = (
            GpuAssignment.objects.filter(released=False)
            .values_list("attempt_id", "node_id")
            .distinct()
            .order_by("attempt_id", "node_id")
        )
        nodes = {node.pk: node for node in Node.objects.all()}
        return [(attempt_id, nodes[node_id]) for attempt_id, node_id in rows]

    @rule(index=st.integers(0, 10_000))
    def agent_polls(self, index):
        """An agent polls: heartbeat, and the run orders of jobs placed on its node."""
        node = pick(list(Node.objects.exclude(state=Node.State.DOWN).order_by("pk")), index)
        if node is None:
            return
        node_heartbeat(node=node)
        orders = node_orders(node=node)
        for order in orders.run:
            job = Job.objects.get(pk=order["job"])
            # A cancel becomes a stop order at the next cycle; until then the job runs on.
            assert job.state in RUNNING_STATES or (
                job.state == Job.State.PREEMPTING and job.cancel_requested
            ), job.state

    @precondition(lambda self: GpuAssignment.objects.filter(released=False).exists())
    @rule(index=st.integers(0, 10_000))
    def agent_starts(self, index):
        attempt_id, node = pick(self.held(), index)
        assert attempt_started(node=node, attempt_id=attempt_id) == "ok"

    @precondition(lambda self: GpuAssignment.objects.filter(released=False).exists())
    @rule(index=st.integers(0, 10_000))
    def agent_asks_to_start(self, index):
        """An agent asks to start an attempt whose order it has: granted (and started) unless
        its stop was ordered first."""
        attempt_id, node = pick(self.held(), index)
        stop_ordered = JobAttempt.objects.get(pk=attempt_id).stop_requested_at is not None
        granted = attempts_start(node=node, attempt_ids={attempt_id})
        assert (attempt_id in granted) == (not stop_ordered)
        if granted:
            assert JobAttempt.objects.get(pk=attempt_id).started_at is not None

    @precondition(lambda self: GpuAssignment.objects.filter(released=False).exists())
    @rule(
        index=st.integers(0, 10_000),
        end=st.sampled_from((END_EXIT, END_EXIT, END_EXIT, END_TIMEOUT, END_LOST)),
        exit_code=st.sampled_from((0, 0, 1, 137)),
    )
    def agent_process_ends(self, index, end, exit_code):
        """A process ends by itself (0 or not), at its timeout, or the restarted agent no longer
        has it."""
        attempt_id, node = pick(self.held(), index)
        attempt = JobAttempt.objects.get(pk=attempt_id)
        if attempt.started_at is None and end == END_EXIT:
            end = END_NEVER_STARTED
        code = None if end in (END_LOST, END_NEVER_STARTED) else exit_code
        assert attempt_exited(node=node, attempt_id=attempt_id, end=end, exit_code=code) == "ok"

    @precondition(
        lambda self: JobAttempt.objects.filter(
            ended_at__isnull=True, stop_requested_at__isnull=False, gpus__released=False
        ).exists()
    )
    @rule(index=st.integers(0, 10_000), finished_first=st.booleans())
    def agent_confirms_stop(self, index, finished_first):
        """The agent stops a PREEMPTING job: SIGTERM, then the exit (or it had not started;
        or it finished just before the signal)."""
        stopping = [
            (attempt_id, node)
            for attempt_id, node in self.held()
            if JobAttempt.objects.filter(pk=attempt_id, stop_requested_at__isnull=False).exists()
        ]
        attempt_id, node = pick(stopping, index)
        attempt = JobAttempt.objects.get(pk=attempt_id)
        if attempt.started_at is None:
            result = attempt_exited(node=node, attempt_id=attempt_id, end=END_NEVER_STARTED)
        elif finished_first:
            result = attempt_exited(node=node, attempt_id=attempt_id, end=END_EXIT, exit_code=0)
        else:
            result = attempt_exited(
                node=node, attempt_id=attempt_id, end=END_EXIT, exit_code=-15, signalled=True
            )
        assert result == "ok"

    @precondition(lambda self: JobAttempt.objects.filter(ended_at__isnull=False).exists())
    @rule(index=st.integers(0, 10_000))
    def agent_replays_a_report(self, index):
        """An agent resends reports about an attempt that already ended: nothing changes."""
        attempt = pick(list(JobAttempt.objects.filter(ended_at__isnull=False).order_by("pk")),
                       index)  # fmt: skip
        node = Node.objects.get(name=attempt.allocations[0]["node"])
        before = row_counts()
        states = list(Job.objects.order_by("pk").values_list("state", flat=True))
        assert attempt_started(node=node, attempt_id=attempt.pk) == "ignored"
        assert attempt_exited(node=node, attempt_id=attempt.pk, end=END_EXIT, exit_code=0) == (
            "ignored"
        )
        assert row_counts() == before
        assert list(Job.objects.order_by("pk").values_list("state", flat=True)) == states

    # --- Nodes ---------------------------------------------------------------------------------

    @rule(name=st.sampled_from(NODE_NAMES), gpu_type=st.sampled_from(GPU_TYPES),
          gpus=st.sampled_from((2, 4, 8)))  # fmt: skip
    def node_joins(self, name, gpu_type, gpus):
        """A new node registers; an existing one re-registers as it is (its agent restarted)."""
        existing = Node.objects.filter(name=name).first()
        if existing is not None:
            gpu_type, gpus = existing.gpu_type, existing.gpus
        node, token = node_register(
            join_token=JOIN_TOKEN, name=name, gpu_type=gpu_type, gpus=gpus, gpu_details=[]
        )
        assert token and node.state in (Node.State.READY, Node.State.DRAINING)

    @rule(index=st.integers(0, 10_000),
          state=st.sampled_from((Node.State.DRAINING, Node.State.READY)))  # fmt: skip
    def node_drain_or_undrain(self, index, state):
        node = pick(list(Node.objects.exclude(state=Node.State.DOWN).order_by("pk")), index)
        if node is not None:
            node_set_state(node=node, state=state)

    @rule(index=st.integers(0, 10_000))
    def node_goes_silent(self, index):
        """The node's agent stops sending heartbeats; the next cycle marks it DOWN."""
        node = pick(list(Node.objects.order_by("pk")), index)
        Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(days=1))

    # --- Shares --------------------------------------------------------------------------------

    @rule(share=st.sampled_from(SHARES), gpu_type=st.sampled_from(GPU_TYPES),
          limit=st.sampled_from((0, 1, 2, 4, 8, 16)))  # fmt: skip
    def share_limit_changes(self, share, gpu_type, limit):
        """An admin lowers, raises, adds or drops a GPU type's limit (0: drop the type)."""
        share = QuotaShare.objects.get(name=share)
        limits = dict(share.limits)
        if limit:
            limits[gpu_type] = limit
        else:
            limits.pop(gpu_type, None)
        lend = {t: min(v, limits[t]) for t, v in share.lend_limits.items() if t in limits}
        self.expect_share_update(
            share, limits_ok=bool(limits), capacity_limits=limits, lend_limit=lend or None
        )

    @rule(share=st.sampled_from(SHARES), strategy=st.sampled_from(QuotaShare.Strategy.values),
          borrow_limit=st.sampled_from((-1, -1, 0, 50, 100)))  # fmt: skip
    def share_strategy_changes(self, share, strategy, borrow_limit):
        """A strategy switch; a borrow_limit other than -1 is refused unless LEND_AND_BORROW."""
        share = QuotaShare.objects.get(name=share)
        self.expect_share_update(
            share,
            limits_ok=borrow_limit == -1 or strategy == LEND_AND_BORROW,
            strategy=strategy,
            borrow_limit=borrow_limit,
        )

    @rule(share=st.sampled_from(SHARES), lend_limit=st.sampled_from((0, 1, 2, 8, 100)))
    def share_lend_limit_changes(self, share, lend_limit):
        share = QuotaShare.objects.get(name=share)
        fits = all(lend_limit <= limit for limit in share.limits.values())
        self.expect_share_update(share, limits_ok=fits, lend_limit=lend_limit)

    @rule(share=st.sampled_from(SHARES), preempt=st.booleans(), strict=st.booleans())
    def share_flags_change(self, share, preempt, strict):
        share = QuotaShare.objects.get(name=share)
        self.expect_share_update(share, limits_ok=True, in_share_preemption=preempt,
                                 strict_fifo=strict)  # fmt: skip

    @rule(share=st.sampled_from(SHARES), state=st.sampled_from(QuotaShare.State.values))
    def share_enabled_or_disabled(self, share, state):
        share = share_set_state(
            share=QuotaShare.objects.get(name=share), state=state, actor=None, source="command"
        )
        assert QuotaShare.objects.get(pk=share.pk).state == state

    def expect_share_update(self, share: QuotaShare, *, limits_ok: bool, **changes) -> None:
        """The update succeeds exactly when the rules allow it; a refused one writes nothing."""
        before = row_counts()
        settings_before = (share.strategy, share.borrow_limit, share.limits, share.lend_limits)
        try:
            share_update(share=share, actor=None, source="command", **changes)
        except ValidationError as error:
            assert not limits_ok, f"refused a valid share update: {error.message_dict}"
            assert row_counts() == before
            share = QuotaShare.objects.get(pk=share.pk)
            assert (share.strategy, share.borrow_limit, share.limits, share.lend_limits) == (
                settings_before
            )
        else:
            assert limits_ok, f"accepted an invalid share update {changes}"

    # --- The cycle -----------------------------------------------------------------------------

    @rule()
    def cycle_forced(self):
        self.cycle(force=True)

    @rule(force=st.booleans())
    def cycle(self, force):
        """One scheduling cycle. What it admits respects the borrow caps, and borrowing stays
        within what is lendable whenever it was before."""
        newest = JobAttempt.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        fits_before = borrowing_within_lendable()
        result = cycle_run(force=force)
        new_attempts = list(
            JobAttempt.objects.filter(pk__gt=newest).select_related("job", "job__share")
        )
        assert len(new_attempts) == result.placed
        assert_admissions_within_caps(new_attempts)
        if result.nodes_lost:
            return  # capacity changed inside the cycle: "before" no longer describes it
        admitted_types = {attempt.job.gpu_type for attempt in new_attempts}
        fits_after = borrowing_within_lendable()
        for gpu_type in admitted_types:
            if fits_before.get(gpu_type, True):
                assert fits_after[gpu_type], (
                    f"admitting {gpu_type} jobs made borrowing exceed the free pool plus "
                    "what lenders can lend"
                )

    # --- After every step ----------------------------------------------------------------------

    @invariant()
    def invariants_hold(self):
        assert_no_gpu_held_twice()
        assert_every_job_in_one_valid_state()
        assert_preemptions_recorded()
        assert Job.objects.count() == self.accepted_submits


@pytest.fixture
def cycle_not_enqueued(monkeypatch):
    """Services ask Celery for a cycle after each commit; here the machine runs cycles itself,
    so nothing goes to the broker."""
    from scheduler.cycle import tasks

    monkeypatch.setattr(tasks.cycle, "delay", lambda *args, **kwargs: None)


def test_services_keep_the_invariants(transactional_db, cycle_not_enqueued, settings_):
    """Any sequence of user, admin, agent and cycle actions keeps every invariant."""
    User = get_user_model()
    # The world's carol (lender team vision), alice (borrower team ml-research) and root, plus
    # leads of the two teams only this machine has.
    users = {name: create_persona(name) for name in ("carol", "alice", "root")}
    for slug, lead in (("infer", "ivan"), ("batch", "bea")):
        users[lead] = User.objects.create_user(lead)
        team = Team.objects.create(name=slug.title(), slug=slug)
        Membership.objects.create(team=team, user=users[lead], role=Membership.Role.LEAD)
    PortalMachine.users = users
    run_state_machine_as_test(
        PortalMachine,
        settings=settings(
            max_examples=15,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


@pytest.fixture
def settings_(settings):
    # Nodes go silent only when a rule says so, not because a slow example outlived the
    # heartbeat timeout.
    settings.NODE_HEARTBEAT_TIMEOUT_SECONDS = 3600
    return settings

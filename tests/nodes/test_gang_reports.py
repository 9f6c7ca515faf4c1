"""The nodes of a gang report its attempt's end at the same moment; a web process applies the
reports that came while one waited its turn together (`nodes_report`, one transaction: the
job locked and the GPUs read once, not once per node). Together must give what one after
another gives: checked on two like gangs, one reported each way, on the real database; and
a failing node's stop reaches only the nodes that still hold the attempt."""

from __future__ import annotations

import pytest

from scheduler.agent.protocol import END_EXIT, EVENT_EXITED, EVENT_LOG, EVENT_STARTED
from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import GpuAssignment, Job, JobAttempt, Node
from scheduler.nodes.attempts import node_report, nodes_report
from tests.conftest import make_node
from tests.conftest import start_latest_attempt as run
from tests.cycle.test_carried_orders import published  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def exited(attempt: JobAttempt, exit_code: int = 0, signalled: bool = False) -> dict:
    return {"type": EVENT_EXITED, "attempt": attempt.pk, "end": END_EXIT, "exit_code": exit_code,
            "signalled": signalled, "log": "", "detail": ""}  # fmt: skip


def running_gang(world, nodes: int = 3) -> tuple[Job, JobAttempt, list[Node]]:
    job, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100",
                        gpus=8 * nodes, nodes=nodes, command="true")  # fmt: skip
    cycle_run(force=True)
    run(job)
    attempt = JobAttempt.objects.get(job=job)
    return job, attempt, [Node.objects.get(name=a["node"]) for a in attempt.allocations]


def outcome(job: Job) -> tuple:
    attempt = JobAttempt.objects.get(job=job)
    job.refresh_from_db()
    moves = list(job.events.order_by("pk").values_list("from_state", "to_state", "reason"))
    for i, allocation in enumerate(attempt.allocations):  # each gang on nodes of its own
        moves = [
            (*move[:2], move[2].replace(allocation["node"], f"its node {i}")) for move in moves
        ]
    held = GpuAssignment.objects.filter(attempt=attempt, released=False).count()
    return (job.state, attempt.outcome, attempt.exit_code, attempt.end_reason,
            attempt.ended_at is not None, held, moves)  # fmt: skip


@pytest.mark.parametrize("first_exit_code", [0, 1], ids=["success", "a-node-fails"])
def test_a_gang_s_ends_reported_together_give_what_one_after_another_gives(world, first_exit_code):
    for i in range(6):
        make_node(f"node-{i}")
    together_job, together, together_nodes = running_gang(world)
    apart_job, apart, apart_nodes = running_gang(world)
    assert not set(together_nodes) & set(apart_nodes)

    def reports(attempt, nodes):
        ends = [exited(attempt, first_exit_code), exited(attempt), exited(attempt)]
        return [*zip(nodes, [[end] for end in ends], strict=True),
                (nodes[0], [exited(attempt)]),  # a replay: ignored
                (nodes[1], [{"type": EVENT_STARTED, "attempt": attempt.pk}])]  # stale  # fmt: skip

    answers = nodes_report(reports(together, together_nodes))
    one_by_one = [node_report(node=node, events=events)
                  for node, events in reports(apart, apart_nodes)]  # fmt: skip

    assert answers == one_by_one == [["ok"], ["ok"], ["ok"], ["ignored"], ["ignored"]]
    assert outcome(together_job) == outcome(apart_job)
    assert outcome(together_job)[:2] == (
        (Job.State.SUCCEEDED, JobAttempt.Outcome.SUCCEEDED)
        if first_exit_code == 0
        else (Job.State.FAILED, JobAttempt.Outcome.FAILED)
    )


def test_a_failing_node_s_stop_reaches_the_nodes_that_still_hold_the_attempt(world, published):  # noqa: F811
    for i in range(3):
        make_node(f"node-{i}")
    job, attempt, (failed, also_ended, still_running) = running_gang(world)

    messages = published(lambda: nodes_report([
        (failed, [exited(attempt, exit_code=1)]),
        (also_ended, [exited(attempt, exit_code=143, signalled=True)]),
    ]))  # fmt: skip

    stop = {"attempt": attempt.pk, "grace_seconds": 2, "started": True}
    assert messages == {still_running.pk: {"run": [], "stop": [stop]}}
    assert nodes_report([(still_running, [exited(attempt, exit_code=143, signalled=True)])]) == [
        ["ok"]
    ]
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert JobAttempt.objects.get(pk=attempt.pk).outcome == JobAttempt.Outcome.FAILED


def test_a_gang_s_log_tails_sent_together_keep_the_last_and_ignore_a_stranger(world):
    for i in range(4):
        make_node(f"node-{i}")
    _, attempt, gang = running_gang(world)
    (stranger,) = Node.objects.exclude(pk__in=[node.pk for node in gang])

    def log(text: str) -> list[dict]:
        return [{"type": EVENT_LOG, "attempt": attempt.pk, "log": text}]

    answers = nodes_report([(gang[0], log("a")), (stranger, log("not mine")),
                            (gang[1], log("b")), (gang[2], log("c"))])  # fmt: skip

    assert answers == [["ok"], ["ignored"], ["ok"], ["ok"]]
    assert JobAttempt.objects.get(pk=attempt.pk).log_tail == "c"

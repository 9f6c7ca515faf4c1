"""What real Slurm prints that the Slurm connector's parsers must read right
(scheduler/agent/slurm.py): each text with its source in Slurm named."""

from __future__ import annotations

import time

import pytest

from scheduler.agent.connector import Attempt, Connector
from scheduler.agent.protocol import (
    END_EXIT,
    END_LOST,
    END_TIMEOUT,
    END_WITHDRAWN,
    NODE_DOWN,
    NODE_DRAINING,
    NODE_READY,
)
from scheduler.agent.slurm import SlurmCluster, node_state, parse_sinfo, parse_squeue


def test_squeue_exit_codes_of_slurm_23_02_and_later_are_read():
    """Since Slurm 23.02 (commit 93928b0743, "squeue - change print format for exit code",
    src/squeue/print.c _print_job_exit_code) `squeue -O exit_code` prints "exit:signal", as
    squeue(1) says: "Following the colon is the signal that caused the process to terminate"."""
    text = (
        "28|portal-research-job7-a12|FAILED|NonZeroExitCode|node1|gres/gpu:1|3:0|gpu|root|\n"
        "30|portal-research-job7-a13|FAILED|JobLaunchFailure|node1|gres/gpu:1|0:9|gpu|root|\n"
        "31|portal-research-job7-a14|COMPLETED|None|node1|gres/gpu:1|0:0|gpu|root|\n"
    )
    jobs = {job.id: job for job in parse_squeue(text)}
    assert jobs["28"].exit_code == 3
    assert jobs["30"].exit_code == -9  # killed by SIGKILL, as Popen says it
    assert jobs["31"].exit_code == 0


def test_a_node_slurm_is_rebooting_is_not_offered_as_ready():
    """sinfo's StateLong is node_state_string() lowercased (src/sinfo/print.c
    _print_state_long): a node whose reboot was issued (slurmctld holds it DOWN+REBOOT_ISSUED,
    src/slurmctld/node_mgr.c) prints "reboot^" (src/common/slurm_protocol_defs.c); sinfo(1):
    "^ The node reboot was issued"."""
    assert node_state("reboot^", "reboot ASAP")[0] in (NODE_DRAINING, NODE_DOWN)


@pytest.mark.parametrize("state", ["idle!", "mixed!"])
def test_a_node_pending_power_down_is_not_offered_as_ready(state):
    """A "!": "The node is pending power down" (sinfo(1), NODE STATE CODES; node_state_string
    prints "IDLE!" for NODE_STATE_POWER_DOWN). slurmctld never makes such a node available
    (make_node_avail in src/slurmctld/node_mgr.c returns early for IS_NODE_POWER_DOWN). It is
    DRAINING, not DOWN: a job still running there ("mixed!") is not lost."""
    assert node_state(state, "none")[0] == NODE_DRAINING


@pytest.mark.parametrize("state", ["mixed$", "allocated$"])
def test_a_node_in_a_maintenance_reservation_reads_as_maint_does(state):
    """A "$": "The node is currently in a reservation with a flag value of maintenance", the very
    description sinfo(1) gives MAINT, which node_state_string prints for an idle node in such a
    reservation (and for a mixed or allocated one "MIXED$", "ALLOCATED$"). "maint" reads
    DRAINING; the same node must not turn READY once a job of the reservation runs there."""
    assert node_state("maint", "none")[0] == NODE_DRAINING
    assert node_state(state, "none")[0] == NODE_DRAINING


def test_a_drain_reason_with_the_separator_is_shown_whole():
    """An operator's reason is free text (`scontrol update nodename=node2 state=drain
    reason="ECC|XID 79"`), printed verbatim by `sinfo -O Reason:|`."""
    text = "node2|gpu|drained|gpu:h100:8|gpu:h100:0(IDX:N/A)|ECC|XID 79|\n"
    (node,) = parse_sinfo(text)
    assert node.reason == "Slurm: drained (ECC|XID 79)"


def test_a_foreign_job_named_with_the_separator_does_not_stop_the_connector():
    """Any user of the partition may name a job anything (`sbatch -J 'a|b|c|n[a-b]'`); squeue
    prints the name verbatim. The connector lists every job of its partitions, so a parser
    exception here stops it (and again after every restart while the job is listed)."""
    text = (
        "50|a|b|c|n[a-b]|PENDING|Resources||gres/gpu:1|0|gpu|root|\n"
        "2|portal-research-job7-a12|RUNNING|None|node[1-2]|gres/gpu:4|0|gpu|root|\n"
    )
    jobs = {job.id: job for job in parse_squeue(text)}
    assert jobs["2"].nodes == ("node1", "node2") and jobs["2"].gpus_per_node == 4


def test_a_job_named_like_the_connectors_but_not_its_own_is_never_taken_for_an_attempt():
    """Another user of the partition may name a job `portal-research-job7-a12`; a job array's
    element ("123_4") is never one the connector submitted. Neither is taken for attempt 12
    (whose real Slurm job would then go untracked), and neither stops the connector."""
    text = (
        "90|portal-research-job7-a12|RUNNING|None|node1|gres/gpu:1|0|gpu|mallory|\n"
        "91_4|portal-research-job7-a12|RUNNING|None|node1|gres/gpu:1|0|gpu|root|\n"
        "92|portal-research-job7-a12|RUNNING|None|node1|gres/gpu:1|0|gpu|root|\n"
    )
    cluster = SlurmCluster(partitions=("gpu",), user="root")
    jobs = {job.id: job for job in parse_squeue(text)}
    assert [cluster.attempt_of(jobs[i]) for i in ("90", "91_4", "92")] == [None, None, 12]


def squeue_line(state: str, nodes: str, reason: str = "None") -> str:
    """squeue -h --states=all -O 'JobID:|,Name:|,State:|,Reason:|,NodeList:|,tres-per-node:|,
    exit_code:|,Partition:|,UserName:|' for the connector's job 2 (attempt 12)."""
    return f"2|portal-research-job7-a12|{state}|{reason}|{nodes}|gres/gpu:4|0:0|gpu|root|\n"


# Every word squeue prints for a job's state: job_state_string (src/common/
# slurm_protocol_defs.c) prints the job's first state flag that has a name there, else its base
# state; the rest are the flags of doc/html/job_state_codes.shtml that slurm.h calls requeue
# flags, printed by no command. Each is pending (the pending timeout withdraws it), holding its
# GPUs, or an end, never none of them: an attempt in none is followed by nothing, for ever.
JOB_STATE_MEANINGS = [
    ("PENDING", "", "pending"), ("CONFIGURING", "node1", "pending"),
    ("POWER_UP_NODE", "node1", "pending"), ("EXPEDITING", "", "pending"),
    ("REQUEUED", "node1", "pending"), ("REQUEUE_FED", "", "pending"),
    ("REQUEUE_HOLD", "", "pending"), ("RESV_DEL_HOLD", "", "pending"),
    ("LAUNCH_FAILED", "", "pending"), ("RECONFIG_FAIL", "", "pending"),
    ("RUNNING", "node1", "holding"), ("COMPLETING", "node1", "holding"),
    ("SUSPENDED", "node1", "holding"), ("STOPPED", "node1", "holding"),
    ("SIGNALING", "node1", "holding"), ("STAGE_OUT", "node1", "holding"),
    ("RESIZING", "node1", "holding"),
    ("COMPLETED", "node1", END_EXIT), ("FAILED", "node1", END_EXIT),
    ("CANCELLED", "", END_EXIT), ("OUT_OF_MEMORY", "node1", END_EXIT),
    ("SPECIAL_EXIT", "node1", END_EXIT), ("TIMEOUT", "node1", END_TIMEOUT),
    ("DEADLINE", "", END_TIMEOUT), ("NODE_FAIL", "node1", END_LOST),
    ("BOOT_FAIL", "node1", END_LOST), ("PREEMPTED", "node1", END_LOST),
    ("REVOKED", "", END_LOST),
    # Words the connector does not know ("?": a base state the client does not; UPDATE_DB, or a
    # flag of a newer Slurm): never an end; holding where the job has nodes, else pending.
    ("?", "node1", "holding"), ("?", "", "pending"), ("UPDATE_DB", "node[1-2]", "holding"),
    ("SOME_NEW_FLAG", "", "pending"),
]  # fmt: skip


@pytest.mark.parametrize(("state", "nodes", "meaning"), JOB_STATE_MEANINGS)
def test_every_job_state_slurm_prints_is_pending_holding_or_an_end(state, nodes, meaning):
    (job,) = parse_squeue(squeue_line(state, nodes))
    read = [name for name, yes in (("pending", job.pending), ("holding", job.holding)) if yes]
    assert read + ([job.end] if job.end is not None else []) == [meaning]


class SlurmCommands(SlurmCluster):
    """The connector's Slurm, its commands answered as slurmctld would: squeue prints
    `squeue`, the others print nothing and are recorded."""

    squeue = ""

    def _run(self, *args: str) -> str:
        if args[0] == "squeue":
            return self.squeue
        self.ran.append(" ".join(args))
        return ""


@pytest.mark.parametrize(
    ("state", "reason"),
    [("RESV_DEL_HOLD", "ReservationDeleted"), ("EXPEDITING", "None"), ("?", "None")],
)
def test_a_job_slurm_keeps_in_a_held_or_unknown_state_is_withdrawn_at_the_pending_timeout(
    tmp_path, state, reason
):
    """Its reservation deleted, Slurm holds the attempt's job (RESV_DEL_HOLD) until an operator
    releases it; the connector followed it as neither pending nor running nor ended, for ever.
    It is cancelled at the pending timeout and the attempt withdrawn (requeued, nothing
    counted), Slurm's state in the reason."""
    cluster = SlurmCommands(partitions=("gpu",), user="root", script_dir=tmp_path / "s")
    cluster.ran = []
    connector = Connector(portal="http://127.0.0.1:9", join_token="x", name="slurm",
                          cluster=cluster, work_dir=tmp_path, pending_timeout=60.0,
                          checkpoint_root=tmp_path / "checkpoints")  # fmt: skip
    order = {"attempt": 12, "job": 7, "number": 1, "share": "research", "command": "train",
             "env": {}, "nodes": [{"node": "node1", "gpu_indices": [0, 1, 2, 3]}],
             "timeout_seconds": None, "grace_seconds": 30}  # fmt: skip
    connector.attempts[12] = Attempt(id=12, order=order, job_id="2",
                                     submitted=time.monotonic() - 61)  # fmt: skip
    cluster.squeue = squeue_line(state, "", reason)
    connector.observe()
    assert cluster.ran == ["scancel 2"]
    cluster.squeue = squeue_line("CANCELLED", "")
    connector.observe()
    [event] = list(connector.outbox)
    assert (event["attempt"], event["end"]) == (12, END_WITHDRAWN)
    assert f"Slurm kept job 2 pending 60 s ({reason})" == event["detail"]


# sinfo's StateLong is node_state_string() lowercased (src/common/slurm_protocol_defs.c,
# src/sinfo/print.c _print_state_long). The portal places jobs only on READY nodes: one Slurm
# starts no job on must never read READY.
@pytest.mark.parametrize(
    ("state", "portal"),
    [
        # "BLOCKED" (an idle node in the topology block of another job that asked for the
        # whole block), "PERFCTRS" (Slurm before 24.05: its network performance counters in
        # use by another job): healthy, and no job of the portal's starts there.
        ("blocked", NODE_DRAINING), ("perfctrs", NODE_DRAINING),
        # Printed alone when a node has no base state but one flag: not known to take jobs.
        ("powered_down", NODE_DOWN), ("powering_up", NODE_DOWN), ("power_up", NODE_DOWN),
        ("dynamic_future", NODE_DOWN), ("cloud", NODE_DOWN), ("?", NODE_DOWN),
        # A word a newer Slurm may print.
        ("overheated", NODE_DOWN), ("idle+quarantine", NODE_DOWN),
        # Power saving: powered off ("~"), powering up ("#") or down ("%") is DOWN; the portal
        # promises a start within its pending timeout, and a node must boot first.
        ("idle~", NODE_DOWN), ("idle#", NODE_DOWN), ("mixed#", NODE_DOWN), ("idle%", NODE_DOWN),
        # Slurm still starts jobs on these: a reboot once it is idle ("@"), a backfill plan
        # ("-", "planned"), an idle node in an advanced reservation, some jobs completing.
        ("mixed@", NODE_READY), ("mixed-", NODE_READY), ("planned", NODE_READY),
        ("reserved", NODE_READY), ("allocated+", NODE_READY), ("idle+cloud", NODE_READY),
        # Not responding ("*") or registered with less than its configuration.
        ("future*", NODE_DOWN), ("unknown*", NODE_DOWN), ("inval", NODE_DOWN),
    ],
)  # fmt: skip
def test_a_node_is_offered_only_in_a_state_slurm_starts_jobs_in(state, portal):
    assert node_state(state, "none")[0] == portal

"""What real Slurm prints that the Slurm connector's parsers must read right
(scheduler/agent/slurm.py): each text with its source in Slurm named."""

from __future__ import annotations

import pytest

from scheduler.agent.protocol import NODE_DOWN, NODE_DRAINING
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

"""The Slurm connector reads Slurm through its commands' output: these are the texts Slurm
22.05 (Debian bookworm) printed here, on the cluster of scripts/slurm_up.sh, for each case the
connector must read right. The live tests (tests/slurm/) run the same parsers on the real
commands."""

from __future__ import annotations

import pytest

from scheduler.agent.protocol import END_EXIT, END_LOST, END_TIMEOUT
from scheduler.agent.slurm import (
    SlurmCluster,
    batch_script,
    expand_hostlist,
    node_state,
    parse_job_gpus,
    parse_jobcomp,
    parse_sacct,
    parse_sinfo,
    parse_squeue,
    recorded_gpus,
)

# sinfo -N -h -p gpu -O 'NodeList:|,Partition:|,StateLong:|,Gres:|,GresUsed:|,Reason:|'
SINFO = """\
node1|gpu|mixed|gpu:h100:8|gpu:h100:6(IDX:0-5)|none|
node2|gpu|drained|gpu:h100:8|gpu:h100:0(IDX:N/A)|maint|
node3|gpu|down|gpu:h100:8|gpu:h100:0(IDX:N/A)|broken|
node4|gpu|idle*|gpu:h100:8|gpu:h100:0(IDX:N/A)|none|
node4|debug*|idle*|gpu:h100:8|gpu:h100:0(IDX:N/A)|none|
cpu1|gpu|idle|(null)|gpu:0|none|
t1|gpu|allocated|gpu:8|gpu:2|none|
"""


def test_sinfo_gives_each_gpu_node_once_with_the_portal_state_and_gpus_in_use():
    nodes = {n.name: n for n in parse_sinfo(SINFO)}
    assert set(nodes) == {"node1", "node2", "node3", "node4", "t1"}  # cpu1 has no GPU
    assert (nodes["node1"].gpu_type, nodes["node1"].gpus, nodes["node1"].used_gpus) == (
        "h100", 8, 6,
    )  # fmt: skip
    assert (nodes["node1"].state, nodes["node1"].reason) == ("READY", "")
    assert (nodes["node2"].state, nodes["node2"].reason) == ("DRAINING", "Slurm: drained (maint)")
    assert (nodes["node3"].state, nodes["node3"].reason) == ("DOWN", "Slurm: down (broken)")
    assert nodes["node4"].state == "DOWN"  # not responding
    assert nodes["node4"].partitions == ("gpu", "debug")
    assert (nodes["t1"].gpu_type, nodes["t1"].used_gpus) == (None, 2)  # typeless GRES


@pytest.mark.parametrize(
    ("state", "portal"),
    [
        ("idle", "READY"), ("mixed", "READY"), ("allocated", "READY"), ("completing", "READY"),
        ("draining", "DRAINING"), ("drained", "DRAINING"), ("idle+drain", "DRAINING"),
        ("down", "DOWN"), ("down*", "DOWN"), ("mixed*", "DOWN"), ("unknown", "DOWN"),
        ("fail", "DOWN"), ("idle~", "DOWN"),
    ],
)  # fmt: skip
def test_slurm_node_states_map_to_the_portal_states(state, portal):
    assert node_state(state, "none")[0] == portal


def test_typeless_nodes_take_the_type_given_on_the_command_line():
    typeless = [n for n in parse_sinfo(SINFO) if n.name == "t1"]
    cluster = SlurmCluster(partitions=("gpu",), default_gpu_type="l4",
                           node_gpu_types={"t*": "a100"})  # fmt: skip
    assert cluster.gpu_type_of(typeless[0]) == "a100"
    assert SlurmCluster(partitions=("gpu",), default_gpu_type="l4").gpu_type_of(typeless[0]) == (
        "l4"
    )


# squeue -h --states=all -p gpu -O 'JobID:|,Name:|,State:|,Reason:|,NodeList:|,tres-per-node:|,
# exit_code:|,Partition:|,UserName:|'
SQUEUE = """\
9|fill-7|PENDING|Resources||gres:gpu:1|0|gpu|root|
2|portal-research-job7-a12|RUNNING|None|node[1-2]|gres:gpu:4|0|gpu|root|
28|mine-exit3|FAILED|NonZeroExitCode|node1|gres:gpu:1|768|gpu|root|
30|mine-kill|FAILED|JobLaunchFailure|node1|gres:gpu:1|9|gpu|root|
26|nodefail|NODE_FAIL|NodeDown|node2|gres:gpu:8|0|gpu|root|
40|slow|TIMEOUT|TimeLimit|node3|gres:gpu:8|15|gpu|root|
41|x|CANCELLED|None||N/A|0|gpu|root|
"""


def test_squeue_gives_state_nodes_gpus_and_the_exit_code_as_popen_says_it():
    jobs = {job.id: job for job in parse_squeue(SQUEUE)}
    assert jobs["9"].pending and jobs["9"].reason == "Resources" and jobs["9"].nodes == ()
    gang = jobs["2"]
    assert gang.holding and gang.nodes == ("node1", "node2") and gang.gpus_per_node == 4
    assert (jobs["28"].exit_code, jobs["28"].end) == (3, END_EXIT)
    assert jobs["30"].exit_code == -9  # killed by SIGKILL
    assert jobs["26"].end == END_LOST
    assert jobs["40"].end == END_TIMEOUT
    assert jobs["41"].end == END_EXIT and jobs["41"].nodes == ()
    cluster = SlurmCluster(partitions=("gpu",))
    assert cluster.attempt_of(gang) == 12
    assert cluster.attempt_of(jobs["9"]) is None


def test_the_gpu_indices_slurm_gave_each_node_of_a_job():
    # scontrol -o -d show job 2 (a gang), the per-node part
    text = (
        "JobId=2 JobName=portal-research-job7-a12 ... JOB_GRES=gpu:h100:8   Nodes=node1 "
        "CPU_IDs=1 Mem=0 GRES=gpu:h100:4(IDX:2-5)   Nodes=node2 CPU_IDs=0 Mem=0 "
        "GRES=gpu:h100:4(IDX:0-1,6-7) MinCPUsNode=1"
    )
    assert parse_job_gpus(text) == [
        {"node": "node1", "gpu_indices": [2, 3, 4, 5]},
        {"node": "node2", "gpu_indices": [0, 1, 6, 7]},
    ]
    assert parse_job_gpus("Nodes=node[3-4] CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1) X") == [
        {"node": "node3", "gpu_indices": [0, 1]},
        {"node": "node4", "gpu_indices": [0, 1]},
    ]


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ("12 3,4\n", [3, 4]),  # as the batch script writes it: SLURM_JOB_GPUS
        ("12 3,4", None),  # being written: no closing newline yet
        ("12 3", None),  # a part of "12 3,4\n": never taken for GPU 3 alone
        ("", None),
        ("12 \n", None),  # SLURM_JOB_GPUS unset: scontrol will tell
        ("9 0,1\n", None),  # an earlier Slurm job's record
    ],
)
def test_a_batch_scripts_record_of_its_gpus_is_taken_only_whole_and_for_its_job(
    tmp_path, text, gpus
):
    record = tmp_path / "attempt-1.gpus"
    record.write_text(text)
    assert recorded_gpus(record, "12") == gpus
    assert recorded_gpus(tmp_path / "none.gpus", "12") is None


def test_hostlists_expand_as_scontrol_show_hostnames_does():
    assert expand_hostlist("node[1-3,7]") == ["node1", "node2", "node3", "node7"]
    assert expand_hostlist("a1,b[08-10]") == ["a1", "b08", "b09", "b10"]
    assert expand_hostlist("gpu-[1-2]-x") == ["gpu-1-x", "gpu-2-x"]


def test_the_batch_script_exports_the_portal_environment_and_execs_the_command():
    order = {"job": 7, "number": 2, "command": "python train.py --lr 0.1"}
    env = {"JOB_ID": "7", "CHECKPOINT_DIR": "/shared/ckpt/job-7", "NOTE": "it's $HOME"}
    script = batch_script(order, env, gang=False)
    assert "export NOTE='it'\"'\"'s $HOME'" in script  # quoted: no expansion
    assert script.rstrip().endswith("exec python train.py --lr 0.1")
    gang = batch_script({**order, "command": "torchrun train.py"}, env, gang=True)
    assert "exec srun --kill-on-bad-exit=1 --ntasks-per-node=1" in gang
    shell = batch_script({**order, "command": "a && b"}, env, gang=False)
    assert shell.rstrip().endswith("\na && b")


def test_ended_jobs_slurm_no_longer_lists_are_read_from_sacct_or_the_job_completion_log():
    """Once Slurm has purged a job (MinJobAge after its end), sacct (with accounting) or the
    job-completion log (jobcomp/filetxt, a cluster without slurmdbd) says how it ended."""
    # sacct -n -P -X -o JobID,JobName,State,ExitCode,NodeList,Partition -j 12
    job = parse_sacct("12|portal-research-job7-a12|CANCELLED by 0|0:15|node[1-2]|gpu\n")
    assert (job.state, job.exit_code, job.nodes, job.end) == (
        "CANCELLED", -15, ("node1", "node2"), END_EXIT,
    )  # fmt: skip
    # Lines of the job-completion log this machine's Slurm wrote.
    log = (
        "JobId=20 UserId=root(0) GroupId=root(0) Name=trap-step-full JobState=FAILED "
        "Partition=gpu TimeLimit=UNLIMITED StartTime=2026-12-01T15:55:12 "
        "EndTime=2026-12-01T15:55:16 NodeList=node1 NodeCnt=1 ProcCnt=1 WorkDir=/tmp "
        "ReservationName= Tres=cpu=1,mem=64G,node=1,billing=1 Account= QOS= WcKey= "
        "Cluster=unknown SubmitTime=2026-12-01T15:55:11 EligibleTime=2026-12-01T15:55:11 "
        "DerivedExitCode=0:9 ExitCode=143:0 \n"
        "JobId=26 UserId=root(0) GroupId=root(0) Name=nodefail JobState=NODE_FAIL "
        "Partition=gpu TimeLimit=UNLIMITED StartTime=2026-12-01T15:55:34 "
        "EndTime=2026-12-01T15:55:35 NodeList=node2 NodeCnt=1 ProcCnt=1 WorkDir=/tmp "
        "ReservationName= Tres=cpu=1,mem=64G,node=1,billing=1 Account= QOS= WcKey= "
        "Cluster=unknown SubmitTime=2026-12-01T15:55:33 EligibleTime=2026-12-01T15:55:33 "
        "DerivedExitCode=0:0 ExitCode=0:0 \n"
    )
    failed = parse_jobcomp(log, "20")
    assert (failed.state, failed.exit_code, failed.end, failed.nodes) == (
        "FAILED", 143, END_EXIT, ("node1",),
    )  # fmt: skip
    assert parse_jobcomp(log, "26").end == END_LOST
    assert parse_jobcomp(log, "2") is None

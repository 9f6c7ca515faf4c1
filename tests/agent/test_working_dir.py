"""Where a job's command starts on a node agent: in the working directory the job names (so
`python train.py` finds the code there), else in its checkpoint directory; a named directory
the node does not have fails the attempt before anything starts, saying which and where. So does
what the agent (or a connector) cannot look up or make there: that attempt fails, not the agent."""

from __future__ import annotations

from scheduler.agent.connector import Connector
from scheduler.agent.protocol import (
    CHECKPOINT_DIR_UNUSABLE,
    WORKING_DIR_MISSING,
    WORKING_DIR_UNREADABLE,
)
from scheduler.agent.slurm import SlurmCluster
from tests.agent.offline import NO_PORTAL, offline_agent, run_order

# Says where it started and where its checkpoints go. Called as ./where.sh, so the agent must
# also find the program from the working directory.
WHERE = '#!/bin/sh\nprintf "%s\\n%s\\n" "$(pwd)" "$CHECKPOINT_DIR" > "$CHECKPOINT_DIR/where"\n'


def _run_to_end(agent, order: dict) -> None:
    agent.start(order)
    agent.processes[order["attempt"]].popen.wait(timeout=10)


def test_the_command_starts_in_the_working_directory_the_job_names(tmp_path):
    code = tmp_path / "my project"
    code.mkdir()
    (code / "where.sh").write_text(WHERE)
    (code / "where.sh").chmod(0o755)
    agent = offline_agent(tmp_path / "agent")
    _run_to_end(agent, {**run_order(1, 7, "./where.sh"), "working_dir": str(code)})
    checkpoints = tmp_path / "agent" / "checkpoints" / "job-7"
    started_in, checkpoint_dir = (checkpoints / "where").read_text().splitlines()
    assert started_in == str(code)
    assert checkpoint_dir == str(checkpoints)  # still where its checkpoints go


def test_without_a_working_directory_the_command_starts_in_its_checkpoint_directory(tmp_path):
    agent = offline_agent(tmp_path)
    command = "sh -c 'pwd > \"$CHECKPOINT_DIR/where\"'"
    for order in (run_order(1, 7, command), {**run_order(2, 8, command), "working_dir": ""}):
        _run_to_end(agent, order)
        checkpoints = tmp_path / "checkpoints" / f"job-{order['job']}"
        assert (checkpoints / "where").read_text().strip() == str(checkpoints)


def test_a_working_directory_the_node_does_not_have_fails_the_attempt_unstarted(tmp_path):
    """Reported as never started, naming the directory and the node: the agent makes no
    directory for a path or a mount gone wrong, and starts nothing elsewhere."""
    agent = offline_agent(tmp_path)
    missing = tmp_path / "not mounted" / "project"
    agent.start({**run_order(1, 7, "touch started"), "working_dir": str(missing)})
    (event,) = agent.outbox
    assert (event["type"], event["end"]) == ("exited", "never_started")
    assert event["detail"] == WORKING_DIR_MISSING.format(path=missing, node="n")
    assert not agent.processes and not missing.exists()
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    agent.start({**run_order(2, 8, "touch started"), "working_dir": str(a_file)})
    assert [e["end"] for e in agent.outbox] == ["never_started", "never_started"]
    assert not agent.processes


def test_a_working_directory_the_agent_cannot_look_up_fails_the_attempt_unstarted(tmp_path):
    """A path the node cannot even look at (one it may not search, or, as here, a name too
    long for its file system) is reported with the error, not raised out of the agent."""
    agent = offline_agent(tmp_path)
    too_long = tmp_path / ("x" * 300)
    agent.start({**run_order(1, 7, "touch started"), "working_dir": str(too_long)})
    (event,) = agent.outbox
    assert (event["type"], event["end"]) == ("exited", "never_started")
    assert event["detail"] == WORKING_DIR_UNREADABLE.format(
        path=too_long, node="n", error="File name too long"
    )
    assert not agent.processes


def test_a_checkpoint_directory_the_agent_cannot_make_fails_that_attempt_only(tmp_path):
    """Reported as never started, naming the directory, the node and the error; the other
    starts of the same answer go on, and the agent with them."""
    agent = offline_agent(tmp_path)
    in_the_way = tmp_path / "checkpoints" / "job-7"
    in_the_way.write_text("not a directory")
    agent.start_all([run_order(1, 7, "true"), run_order(2, 8, "true")])
    (event,) = agent.outbox
    assert (event["type"], event["attempt"], event["end"]) == ("exited", 1, "never_started")
    assert event["detail"] == CHECKPOINT_DIR_UNUSABLE.format(
        path=in_the_way, where="node n", error="File exists"
    )
    assert list(agent.processes) == [2]
    agent.processes[2].popen.wait(timeout=10)


def test_a_connector_fails_an_attempt_whose_checkpoint_directory_it_cannot_make(tmp_path):
    """The same for a cluster connector (Slurm here, never asked: nothing is submitted)."""
    connector = Connector(portal=NO_PORTAL, join_token="x", name="slurm",
                          cluster=SlurmCluster(partitions=("gpu",), script_dir=tmp_path / "s"),
                          work_dir=tmp_path, checkpoint_root=tmp_path / "checkpoints")  # fmt: skip
    in_the_way = tmp_path / "checkpoints" / "job-7"
    in_the_way.write_text("not a directory")
    connector.submit({**run_order(1, 7, "true"), "nodes": [{"node": "n1", "gpu_indices": [0]}]})
    (event,) = connector.outbox
    assert (event["type"], event["attempt"], event["end"]) == ("exited", 1, "never_started")
    assert event["detail"] == CHECKPOINT_DIR_UNUSABLE.format(
        path=in_the_way, where="the host of connector slurm", error="File exists"
    )
    assert not connector.attempts


def test_a_program_path_the_agent_cannot_look_up_fails_the_attempt_unstarted(tmp_path):
    """The same for the command's own path: the start fails with the error exec gives."""
    agent = offline_agent(tmp_path)
    agent.start(run_order(1, 7, "./" + "x" * 300))
    (event,) = agent.outbox
    assert (event["type"], event["end"]) == ("exited", "never_started")
    assert "File name too long" in event["detail"]
    assert not agent.processes

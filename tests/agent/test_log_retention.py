"""How long a node keeps its job logs (`--keep-logs-days`, 30 by default): the portal keeps each
attempt's last 8 KB, the node the whole log until it has not been written for that long, so a
node's disk does not fill with one file per attempt it ever ran. A running job's log is kept
however old, and 0 keeps every log. And the Slurm connector's GPU records that nobody read."""

from __future__ import annotations

import os
import time

import pytest

from scheduler.agent.__main__ import parse, parse_slurm
from scheduler.agent.connector import Attempt, Connector
from scheduler.agent.core import FileRetention
from scheduler.agent.slurm import STALE_GPUS_RECORD_SECONDS, SlurmCluster
from tests.agent.offline import NO_PORTAL, offline_agent, run_order

DAY = 86400


def _written(path, days_ago: float) -> None:
    path.write_text("step 1\n")
    when = time.time() - days_ago * DAY
    os.utime(path, (when, when))


def test_logs_not_written_for_the_kept_days_go_others_stay(tmp_path):
    names = ("job-1-attempt-1.log", "job-2-attempt-1.log", "job-3-attempt-1.log", "notes.txt")
    old, recent, running, other = (tmp_path / name for name in names)
    _written(old, 31)
    _written(recent, 29)
    _written(running, 40)  # a job silent for 40 days, still running
    _written(other, 40)  # not a job log
    retention = FileRetention(tmp_path, suffix=".log", keep_seconds=30 * DAY)
    assert retention.prune_when_due(lambda: {running}) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "job-2-attempt-1.log", "job-3-attempt-1.log", "notes.txt"]  # fmt: skip


def test_it_looks_once_an_hour_and_zero_days_keeps_every_log(tmp_path):
    retention = FileRetention(tmp_path, suffix=".log", keep_seconds=30 * DAY)
    assert retention.prune_when_due(set) == 0
    _written(tmp_path / "job-1-attempt-1.log", 31)
    assert retention.prune_when_due(set) == 0  # looked just now
    assert FileRetention(tmp_path, suffix=".log", keep_seconds=0).prune_when_due(set) == 0
    assert (tmp_path / "job-1-attempt-1.log").exists()


def test_while_the_running_attempts_logs_are_not_all_known_it_looks_later(tmp_path):
    """A connector restarted beside running jobs knows their logs' names once their orders
    come: until then it removes nothing, and it looks again at the next turn, not an hour
    later."""
    old = tmp_path / "job-1-attempt-1.log"
    _written(old, 31)
    retention = FileRetention(tmp_path, suffix=".log", keep_seconds=30 * DAY)
    assert retention.prune_when_due(lambda: None) == 0 and old.exists()
    assert retention.prune_when_due(set) == 1


def test_the_agent_removes_old_logs_of_ended_attempts_not_of_its_running_jobs(tmp_path):
    agent = offline_agent(tmp_path, keep_logs_days=30)
    ended = tmp_path / "logs" / "job-1-attempt-1.log"
    _written(ended, 31)
    agent.start(run_order(7, 2, "sleep 30"))
    running = agent.processes[7].log_path
    try:
        _written(running, 40)
        agent.step(0)
        assert not ended.exists() and running.exists()
    finally:
        os.killpg(agent.processes[7].popen.pid, 9)


@pytest.mark.parametrize("value", ["-1", "thirty", "nan"])
def test_a_bad_number_of_days_is_refused_naming_the_flag(value, capsys):
    for parser in (parse, parse_slurm):
        with pytest.raises(SystemExit) as stopped:
            parser(
                ["--keep-logs-days", value, "--partition", "gpu"][
                    : 4 if parser is parse_slurm else 2
                ]
            )
        assert stopped.value.code == 2
        assert "--keep-logs-days: not a number of days ≥ 0" in capsys.readouterr().err


def test_the_days_come_from_the_environment_too(monkeypatch):
    monkeypatch.setenv("AGENT_KEEP_LOGS_DAYS", "7")
    assert parse([]).keep_logs_days == 7
    monkeypatch.delenv("AGENT_KEEP_LOGS_DAYS")
    assert parse([]).keep_logs_days == 30


def test_a_connector_keeps_the_logs_of_its_attempts_and_waits_for_adopted_ones(tmp_path):
    connector = Connector(portal=NO_PORTAL, join_token="x", name="slurm",
                          cluster=SlurmCluster(partitions=("gpu",), script_dir=tmp_path / "s"),
                          work_dir=tmp_path, checkpoint_root=tmp_path / "checkpoints")  # fmt: skip
    connector.attempts[7] = Attempt(id=7, order=None)  # found running in Slurm after a restart
    ended, running = (tmp_path / "logs" / f"job-{job}-attempt-1.log" for job in (1, 2))
    _written(ended, 31)
    _written(running, 40)
    assert connector.log_retention.prune_when_due(connector._logs_in_use) == 0
    connector.attempts[7].order = run_order(7, 2, "python train.py")  # its order came
    assert connector.log_retention.prune_when_due(connector._logs_in_use) == 1
    assert not ended.exists() and running.exists()


def test_a_slurm_gpu_record_nobody_read_goes_an_hour_after_it_was_written(tmp_path):
    """A one-node job's batch script records its GPUs; the connector reads and removes the
    record, or, when it came late (a slow shared file system), asked scontrol and never reads
    it: such a record goes an hour after it was written, a fresh one stays."""
    cluster = SlurmCluster(partitions=("gpu",), script_dir=tmp_path)
    late, fresh = tmp_path / "attempt-1.gpus", tmp_path / "attempt-2.gpus"
    _written(late, (STALE_GPUS_RECORD_SECONDS + 60) / DAY)
    _written(fresh, 0)
    cluster._remove_stale_records()
    assert not late.exists() and fresh.exists()

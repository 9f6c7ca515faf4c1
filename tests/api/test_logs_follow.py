"""`gpu-portal logs --follow`: the log as it grows, from the ends of it the portal keeps
(`portal_client.client.log_growth`), then live: a job's agent sends its log while the CLI
follows it, through a retry, until the job ends."""

from __future__ import annotations

import os
import select
import subprocess
import sys

import pytest

from portal_client.cli import LOG_ATTEMPT, LOG_ENDED
from portal_client.client import log_growth
from scheduler.agent.protocol import END_EXIT, LOG_TAIL_CHARS
from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobAttempt
from scheduler.nodes.attempts import attempt_exited, attempt_log
from tests.api.test_client import ROOT
from tests.conftest import make_node, start_latest_attempt


def window(log: str) -> str:
    """The end of a log, as the portal keeps it."""
    return log[-LOG_TAIL_CHARS:]


def test_what_the_log_added_since_the_last_look():
    assert log_growth("", "step 1\n") == ("step 1\n", False)
    assert log_growth("step 1\n", "step 1\nstep 2\n") == ("step 2\n", False)
    assert log_growth("step 1\n", "step 1\n") == ("", False)


def test_a_log_longer_than_the_portal_keeps_slides_without_repeating_or_losing_text():
    log = "".join(f"step {i} loss {i * 0.37:.3f}\n" for i in range(2000))
    more = "".join(f"step {i} loss {i * 0.37:.3f}\n" for i in range(2000, 2010))
    assert log_growth(window(log), window(log + more)) == (more, False)


def test_more_text_than_the_portal_keeps_between_two_looks_is_said_to_be_missing():
    log = "".join(f"step {i}\n" for i in range(2000))
    much = "".join(f"epoch {i}\n" for i in range(2000))
    assert log_growth(window(log), window(log + much)) == (window(log + much), True)


def test_a_character_cut_at_the_start_of_the_window_counts_for_nothing():
    """The agent reads the last bytes of the log: the window may begin inside a character."""
    shown = "\ufffd" + "é" * 100 + "a\n"
    assert log_growth(shown, "\ufffd" + "é" * 99 + "a\nb\n") == ("b\n", False)


def read_line(process: subprocess.Popen, stream) -> str:
    ready, _, _ = select.select([stream], [], [], 30)
    assert ready, "the CLI printed nothing within 30 s"
    return stream.readline()


@pytest.mark.django_db(transaction=True)
def test_the_cli_follows_a_log_through_a_retry_until_the_job_ends(world, live_server):
    node = make_node("f0")
    job, _ = job_submit(user=world.bob, share_name="research", gpu_type="h100", gpus=8,
                        command="train", retry_attempts=1)  # fmt: skip
    cycle_run(force=True)
    start_latest_attempt(job)
    first = JobAttempt.objects.get(job=job, number=1)
    env = {**os.environ, "PORTAL_URL": live_server.url, "PORTAL_TOKEN": world.tokens["bob"]}
    process = subprocess.Popen(
        [sys.executable, "-m", "portal_client", "logs", str(job.pk), "--follow", "--every", "0.2"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
    )  # fmt: skip
    try:
        log = ""
        for line in ("loading data\n", "step 1 loss 2.31\n", "step 2 loss 1.87\n"):
            log += line
            attempt_log(node=node, attempt_id=first.pk, log_tail=window(log))
            assert read_line(process, process.stdout) == line  # once, as it came
        attempt_exited(node=node, attempt_id=first.pk, end=END_EXIT, exit_code=1,
                       log_tail=log + "CUDA error\n")  # fmt: skip
        assert read_line(process, process.stdout) == "CUDA error\n"
        cycle_run(force=True)  # the retry
        start_latest_attempt(job)
        second = JobAttempt.objects.get(job=job, number=2)
        assert read_line(process, process.stderr) == LOG_ATTEMPT.format(number=2) + "\n"
        attempt_log(node=node, attempt_id=second.pk, log_tail="resumed at step 2\n")
        assert read_line(process, process.stdout) == "resumed at step 2\n"
        attempt_exited(node=node, attempt_id=second.pk, end=END_EXIT, exit_code=0,
                       log_tail="resumed at step 2\ndone\n")  # fmt: skip
        assert read_line(process, process.stdout) == "done\n"
        assert process.wait(timeout=30) == 0
        ended = LOG_ENDED.format(job=job.pk, state="SUCCEEDED", reason="exited with code 0")
        assert process.stderr.read() == ended + "\n"
    finally:
        process.kill()
        process.wait()


@pytest.mark.django_db(transaction=True)
def test_submit_follow_prints_the_new_jobs_log_until_it_ends(world, live_server):
    node = make_node("f0")
    env = {**os.environ, "PORTAL_URL": live_server.url, "PORTAL_TOKEN": world.tokens["bob"]}
    process = subprocess.Popen(
        [sys.executable, "-m", "portal_client", "submit", "--share", "research", "--gpus", "8",
         "--gpu-type", "h100", "--follow", "--", "python", "train.py"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
    )  # fmt: skip
    try:
        said = read_line(process, process.stderr)
        assert said.startswith("job ") and " RUNNABLE: " in said
        job_id = int(said.split()[1])
        cycle_run(force=True)
        job = Job.objects.get(pk=job_id, submitted_by=world.bob)
        start_latest_attempt(job)
        attempt = JobAttempt.objects.get(job=job)
        attempt_exited(node=node, attempt_id=attempt.pk, end=END_EXIT, exit_code=3,
                       log_tail="epoch 1\nout of memory\n")  # fmt: skip
        assert process.wait(timeout=30) == 1  # it did not succeed
        assert process.stdout.read() == "epoch 1\nout of memory\n"
        assert "attempt" not in process.stderr.read()  # its first attempt is no news
    finally:
        process.kill()
        process.wait()

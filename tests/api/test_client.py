"""The Python client and the CLI against a live server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from portal_client import Client, JobEnded, PortalError, PortalUnreachable
from portal_client.cli import NO_LOG
from scheduler.models import Job, JobAttempt
from tests.api.helpers import place, preempt
from tests.live import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bob_client(world, live_server) -> Client:
    """bob's Python API client, talking to a live server."""
    return Client(live_server.url, world.tokens["bob"])


def test_submit_list_describe_cancel(world, bob_client):
    job = bob_client.submit(
        share="research", gpus=8, gpu_type="h100", command=["python", "train.py"]
    )
    assert job["state"] == "RUNNABLE" and job["command"] == "python train.py"
    assert [j["id"] for j in bob_client.jobs(share="research", state="RUNNABLE")] == [job["id"]]
    assert bob_client.job(job["id"])["events"][0]["to_state"] == "SUBMITTED"
    assert bob_client.cancel(job["id"])["state"] == "CANCELLED"
    assert bob_client.wait(job["id"], timeout=5)["state"] == "CANCELLED"


def test_wait_stops_when_the_job_ends_elsewhere(world, bob_client):
    """Waiting for RUNNING on a job that was cancelled raises at once instead of timing out."""
    job = bob_client.submit(share="research", gpus=8, gpu_type="h100", command="x")
    bob_client.cancel(job["id"])
    with pytest.raises(JobEnded) as ended:
        bob_client.wait(job["id"], states={"RUNNING"}, timeout=30)
    assert ended.value.job["state"] == "CANCELLED"


def test_client_token_returns_the_first_job(bob_client):
    first = bob_client.submit(
        share="research", gpus=8, gpu_type="h100", command="x", client_token="t"
    )
    again = bob_client.submit(
        share="research", gpus=8, gpu_type="h100", command="x", client_token="t"
    )
    assert first["id"] == again["id"]
    with pytest.raises(PortalError) as conflict:
        bob_client.submit(share="research", gpus=4, gpu_type="h100", command="x", client_token="t")
    assert conflict.value.status == 409


def test_errors_carry_the_apis_message(bob_client):
    with pytest.raises(PortalError) as error:
        bob_client.submit(share="research", gpus=8, gpu_type="h100", command="x", priority=10000)
    assert error.value.status == 400
    assert str(error.value) == "HTTP 400: priority: must be a whole number between 0 and 9999."


def test_jobs_follows_next_links(bob_client):
    for _ in range(3):
        bob_client.submit(share="research", gpus=1, gpu_type="h100", command="x")
    page = bob_client._request("GET", "jobs/", params={"page_size": 2})
    assert page["next"]
    assert len(bob_client.jobs()) == 3
    assert len(bob_client.jobs(limit=2)) == 2


def test_describe_shows_attempts_preemptions_gpus_and_log(world, bob_client):
    """A job preempted once and running again on GPUs 0-3 of h100-0."""
    job = Job.objects.get(
        pk=bob_client.submit(share="research", gpus=4, gpu_type="h100", command="x")["id"]
    )
    owner = Job.objects.get(
        pk=Client(bob_client.url, world.tokens["carol"]).submit(
            share="vision", gpus=8, gpu_type="h100", command="y"
        )["id"]
    )
    preempt(place(job, world.nodes["h100-1"], [4, 5, 6, 7]), owner)
    job.refresh_from_db()
    second = place(job, world.nodes["h100-0"], [0, 1, 2, 3])
    JobAttempt.objects.filter(pk=second.pk).update(log_tail="step 100 loss 0.1\n")
    described = bob_client.job(job.pk)
    assert described["state"] == "RUNNING"
    assert described["allocations"] == [{"node": "h100-0", "gpu_indices": [0, 1, 2, 3]}]
    assert described["preemptions"]["count"] == 1
    assert described["preemptions"]["recent"][0]["preempted_for"] == owner.pk
    assert [a["outcome"] for a in described["attempts"]] == ["PREEMPTED", ""]
    assert bob_client.logs(job.pk) == "step 100 loss 0.1\n"
    node = next(n for n in bob_client.nodes() if n["name"] == "h100-0")
    assert node["gpus_in_use"] == 4
    assert node["jobs"] == [
        {"id": job.pk, "share": "research", "state": "RUNNING", "gpu_indices": [0, 1, 2, 3]}
    ]
    assert bob_client.shares()[0]["usage"]["h100"]["used"] == 4


def cli(live_server, token, *args):
    env = {**os.environ, "PORTAL_URL": live_server.url, "PORTAL_TOKEN": token}
    return subprocess.run(
        [sys.executable, "-m", "portal_client", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_round_trip(world, live_server):
    token = world.tokens["bob"]
    submitted = cli(
        live_server,
        token,
        "--json",
        "submit",
        "--share",
        "research",
        "--gpus",
        "8",
        "--gpu-type",
        "h100",
        "--priority",
        "5",
        "--env",
        "EPOCHS=3",
        "--",
        "python",
        "train.py",
        "--lr",
        "0.1",
    )
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    assert job["command"] == "python train.py --lr 0.1"
    assert job["priority"] == 5 and job["env"] == {"EPOCHS": "3"}
    listing = cli(live_server, token, "ls", "--share", "research")
    assert listing.returncode == 0 and f"{job['id']:>6}  research" in listing.stdout
    shown = cli(live_server, token, "show", str(job["id"]))
    assert shown.stdout.startswith(f"job {job['id']}: RUNNABLE")  # unnamed: no empty name
    assert "command: python train.py --lr 0.1" in shown.stdout
    assert f"page: {live_server.url}/dash/jobs/{job['id']}/" in shown.stdout
    queue = cli(live_server, token, "queue")
    assert "1 runnable job(s)" in queue.stdout and "[within_limit]" in queue.stdout
    shares = cli(live_server, token, "shares")
    assert shares.stdout.startswith("research (ml-research, LEND_AND_BORROW, ENABLED)")
    logs = cli(live_server, token, "logs", str(job["id"]))
    assert logs.returncode == 0 and logs.stdout == ""
    assert logs.stderr == NO_LOG.format(job=job["id"]) + "\n"
    cancelled = cli(live_server, token, "cancel", str(job["id"]))
    assert "CANCELLED" in cancelled.stdout


def test_submit_wait_fails_when_the_job_is_cancelled_while_it_waits(world, live_server):
    """A pipeline's `gpu-portal submit --wait ... && next-step` must not go on when the job
    did not succeed: cancelled while it waited for GPUs, it exits 1 and says so."""
    token = world.tokens["bob"]
    env = {**os.environ, "PORTAL_URL": live_server.url, "PORTAL_TOKEN": token}
    waiting = subprocess.Popen(
        [sys.executable, "-m", "portal_client", "submit", "--share", "research", "--gpus", "8",
         "--gpu-type", "h100", "--name", "to-cancel", "--wait", "--", "train"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        client = Client(live_server.url, token)
        deadline = time.monotonic() + 30
        while not (jobs := client.jobs(share="research")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [job["name"] for job in jobs] == ["to-cancel"]
        client.cancel(jobs[0]["id"])
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 1, err
    assert out.startswith(f"job {jobs[0]['id']} CANCELLED: ")


def test_the_cli_takes_json_after_the_command_too(world, live_server):
    token = world.tokens["bob"]
    job = json.loads(
        cli(live_server, token, "submit", "--share", "research", "--gpus", "8", "--gpu-type",
            "h100", "--json", "--", "python", "train.py").stdout
    )  # fmt: skip
    for args in (("show", str(job["id"]), "--json"), ("--json", "show", str(job["id"]))):
        shown = cli(live_server, token, *args)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["id"] == job["id"]
    listed = cli(live_server, token, "ls", "--json")
    assert [entry["id"] for entry in json.loads(listed.stdout)] == [job["id"]]


def test_the_cli_stops_quietly_when_what_reads_its_output_goes_away(world, live_server):
    """`gpu-portal ls | head`: head leaves before the list is written; no traceback."""
    env = {**os.environ, "PORTAL_URL": live_server.url, "PORTAL_TOKEN": world.tokens["bob"]}
    listing = subprocess.Popen(
        [sys.executable, "-m", "portal_client", "ls"], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    listing.stdout.close()  # before it has written anything: it asks the portal first
    _, stderr = listing.communicate(timeout=60)
    assert listing.returncode == 141 and stderr == b""


def test_the_cli_sends_the_working_directory_as_an_absolute_path(world, live_server, tmp_path):
    """`--working-dir` (or sbatch's `--chdir`) is where the command starts on the node: a
    relative one is taken from where the CLI runs; `show` says it."""
    token = world.tokens["bob"]
    job_args = ("--share", "research", "--gpus", "1", "--gpu-type", "h100")
    (tmp_path / "project").mkdir()
    for flag, value, expected in (("--working-dir", "/srv/code", "/srv/code"),
                                  ("--chdir", "project", str(tmp_path / "project"))):  # fmt: skip
        submitted = subprocess.run(
            [sys.executable, "-m", "portal_client", "--json", "submit", *job_args, flag, value,
             "--", "python", "train.py"],
            cwd=tmp_path, env={**os.environ, "PORTAL_URL": live_server.url,
                               "PORTAL_TOKEN": token, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        job = json.loads(submitted.stdout)
        assert job["working_dir"] == expected
        shown = cli(live_server, token, "show", str(job["id"]))
        assert f"starts in: {expected}" in shown.stdout
    plain = cli(live_server, token, "--json", "submit", *job_args, "--", "true")
    assert json.loads(plain.stdout)["working_dir"] == ""
    assert (
        "starts in"
        not in cli(live_server, token, "show", str(json.loads(plain.stdout)["id"])).stdout
    )


def test_cli_reports_api_errors_and_missing_settings(world, live_server):
    refused = cli(
        live_server, world.tokens["oscar"], "submit", "--share", "research", "--gpus", "8",
        "--gpu-type", "h100", "--", "true",
    )  # fmt: skip
    assert refused.returncode == 2
    assert "HTTP 404: share: no share named 'research' among your teams' shares" in refused.stderr
    no_command = cli(
        live_server, world.tokens["bob"], "submit", "--share", "research", "--gpus", "8",
        "--gpu-type", "h100",
    )  # fmt: skip
    assert "no command: put it after --" in no_command.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PORTAL_URL", "PORTAL_TOKEN")}
    missing = subprocess.run(
        [sys.executable, "-m", "portal_client", "ls"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert "no portal URL" in missing.stderr


def test_cli_says_plainly_when_the_portal_cannot_be_reached_or_the_job_ended(world, live_server):
    """One line and its own exit status, not a traceback."""
    port = free_port()  # nothing listens there
    unreachable = subprocess.run(
        [sys.executable, "-m", "portal_client", "--url", f"http://127.0.0.1:{port}", "--token",
         "x", "ls"], cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert unreachable.returncode == 4
    assert unreachable.stderr == (
        f"error: cannot reach the portal at http://127.0.0.1:{port} (connection refused); "
        "check --url or PORTAL_URL\n"
    )
    with pytest.raises(PortalUnreachable):
        Client(f"http://127.0.0.1:{port}", "x").job(1)
    token = world.tokens["bob"]
    job = Client(live_server.url, token).submit(share="research", gpus=8, gpu_type="h100",
                                                command="x")  # fmt: skip
    cli(live_server, token, "cancel", str(job["id"]))
    waited = cli(live_server, token, "wait", str(job["id"]), "--state", "RUNNING")
    assert waited.returncode == 1
    assert waited.stderr.startswith(f"error: job {job['id']} ended CANCELLED")
    assert "Traceback" not in waited.stderr + unreachable.stderr
    waiting = Client(live_server.url, token).submit(share="research", gpus=8, gpu_type="h100",
                                                    command="x")  # fmt: skip
    timed_out = cli(live_server, token, "wait", str(waiting["id"]), "--timeout", "0.5")
    assert timed_out.returncode == 3
    assert timed_out.stderr == (
        f"error: job {waiting['id']} is still RUNNABLE after 0.5 s of waiting for CANCELLED, "
        "FAILED or SUCCEEDED\n"
    )

"""What `gpu-portal` prints of times: to the second, in UTC, and how far from now, as people
read them (the API's ISO 8601 stays in --json)."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime

import pytest

from portal_client.cli import moment, print_job, span

NOW = datetime(2026, 12, 5, 17, 45, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0.4, "0 s"),
        (40, "40 s"),
        (89, "89 s"),
        (20 * 60 + 20, "20 min"),
        (89 * 60, "89 min"),
        (90 * 60, "1 h 30 min"),
        (3 * 3600 + 5 * 60, "3 h 5 min"),
        (5 * 3600, "5 h"),
        (4 * 86400 + 3600, "4 days"),
        (-300, "5 min"),
    ],
)
def test_a_length_of_time_is_said_in_the_unit_people_use(seconds, said):
    assert span(seconds) == said


def test_a_time_is_shown_in_utc_to_the_second_and_from_now():
    assert moment("2026-12-05T18:04:30.062599Z", NOW) == "2026-12-05 18:04:30 UTC (in 20 min)"
    assert moment("2026-12-05T17:42:00Z", NOW) == "2026-12-05 17:42:00 UTC (3 min ago)"
    assert moment("2026-12-05T19:45:00.5+02:00", NOW) == "2026-12-05 17:45:00 UTC (now)"
    assert moment("2026-12-01T17:45:00Z", NOW) == "2026-12-01 17:45:00 UTC (4 days ago)"


def attempt(number: int, started: str | None, ended: str | None, **more) -> dict:
    return {
        "number": number, "started_at": started, "ended_at": ended,
        "allocations": [{"node": "node-0", "gpu_indices": [0, 1]}], **more,
    }  # fmt: skip


def job(state: str, attempts: list[dict], **more) -> dict:
    return {
        "id": 6, "name": "", "state": state, "reason": "why", "share": "research", "gpus": 2,
        "gpu_type": "h100", "nodes": 1, "priority": 0, "submitted_by": "bob",
        "submitted_at": "2026-12-05T17:40:00.123Z", "command": "python train.py",
        "started_at": attempts[0]["started_at"] if attempts else None, "finished_at": None,
        "attempts": attempts, "attempt_count": len(attempts),
        "allocations": attempts[-1]["allocations"] if attempts else [],
        "preemptions": {"count": 0, "recent": []}, **more,
    }  # fmt: skip


def shown(data: dict) -> str:
    out = io.StringIO()
    print_job(data, out)
    return out.getvalue()


def test_show_says_since_when_a_job_runs_and_where():
    running = shown(job("RUNNING", [attempt(1, "2026-12-05T17:41:00Z", None)]))
    assert "submitted by bob at 2026-12-05 17:40:00 UTC (" in running
    assert "  attempt 1 running since 2026-12-05 17:41:00 UTC (" in running
    assert "  on node node-0: GPUs 0,1" in running
    assert "ended at" not in running


def test_show_says_when_a_running_job_was_told_to_stop():
    stopping = shown(
        job(
            "PREEMPTING",
            [attempt(1, "2026-12-05T17:41:00Z", None, stop_requested_at="2026-12-05T17:44:00Z")],
        )
    )
    assert re.search(
        r"  attempt 1 running since 2026-12-05 17:41:00 UTC \(.+\); told to stop at "
        r"2026-12-05 17:44:00 UTC \(",
        stopping,
    )


def test_show_says_when_an_ended_job_ran_and_where_it_last_ran():
    ended = shown(
        job(
            "SUCCEEDED",
            [
                attempt(1, "2026-12-05T17:41:00Z", "2026-12-05T17:42:00Z"),
                attempt(2, "2026-12-05T17:43:00Z", "2026-12-05T17:44:30Z"),
            ],
            finished_at="2026-12-05T17:44:30Z",
        )
    )
    assert (
        "  started at 2026-12-05 17:41:00 UTC (" in ended
        and "), ended at 2026-12-05 17:44:30 UTC (" in ended
    )
    assert "  last ran on node node-0: GPUs 0,1" in ended
    assert "running since" not in ended


def test_show_of_a_job_preempted_back_into_the_queue_does_not_place_it_on_its_old_gpus():
    waiting = shown(job("RUNNABLE", [attempt(1, "2026-12-05T17:41:00Z", "2026-12-05T17:42:00Z")]))
    assert "  last ran on node node-0: GPUs 0,1" in waiting
    assert "running since" not in waiting and "ended at" not in waiting


def test_a_job_cancelled_before_it_started_says_only_when_it_ended():
    cancelled = shown(job("CANCELLED", [], finished_at="2026-12-05T17:44:00Z"))
    assert "  ended at 2026-12-05 17:44:00 UTC (" in cancelled
    assert "started at" not in cancelled

"""`gpu-portal COMMAND` (or `python -m portal_client`): the portal's jobs from the shell.

Commands: submit, estimate, ls, show, cancel, logs, queue, shares, wait.

export PORTAL_URL=http://127.0.0.1:8000 PORTAL_TOKEN=...
gpu-portal submit --share research --gpus 8 --gpu-type h100 -- python train.py

--url and --token win over PORTAL_URL and PORTAL_TOKEN; requests' own environment applies too
(HTTPS_PROXY, HTTP_PROXY, NO_PROXY; REQUESTS_CA_BUNDLE for a portal whose certificate comes
from your own CA).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from portal_client.client import (
    FINAL_STATES,
    JOB_STATES,
    OUTAGE_PATIENCE_SECONDS,
    Client,
    JobEnded,
    PortalError,
    PortalUnreachable,
    api_token,
    portal_url,
)
from scheduler.version import VERSION

OUTAGE_SAID = f"{OUTAGE_PATIENCE_SECONDS / 60:g} min"
NO_URL = "no portal URL: pass --url or set PORTAL_URL (like http://127.0.0.1:8000)."
NO_TOKEN = "no API token: pass --token or set PORTAL_TOKEN (manage.py drf_create_token USER)."
NO_COMMAND = "no command: put it after --, like: submit ... -- python train.py"
BAD_ENV = "--env takes NAME=VALUE, not {value!r}."
EXIT_STATUS = (
    "exit status: 0 done; 1 the job did not succeed (submit --wait or --follow, logs --follow: "
    "it failed or was cancelled), or ended in another state than the one waited for (wait "
    "--state); 2 the request was refused, by the portal (no such job or share, not allowed, "
    "a bad value: the error says why) or by gpu-portal itself (a bad argument, no URL or "
    "token); 3 wait timed out; 4 the portal could not be reached (wait and --follow first "
    f"try again for {OUTAGE_SAID}); 130 interrupted (Ctrl-C; a job submitted goes on); "
    "141 what read the output went away (| head)."
)
UNREACHABLE_HINT = "check --url or PORTAL_URL"
TOKEN_HINT = "check --token or PORTAL_TOKEN"
LS_MORE = "there are more jobs than the {limit} shown: --limit N shows more."
INTERRUPTED = "interrupted."
INTERRUPTED_WAIT = "interrupted: job {job} goes on (gpu-portal cancel {job} stops it)."
LOG_UNREACHABLE = (
    "[the portal does not answer ({error}); trying again for up to " + OUTAGE_SAID + "]"
)
NO_LOG = "job {job} has no log: it has not started yet, or its command wrote nothing."
FOLLOW_EVERY = 5.0  # seconds between two looks at a log followed
LOG_SKIPPED = "[... more than the portal keeps of a log was written since the last look ...]"
LOG_ATTEMPT = "[--- attempt {number}: a new log ---]"
LOG_ENDED = "[job {job} ended {state}: {reason}]"


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="gpu-portal", description=__doc__.split("\n")[0], epilog=EXIT_STATUS
    )
    main.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    main.add_argument(
        "--url", default=os.environ.get("PORTAL_URL"),
        help="the portal's address, like https://portal.example.org or https://host/gpu "
        "(default: $PORTAL_URL)",
    )  # fmt: skip
    main.add_argument(
        "--token", default=os.environ.get("PORTAL_TOKEN"), help="default: $PORTAL_TOKEN"
    )
    main.add_argument("--json", action="store_true", help="print the API's JSON")
    commands = main.add_subparsers(dest="command", required=True)

    submit = commands.add_parser("submit", help="submit a job; the command goes after --")
    estimate = commands.add_parser(
        "estimate",
        help="when would this job start? (the arguments of submit, the command optional; "
        "nothing stored)",
    )
    for command in (submit, estimate):
        job_arguments(command)
    submit.add_argument(
        "--wait", action="store_true",
        help="wait until the job ends, however long it waits and runs (exit status 0 if it "
        "succeeded, else 1)",
    )  # fmt: skip
    submit.add_argument(
        "-f", "--follow", action="store_true",
        help="then print its log as it grows until it ends, as logs --follow does",
    )  # fmt: skip

    ls = commands.add_parser("ls", help="list jobs, newest first")

    ls.add_argument("--share")
    ls.add_argument("--state", action="append", type=str.upper, choices=JOB_STATES,
                    metavar="STATE", help="repeatable")  # fmt: skip
    ls.add_argument("--user", dest="submitted_by")
    ls.add_argument("--since", help="ISO time, like 2026-01-31T12:00Z")
    ls.add_argument(
        "--limit", type=positive(int), default=50,
        help="at most this many jobs, newest first (50); stderr says when there are more",
    )  # fmt: skip

    for name, text in (("show", "describe a job"), ("cancel", "cancel a job"),
                       ("logs", "print the end of a job's log")):  # fmt: skip
        command = commands.add_parser(name, help=text)
        command.add_argument("job_id", type=int)
    logs = commands.choices["logs"]
    logs.add_argument(
        "-f", "--follow", action="store_true",
        help="then print what the log adds until the job ends (exit status 0 if it succeeded, "
        "else 1); the agents send it every 15 s or so",
    )  # fmt: skip
    logs.add_argument(
        "--every",
        type=positive(float),
        default=FOLLOW_EVERY,
        help=f"seconds between looks ({FOLLOW_EVERY:g})",
    )
    wait = commands.add_parser("wait", help="wait until a job reaches a state")
    wait.add_argument("job_id", type=int)
    wait.add_argument(
        "--state", action="append", type=str.upper, choices=JOB_STATES, metavar="STATE",
        help=f"repeatable; one of {', '.join(JOB_STATES)} (default: {', '.join(FINAL_STATES)})",
    )  # fmt: skip
    wait.add_argument(
        "--timeout", type=float, default=3600,
        help="give up after this many seconds, with exit status 3 (3600)",
    )  # fmt: skip
    commands.add_parser("queue", help="the front of the queue and per-share usage")
    commands.add_parser("shares", help="your shares and their usage")
    for command in commands.choices.values():
        # Also after the command (`gpu-portal show 8 --json`), as people type it; not given
        # there, the one before the command stands.
        command.add_argument(
            "--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON"
        )
    return main


def positive(number: type[int] | type[float]):
    """An argparse type: a number above 0, else the option's error names the rule."""
    word = "whole number" if number is int else "number"

    def read(text: str) -> int | float:
        try:
            value = number(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be a {word} above 0, not {text!r}")
        return value

    return read


class Refused(Exception):
    """gpu-portal itself refuses the request: a bad argument or setting (exit status 2)."""


def job_arguments(command: argparse.ArgumentParser) -> None:
    """What a job request takes (submit, estimate); the job's command goes after --."""
    command.add_argument("--share", required=True)
    command.add_argument("--gpus", type=int, required=True)
    command.add_argument("--gpu-type", required=True)
    command.add_argument("--nodes", type=int, default=1)
    command.add_argument("--priority", type=int, default=0)
    command.add_argument("--name", default="")
    command.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    command.add_argument(
        "--image", help="container image on Kubernetes nodes (default: the connector's)"
    )
    command.add_argument(
        "--working-dir", "--chdir", metavar="DIR",
        help="the directory the command starts in on the node (a relative one is taken from "
        "here, as sbatch --chdir does; default: the job's checkpoint directory)",
    )  # fmt: skip
    command.add_argument("--client-token")
    command.add_argument("--timeout", type=int, dest="timeout_seconds")
    command.add_argument(
        "--expected-seconds", type=int, help="how long it should run: estimates count on it"
    )
    command.add_argument("--max-preemptions", type=int)
    command.add_argument("--retry-attempts", type=int, default=0)
    command.add_argument(
        "--not-preemptible", dest="preemptible", action="store_false",
        help="run only within the share's limit, never preempted",
    )  # fmt: skip
    command.add_argument("job_command", nargs=argparse.REMAINDER)


def submitted_line(job: dict) -> str:
    """What `submit` says of the job it submitted."""
    return f"job {job['id']} {job['state']}: {job['reason']}"


def follow_logs(client: Client, job_id: int, every: float, out) -> int:
    """`logs --follow`: the log on `out` as it grows; what is not the log on stderr."""
    for kind, value in client.follow_logs(job_id, poll=every):
        if kind == "text":
            print(value, end="", file=out, flush=True)
        elif kind == "skipped":
            print(LOG_SKIPPED, file=sys.stderr, flush=True)
        elif kind == "attempt":
            print(LOG_ATTEMPT.format(number=value), file=sys.stderr, flush=True)
        elif kind == "unreachable":
            print(LOG_UNREACHABLE.format(error=value), file=sys.stderr, flush=True)
        else:
            print(LOG_ENDED.format(job=job_id, state=value["state"], reason=value["reason"]),
                  file=sys.stderr)  # fmt: skip
            return 0 if value["state"] == "SUCCEEDED" else 1
    return 1


def job_request(args: argparse.Namespace, *, command_required: bool = True) -> dict:
    """The request `job_arguments` read, as `Client.submit` and `Client.estimate` take it (an
    estimate's command may be left out: it changes no estimate)."""
    command = args.job_command[1:] if args.job_command[:1] == ["--"] else args.job_command
    if not command and command_required:
        raise Refused(NO_COMMAND)
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            raise Refused(BAD_ENV.format(value=item))
        env[name] = value
    return {
        "share": args.share,
        "gpus": args.gpus,
        "gpu_type": args.gpu_type,
        "command": (command if len(command) > 1 else command[0]) if command else None,
        "nodes": args.nodes,
        "priority": args.priority,
        "name": args.name,
        "env": env,
        "image": args.image,
        "working_dir": args.working_dir and os.path.abspath(args.working_dir),
        "client_token": args.client_token,
        "timeout_seconds": args.timeout_seconds,
        "expected_seconds": args.expected_seconds,
        "max_preemptions": args.max_preemptions,
        "preemptible": args.preemptible,
        "retry_attempts": args.retry_attempts,
    }


def span(seconds: float) -> str:
    """A length of time as people say it: 40 s, 20 min, 3 h 5 min, 4 days."""
    seconds = round(abs(seconds))
    if seconds < 90:
        return f"{seconds} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min"
    if minutes < 48 * 60:
        hours, minutes = divmod(minutes, 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{round(minutes / 1440)} days"


def moment(iso: str, now: datetime | None = None) -> str:
    """A time of the API (ISO 8601) as people read it: to the second, in UTC, and how far from
    now (`now`: this machine's clock): "2026-12-05 18:04:30 UTC (in 20 min)". --json keeps the
    API's own."""
    at = datetime.fromisoformat(iso).astimezone(UTC)
    delta = (at - (now or datetime.now(UTC))).total_seconds()
    when = "now" if abs(delta) < 1 else f"in {span(delta)}" if delta > 0 else f"{span(delta)} ago"
    return f"{at:%Y-%m-%d %H:%M:%S} UTC ({when})"


def estimated_gpus(estimate: dict) -> str:
    """Where an estimate (a job's, a what-if's) would start: "node-0 GPUs 0,1; node-1 GPUs 0,1"
    (only the nodes from a portal that gives no GPUs)."""
    allocations = estimate.get("estimated_allocations")
    if allocations:
        return "; ".join(
            f"{a['node']} GPUs {','.join(str(i) for i in a['gpu_indices'])}" for a in allocations
        )
    return ", ".join(estimate.get("estimated_nodes") or [])


def estimate_line(job: dict) -> str:
    """When a waiting job is estimated to start (or an empty string)."""
    if job.get("estimated_start"):
        return f"estimated start {moment(job['estimated_start'])} on {estimated_gpus(job) or '?'}"
    if job.get("estimate_basis"):
        return "estimated start: not within the estimate's horizon"
    return ""


def job_row(job: dict) -> str:
    estimate = f" — {estimate_line(job)}" if job.get("estimated_start") else ""
    return (
        f"{job['id']:>6}  {job['share']:<14} {job['state']:<10} {job['gpus']:>3} × "
        f"{job['gpu_type']:<8} p{job['priority']:<5} {job['name'] or '-':<16} {job['reason']}"
        f"{estimate}"
    )


JOB_HEADER = f"{'ID':>6}  {'SHARE':<14} {'STATE':<10} {'GPUS':>14} {'PRIO':<6} {'NAME':<16} REASON"


def print_job(job: dict, out=sys.stdout, page: str | None = None) -> None:
    """The job as `show` prints it; `page`: its page on the portal's dashboards."""

    def say(*parts: str) -> None:
        print(*parts, file=out)

    named = f" {job['name']!r}" if job["name"] else ""
    say(f"job {job['id']}{named}: {job['state']} — {job['reason']}")
    if page:
        say(f"  page: {page}")
    say(
        f"  share {job['share']}, {job['gpus']} × {job['gpu_type']} on {job['nodes']} node(s), "
        f"priority {job['priority']}, submitted by {job['submitted_by']} at "
        f"{moment(job['submitted_at'])}"
    )
    say(f"  command: {job['command']}")
    if job.get("working_dir"):
        say(f"  starts in: {job['working_dir']}")
    if estimate_line(job):
        say(f"  {estimate_line(job)} ({job['estimate_basis']})")
    latest = job["attempts"][-1] if job.get("attempts") else None
    if latest is not None and latest["started_at"] and latest["ended_at"] is None:
        stopping = latest.get("stop_requested_at")
        stop = f"; told to stop at {moment(stopping)}" if stopping else ""
        say(f"  attempt {latest['number']} running since {moment(latest['started_at'])}{stop}")
    if job["state"] in FINAL_STATES and job.get("finished_at"):
        started = f"started at {moment(job['started_at'])}, " if job.get("started_at") else ""
        say(f"  {started}ended at {moment(job['finished_at'])}")
    if "allocations" in job:
        # The latest attempt's GPUs: held now, or where it last ran.
        where = "on" if latest is not None and latest["ended_at"] is None else "last ran on"
        cluster_job = job.get("cluster_job") or {}
        # The GPUs a connector's cluster manager gave (a Slurm job's), else the portal's own.
        for allocation in cluster_job.get("allocations") or job["allocations"]:
            indices = ",".join(str(i) for i in allocation["gpu_indices"])
            say(f"  {where} node {allocation['node']}: GPUs {indices}")
        if cluster_job.get("id"):
            say(f"  as {cluster_job['id']} of its cluster manager")
        preemptions = job["preemptions"]
        say(f"  attempts {job['attempt_count']}, preemptions {preemptions['count']}")
        for attempt in preemptions["recent"]:
            say(
                f"    attempt {attempt['number']} preempted at {moment(attempt['ended_at'])}"
                f" for job {attempt['preempted_for']}: {attempt['end_reason']}"
            )


def print_ahead(where: dict, out=sys.stdout) -> None:
    """Where a waiting job stands, and whose jobs hold what it waits for."""
    if where["position"] is None:
        return
    print(f"  {where['count']} job(s) ahead of it ({where['gpus']} GPUs):", file=out)
    for entry in where["ahead"][:10]:
        job = f"job {entry['job']}" if entry["job"] is not None else "a job"
        print(f"    {entry['position']:>3}. {job} of share {entry['share']}, "
              f"{entry['gpus']} GPUs, priority {entry['priority']}", file=out)  # fmt: skip
    for holder in where["holders"]:
        job = f"job {holder['job']}" if holder["job"] is not None else "a job"
        what = "stopping for it" if holder["stopping"] else "borrowing"
        print(f"  held: {job} of share {holder['share']}, {holder['gpus']} GPUs, {what}",
              file=out)  # fmt: skip


def usage_lines(name: str, usage: dict) -> list[str]:
    return [
        f"{name:<14} {gpu_type:<8} limit {row['limit']:>4}  used {row['used']:>4}  "
        f"own {row['own']:>4}  borrowed {row['borrowed']:>4}  lent {row['lent']:>4}"
        for gpu_type, row in usage.items()
    ]


def connect(args: argparse.Namespace) -> Client:
    """The client of --url and --token (or PORTAL_URL and PORTAL_TOKEN); Refused, naming the
    setting, for one missing or that cannot be one."""
    if not args.url:
        raise Refused(NO_URL)
    if not args.token:
        raise Refused(NO_TOKEN)
    for check, value, where in ((portal_url, args.url, UNREACHABLE_HINT),
                                (api_token, args.token, TOKEN_HINT)):  # fmt: skip
        try:
            check(value)
        except ValueError as error:
            raise Refused(f"{error}; {where}") from None
    return Client(args.url, args.token)


def run(args: argparse.Namespace, out=sys.stdout) -> int:
    client = connect(args)
    emit = (lambda data: print(json.dumps(data, indent=2), file=out)) if args.json else None

    if args.command == "estimate":
        answer = client.estimate(**job_request(args, command_required=False))
        if emit:
            emit(answer)
            return 0
        start = answer["estimated_start"]
        when = moment(start) if start else "not within the estimate's horizon"
        where = estimated_gpus(answer)
        print(f"would start: {when}" + (f" on {where}" if where else ""), file=out)
        print(f"  {answer['reason'] or 'at once, at the next cycle'}", file=out)
        print(f"  ({answer['estimate_basis']})", file=out)
        return 0
    if args.command == "submit":
        job = client.submit(**job_request(args))
        waited = args.wait or args.follow
        if waited:
            # Said at once: which job this is, should the wait be interrupted.
            print(submitted_line(job), file=sys.stderr, flush=True)
            try:
                if args.follow and not emit:
                    return follow_logs(client, job["id"], FOLLOW_EVERY, out)
                # Until it ends: a job may wait for GPUs for hours, then run for days.
                job = client.wait(job["id"], timeout=None)
            except KeyboardInterrupt:
                print(INTERRUPTED_WAIT.format(job=job["id"]), file=sys.stderr)
                return 130
        if emit:
            emit(job)
        else:
            print(submitted_line(job), file=out)
        if waited:
            return 0 if job["state"] == "SUCCEEDED" else 1
        return 0 if job["state"] != "FAILED" else 1
    if args.command == "ls":
        jobs = client.jobs(
            share=args.share,
            state=args.state,
            submitted_by=args.submitted_by,
            since=args.since,
            limit=args.limit + 1,  # one more: whether there are more than shown
        )
        if len(jobs) > args.limit:  # said on stderr: what a script reads stays the list
            jobs = jobs[: args.limit]
            print(LS_MORE.format(limit=args.limit), file=sys.stderr)
        if emit:
            emit(jobs)
        else:
            print(JOB_HEADER, file=out)
            for job in jobs:
                print(job_row(job), file=out)
        return 0
    if args.command in ("show", "cancel", "wait"):
        if args.command == "show":
            job = client.job(args.job_id)
            if not emit:
                print_job(job, out, page=f"{client.url}/dash/jobs/{job['id']}/")
                if job["state"] == "RUNNABLE":
                    print_ahead(client.ahead(args.job_id), out)
                return 0
        elif args.command == "cancel":
            job = client.cancel(args.job_id)
        else:
            job = client.wait(args.job_id, states=args.state or FINAL_STATES, timeout=args.timeout)
        if emit:
            emit(job)
        else:
            print_job(job, out)
        return 0
    if args.command == "logs":
        if emit:  # the job's JSON, its log in `log_tail`; with --follow, once it has ended
            job = client.wait(args.job_id, timeout=None) if args.follow else client.job(args.job_id)
            emit(job)
            return 0 if not args.follow or job["state"] == "SUCCEEDED" else 1
        if args.follow:
            return follow_logs(client, args.job_id, args.every, out)
        log = client.logs(args.job_id)
        print(log, end="", file=out)
        if not log:  # said on stderr: what a script reads stays the log
            print(NO_LOG.format(job=args.job_id), file=sys.stderr)
        return 0
    if args.command == "queue":
        queue = client.queue()
        if emit:
            emit(queue)
            return 0
        print(f"{queue['runnable']} runnable job(s); front of the queue:", file=out)
        for entry in queue["front"]:
            print(
                f"{entry['position']:>4}. [{entry['considered_as']}] {job_row(entry['job'])}",
                file=out,
            )
        for name, usage in queue["shares"].items():
            for line in usage_lines(name, usage):
                print(line, file=out)
        return 0
    if args.command == "shares":
        shares = client.shares()
        if emit:
            emit(shares)
            return 0
        for share in shares:
            print(
                f"{share['name']} ({share['team']}, {share['strategy']}, {share['state']})",
                file=out,
            )
            for line in usage_lines("", share["usage"]):
                print("  " + line.strip(), file=out)
        return 0
    raise SystemExit(f"unknown command {args.command!r}")


# The exit status of each failure (EXIT_STATUS); each is one line on stderr.
FAILURES: dict[type[Exception], int] = {
    JobEnded: 1, PortalError: 2, Refused: 2, TimeoutError: 3, PortalUnreachable: 4,
}  # fmt: skip


def hint(error: Exception) -> str:
    """What to check, after the error: the URL or the token the CLI was given."""
    if isinstance(error, PortalUnreachable) and error.check_url:
        return f"; {UNREACHABLE_HINT}"
    if isinstance(error, PortalError) and not error.from_the_api:
        return f"; {UNREACHABLE_HINT}"
    if isinstance(error, PortalError) and error.status == 401:
        return f"; {TOKEN_HINT}"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        status = run(args)
        sys.stdout.flush()  # here, where a reader gone away is heard (below)
        return status
    except BrokenPipeError:
        # What read the output went away (`gpu-portal ls | head`): stop quietly, as the shell's
        # own tools do, and keep Python from failing again as it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 130
    except tuple(FAILURES) as error:
        print(f"error: {error}{hint(error)}", file=sys.stderr)
        return next(status for kind, status in FAILURES.items() if isinstance(error, kind))

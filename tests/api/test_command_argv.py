"""`command` is a shell command (a string, kept as it is) or an argv (a list of strings, kept as
the command `shlex.join(argv)`), and an argv reaches the job's process as exactly those
arguments, however many quotes, spaces, `$` and `;` its items hold."""

from __future__ import annotations

import io
import json
import shlex
import sys

import pytest

from portal_client.cli import parser, run
from scheduler.agent.core import Agent, _argv
from scheduler.agent.gpus import fake_gpus
from scheduler.api import serializers as s
from scheduler.models import Job
from scheduler.nodes.services import node_orders
from tests.api.helpers import job_request, place

JOBS = "/api/v1/jobs/"

# Prints its arguments as JSON: what a process was given, item by item.
PRINT_ARGV = "import sys, json; print(json.dumps(sys.argv[1:]))"
# Items a shell would split, expand, run or glob if they were not quoted.
TRICKY = [
    "two words",
    "it's",
    '"double"',
    "$HOME",
    "${PATH}",
    "a;b",
    "x && rm -rf nothing",
    "`id`",
    "$(id)",
    "*",
    "back\\slash",
    "tab\there",
    "new\nline",
    "",
    "-",
    "--flag=value",
    "#not a comment",
    "~",
    "ünïcödé",
]


def submit(world, command, persona="bob", **overrides):
    return world.client(persona).post(
        JOBS, job_request(command=command, **overrides), format="json"
    )


def assert_refused(response, message: str) -> None:
    assert response.status_code == 400, response.content
    assert response.json() == {"command": [message]}
    assert not Job.objects.exists(), "a refused submit created a job"


# --- Stored and shown ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["python", "train.py", "--resume"], "python train.py --resume"),
        (["python", "-c", "print('hi')"], "python -c 'print('\"'\"'hi'\"'\"')'"),
        (["sh", "-c", "echo $HOME; ls"], "sh -c 'echo $HOME; ls'"),
        (["grep", "", "log.txt"], "grep '' log.txt"),
    ],
)
def test_an_argv_list_is_kept_as_its_shlex_joined_command(world, argv, command):
    """The job, as the submit answers it, as it is described later and as it is stored, carries
    the one shell command that means that argv."""
    response = submit(world, argv)
    assert response.status_code == 201, response.content
    assert response.json()["command"] == command == shlex.join(argv)
    assert world.client("bob").get(f"{JOBS}{response.json()['id']}/").json()["command"] == command
    assert Job.objects.get().command == command
    assert shlex.split(command) == argv


@pytest.mark.parametrize(
    "command", ["cd /data && python train.py 'a b' | tee log", "  python train.py  \n", "x"]
)
def test_a_string_command_is_kept_as_it_is(world, command):
    """A string is the shell command itself: not split, not joined, not trimmed."""
    response = submit(world, command)
    assert response.status_code == 201, response.content
    assert response.json()["command"] == command
    assert Job.objects.get().command == command


def test_an_argv_and_its_joined_string_are_the_same_request(world):
    """The same client_token with the argv, then with shlex.join(argv), returns the first job:
    the two are one request."""
    argv = ["python", "train.py", "--name", "run 1"]
    first = submit(world, argv, client_token="nightly")
    again = submit(world, shlex.join(argv), client_token="nightly")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert Job.objects.count() == 1


def test_an_argv_as_long_as_the_limit_once_joined_is_accepted(world):
    argv = ["x" * (s.MAX_COMMAND_CHARS - 2), "y"]
    response = submit(world, argv)
    assert response.status_code == 201, response.content
    assert len(Job.objects.get().command) == s.MAX_COMMAND_CHARS


# --- Refused ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], s.COMMAND_ARGV_EMPTY),
        ([""], s.COMMAND_ARGV_PROGRAM),
        (["  ", "train.py"], s.COMMAND_ARGV_PROGRAM),
        ([7], s.COMMAND_ARGV_ITEM_TYPE.format(index=0, kind="a number")),
        (["python", 1.5], s.COMMAND_ARGV_ITEM_TYPE.format(index=1, kind="a number")),
        (["python", None], s.COMMAND_ARGV_ITEM_TYPE.format(index=1, kind="null")),
        (["python", True], s.COMMAND_ARGV_ITEM_TYPE.format(index=1, kind="a boolean")),
        (["python", ["train.py"]], s.COMMAND_ARGV_ITEM_TYPE.format(index=1, kind="a list")),
        (["python", "x", {"a": 1}], s.COMMAND_ARGV_ITEM_TYPE.format(index=2, kind="an object")),
        (["python", "train.py", "a\x00b"], s.COMMAND_ARGV_NUL.format(index=2)),
        (["\x00"], s.COMMAND_ARGV_NUL.format(index=0)),
    ],
)
def test_a_bad_argv_is_refused_naming_the_rule(world, argv, message):
    assert_refused(submit(world, argv), message)


def test_an_argv_over_the_limit_once_joined_is_refused(world):
    """The limit is on the command the job runs: quoting counts. Every `'` takes five
    characters once quoted, so these 20,000 characters join into some 100,000."""
    quotes = "'" * 20_000
    assert len(quotes) < s.MAX_COMMAND_CHARS < len(shlex.join(["echo", quotes]))
    assert_refused(submit(world, ["echo", quotes]), s.COMMAND_ARGV_TOO_LONG)
    assert_refused(submit(world, ["x" * (s.MAX_COMMAND_CHARS - 1), "y"]), s.COMMAND_ARGV_TOO_LONG)


@pytest.mark.parametrize("command", [{"program": "python"}, True, None])
def test_a_command_neither_string_nor_list_is_refused(world, command):
    assert_refused(submit(world, command), s.COMMAND_TYPE)


def test_the_schema_says_string_or_list_of_strings(world):
    schema = world.client(None).get("/api/schema/?format=json").json()
    command = schema["components"]["schemas"]["JobSubmitRequest"]["properties"]["command"]
    assert command["oneOf"] == [
        {"type": "string", "maxLength": s.MAX_COMMAND_CHARS},
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
    ]


# --- Run ----------------------------------------------------------------------------------------


def run_on_agent(world, job_id: int, tmp_path) -> dict:
    """Place the job on h100-0, hand the node's run order to a real agent (which starts the
    command as it starts every job) and return the event it reports when the process exits."""
    place(Job.objects.get(pk=job_id), world.nodes["h100-0"], list(range(8)))
    (order,) = node_orders(node=world.nodes["h100-0"]).run
    agent = Agent(portal="http://127.0.0.1:9", join_token="x", name="h100-0", gpu_type="h100",
                  gpus=fake_gpus(8, "h100"), work_dir=tmp_path,
                  checkpoint_root=tmp_path / "checkpoints")  # fmt: skip
    agent.start(order)
    agent.processes[order["attempt"]].popen.wait(timeout=60)
    agent.supervise()
    (event,) = agent.outbox
    return event


def test_an_argv_with_shell_syntax_reaches_the_process_as_exactly_those_arguments(world, tmp_path):
    """Quoted for the shell the agent runs it under, and unquoted by it: each item arrives as
    one argument, unexpanded, none split, none lost (the empty one included)."""
    argv = [sys.executable, "-c", PRINT_ARGV, *TRICKY]
    response = submit(world, argv)
    assert response.status_code == 201, response.content
    assert _argv(response.json()["command"])[:2] == ["/bin/sh", "-c"]  # the shell's way
    event = run_on_agent(world, response.json()["id"], tmp_path)
    assert (event["end"], event["exit_code"]) == ("exit", 0), event
    assert json.loads(event["log_tail"]) == TRICKY


def test_a_plain_argv_reaches_the_process_without_a_shell(world, tmp_path):
    """Items that need no quoting make a command the agent runs as it is, without /bin/sh."""
    argv = [sys.executable, "print_argv.py", "--lr", "0.1", "data/train.csv"]
    response = submit(world, argv)
    assert response.status_code == 201, response.content
    assert _argv(response.json()["command"]) == argv  # exec'd as it is
    # In the job's working directory, its checkpoint directory.
    job_dir = tmp_path / "checkpoints" / f"job-{response.json()['id']}"
    job_dir.mkdir(parents=True)
    (job_dir / "print_argv.py").write_text(PRINT_ARGV + "\n")
    event = run_on_agent(world, response.json()["id"], tmp_path)
    assert (event["end"], event["exit_code"]) == ("exit", 0), event
    assert json.loads(event["log_tail"]) == argv[2:]


# --- The CLI, as before -------------------------------------------------------------------------


def cli_submit(world, live_server, *command: str) -> dict:
    out = io.StringIO()
    args = parser().parse_args(
        ["--url", live_server.url, "--token", world.tokens["bob"], "--json", "submit",
         "--share", "research", "--gpus", "8", "--gpu-type", "h100", "--", *command]
    )  # fmt: skip
    assert run(args, out=out) == 0
    return json.loads(out.getvalue())


def test_the_cli_sends_words_as_an_argv_and_one_argument_as_a_shell_command(world, live_server):
    """`submit -- python -c 'print(1)' 'a;b'` runs those words; `submit -- 'cd x && make'`
    is one shell command, as before."""
    words = ["python", "-c", "print('a b')", "a;b", "$HOME"]
    assert cli_submit(world, live_server, *words)["command"] == shlex.join(words)
    assert cli_submit(world, live_server, "cd x && make")["command"] == "cd x && make"

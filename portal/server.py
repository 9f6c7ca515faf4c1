"""`gpu-portal-server`: the portal on its production server (`make serve` runs `serve`).

    gpu-portal-server serve     setup, then the web server, the Celery worker and beat, in the
                                foreground; Ctrl-C (or SIGTERM) stops them all
    gpu-portal-server setup     apply migrations and collect static files (run before `web`
                                after an upgrade: migrations first, agents after)
    gpu-portal-server web       the web server only: uvicorn on `portal.asgi` (one systemd unit)
    gpu-portal-server worker    the Celery worker that runs the scheduling cycle
    gpu-portal-server beat      Celery beat: the cycle's timer, the dashboards' sampling, the
                                notifications' dispatch, the daily session clean-up
    gpu-portal-server manage …  any `manage.py` command (createsuperuser, agent_join_token, …)

Before it starts, each command but `manage` checks that PostgreSQL and Redis answer (`beat`,
which never reads the database: Redis only); one that does not ends it with exit status 1 and
one line naming which, where and why.

Configuration comes from the environment (docs/deploy.md): DATABASE_URL and REDIS_URL are
required (PostgreSQL and Redis: the embedded defaults are for `make run`), PORTAL_ADDRESS
(host:port, default 127.0.0.1:8000), WEB_WORKERS (processes, default 2), DATABASE_POOL_SIZE
(connections per process, default 8), PORTAL_VAR_DIR (state: static files, beat's schedule, a
generated SECRET_KEY). DEBUG is off; logs go to stdout as one JSON object a line."""

from __future__ import annotations

import argparse
import importlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

from portal.address import DEFAULT_ADDRESS
from scheduler.version import VERSION

SERVICE_TIMEOUT_SECONDS = 5
REQUIRED = {
    "DATABASE_URL": "postgres://USER@HOST:5432/DB (the portal's PostgreSQL database)",
    "REDIS_URL": "redis://HOST:6379/0 (the Celery broker, the cycle's lock, the agents' wake-ups)",
}
PRODUCTION_DEFAULTS = {
    "DEBUG": "0",
    "LOG_FORMAT": "json",
    "DATABASE_POOL_SIZE": "8",
    "WHITENOISE_USE_FINDERS": "0",
}


def _environment() -> dict[str, str]:
    """The environment of the server's processes: the caller's, with the production defaults
    under it and a SECRET_KEY kept in PORTAL_VAR_DIR when none is given."""
    env = {**PRODUCTION_DEFAULTS, **os.environ}
    missing = [f"  {name}={example}" for name, example in REQUIRED.items() if not env.get(name)]
    if missing:
        sys.exit("gpu-portal-server: set in the environment:\n" + "\n".join(missing))
    if not env["DATABASE_URL"].startswith(("postgres://", "postgresql://", "pgsql://")):
        sys.exit("gpu-portal-server: DATABASE_URL must be a PostgreSQL database (postgres://...); "
                 "SQLite is for `make run`.")  # fmt: skip
    if not env["DATABASE_POOL_SIZE"].isdigit() or int(env["DATABASE_POOL_SIZE"]) < 1:
        # Under ASGI each request runs on a thread of its own: without a pool, each would open
        # a connection of its own.
        sys.exit("gpu-portal-server: DATABASE_POOL_SIZE must be 1 or more (connections per "
                 "process; 8 by default).")  # fmt: skip
    var = Path(env.setdefault("PORTAL_VAR_DIR", str(Path.cwd() / "var")))
    # Every process keeps its state there (beat its schedule), also on a host where `setup`,
    # which creates it with the static files, never ran.
    var.mkdir(parents=True, exist_ok=True)
    if not env.get("SECRET_KEY"):
        env["SECRET_KEY"] = _kept_secret_key(var / "secret-key")
    env.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    return env


def _kept_secret_key(path: Path) -> str:
    """A secret key generated once and kept (mode 0600), so that sessions survive restarts and
    the AWS access keys encrypted with it stay readable. A kept key that others may read, or
    an empty one, is refused: the key signs sessions."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written whole under another name, then linked into place: a process that starts at
        # the same moment finds no key or the whole key, never half of one.
        draft = path.with_name(f".{path.name}.{os.getpid()}")
        descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_urlsafe(50))
        try:
            os.link(draft, path)
            print(f"gpu-portal-server: generated SECRET_KEY in {path}", file=sys.stderr, flush=True)
        except FileExistsError:
            pass  # another process kept its key first: that one is everyone's
        finally:
            draft.unlink()
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        sys.exit(f"gpu-portal-server: {path} holds SECRET_KEY but others may read it "
                 f"(mode {mode:04o}): chmod 600 {path}")  # fmt: skip
    key = path.read_text().strip()
    if not key:
        sys.exit(f"gpu-portal-server: {path} is empty: set SECRET_KEY, or restore the key kept "
                 "there (a new one ends every session and loses the AWS access keys)")  # fmt: skip
    return key


def load_settings(env: dict[str, str], *, prog: str = "gpu-portal-server") -> ModuleType:
    """The settings as every process will read them from `env`, loaded here before anything
    starts: a setting that breaks its rule ends this process with one line that names it,
    instead of a traceback from each process later."""
    from django.core.exceptions import ImproperlyConfigured

    os.environ.update(env)
    try:
        return importlib.import_module(os.environ.get("DJANGO_SETTINGS_MODULE", "portal.settings"))
    except ImproperlyConfigured as error:
        sys.exit(f"{prog}: {error}")


def _check_listening(settings: ModuleType, env: dict[str, str]) -> None:
    """PORTAL_ADDRESS can be listened on (uvicorn binds as this does): a port in use or a host
    that is not this machine's is said in one line before anything starts."""
    address = env.get("PORTAL_ADDRESS", DEFAULT_ADDRESS)
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            settings.PORTAL_HOST, settings.PORTAL_PORT, type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE,
        )[0]  # fmt: skip
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(where)
    except OSError as error:
        sys.exit(f"gpu-portal-server: cannot listen on PORTAL_ADDRESS ({address}): "
                 f"{error.strerror or error}")  # fmt: skip


def _manage(env: dict[str, str], *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "django", *args], env=env)
    if done.returncode != 0:
        sys.exit(f"gpu-portal-server: manage.py {args[0]} failed (exit {done.returncode}); "
                 "its error is above.")  # fmt: skip


def _where(url: str) -> str:
    """A database or Redis URL without its user and password: host, port and what follows."""
    parts = urlsplit(url)
    port = _port(parts)
    return f"{parts.scheme}://{parts.hostname or ''}{f':{port}' if port else ''}{parts.path}"


def _port(parts) -> int | None:
    try:
        return parts.port
    except ValueError:  # not a number: the error says why the URL is refused
        return None


def check_services(env: dict[str, str], *, database: bool = True) -> None:
    """PostgreSQL (unless not `database`) and Redis answer, or one line says which does not and
    why, and the command ends with exit status 1. Without it, an unreachable database was a
    pool's warnings for ten seconds, then two tracebacks (`setup`), a web server that started
    and answered every request with an error (`web`), or a traceback for every cycle
    (`worker`)."""
    if database:
        _check_database(env["DATABASE_URL"])
    _check_redis(env["REDIS_URL"])


def _check_database(url: str) -> None:
    import psycopg

    try:
        psycopg.connect(url.replace("pgsql://", "postgres://", 1),
                        connect_timeout=SERVICE_TIMEOUT_SECONDS).close()  # fmt: skip
    except psycopg.ProgrammingError:
        pass  # options libpq does not take, Django's (?conn_max_age=...): migrate tells
    except psycopg.OperationalError as error:  # refused, timed out, refused the login, no such db
        reason = str(error).strip().splitlines()[0]
        sys.exit(f"gpu-portal-server: cannot reach PostgreSQL at DATABASE_URL "
                 f"({_where(url)}): {reason}")  # fmt: skip


def _check_redis(url: str) -> None:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=SERVICE_TIMEOUT_SECONDS,
                                      socket_connect_timeout=SERVICE_TIMEOUT_SECONDS)  # fmt: skip
        client.ping()
        client.close()
    except (redis.RedisError, ValueError) as error:
        sys.exit(f"gpu-portal-server: cannot reach Redis at REDIS_URL ({_where(url)}): {error}")


def setup(env: dict[str, str]) -> None:
    check_services(env)
    _manage(env, "migrate", "--no-input", "-v1")
    _manage(env, "collectstatic", "--no-input", "-v0")


def commands(env: dict[str, str]) -> dict[str, list[str]]:
    """The long-running processes of the portal, as the systemd units run them one each."""
    var = Path(env["PORTAL_VAR_DIR"])
    return {
        "web": [sys.executable, "-m", "portal.server", "web"],
        "worker": [sys.executable, "-m", "celery", "-A", "portal", "worker", "-l", "info",
                   "-c", env.get("WORKER_CONCURRENCY", "2")],
        "beat": [sys.executable, "-m", "celery", "-A", "portal", "beat", "-l", "info",
                 "-s", str(var / "celerybeat-schedule")],
    }  # fmt: skip


def web(env: dict[str, str], settings: ModuleType) -> None:
    """uvicorn in this process: one or more worker processes on `portal.asgi`. Logging is
    Django's (LOGGING), set up in each worker when it imports the application."""
    import uvicorn

    _check_listening(settings, env)
    check_services(env)
    os.environ.update(env)
    uvicorn.run(
        "portal.asgi:application",
        host=settings.PORTAL_HOST,
        port=settings.PORTAL_PORT,
        workers=settings.WEB_WORKERS,
        loop="uvloop",
        http="httptools",
        lifespan="off",  # Django's ASGI handler has no lifespan events
        log_config=None,
        access_log=settings.ACCESS_LOG,
        # An agent's long poll waits up to AGENT_POLL_MAX_WAIT_SECONDS; its connection is
        # reused for the next one.
        timeout_keep_alive=settings.KEEP_ALIVE_SECONDS,
        # On SIGTERM, requests in flight get this long to finish; then the connections are
        # closed (waiting agents' polls among them: they poll again, elsewhere or after the
        # restart). Without a bound, kept-alive agents would hold the shutdown forever.
        timeout_graceful_shutdown=settings.GRACEFUL_SHUTDOWN_SECONDS,
        proxy_headers=True,
        forwarded_allow_ips=settings.FORWARDED_ALLOW_IPS,
    )


def serve(env: dict[str, str], settings: ModuleType) -> int:
    """Setup, then web, worker and beat, supervised: if one exits, the others are stopped."""
    _check_listening(settings, env)
    setup(env)
    processes = {name: subprocess.Popen(argv, env=env) for name, argv in commands(env).items()}
    address = env.get("PORTAL_ADDRESS", DEFAULT_ADDRESS)
    print(f"gpu-portal-server: serving at http://{address}/ (TLS is the reverse proxy's, "
          "docs/deploy.md); Ctrl-C stops everything", file=sys.stderr, flush=True)  # fmt: skip
    return supervise(processes)


def supervise(processes: dict[str, subprocess.Popen], *, interval: float = 0.5) -> int:
    """Wait until SIGINT/SIGTERM or until one process exits, then stop them all, the last started
    first. Returns the exit code of the one that ended first, 0 on a signal."""
    stopping = False

    def stop(*_args) -> None:
        nonlocal stopping
        stopping = True

    previous = {number: signal.signal(number, stop) for number in (signal.SIGINT, signal.SIGTERM)}
    exit_code = 0
    while not stopping:
        for name, process in processes.items():
            if process.poll() is not None:
                print(f"{name} exited with {process.returncode}; stopping the rest.",
                      file=sys.stderr, flush=True)  # fmt: skip
                exit_code = process.returncode or 1
                stopping = True
                break
        else:
            time.sleep(interval)
    stop_in_reverse(processes.values())
    for number, handler in previous.items():
        signal.signal(number, handler)
    return exit_code


def stop_in_reverse(processes) -> None:
    """Stop processes in the reverse of their start order, each gone before the next is asked
    (SIGTERM, then SIGKILL after 10 s): what was started last depends on what came before (an
    agent on the web server), so it must not outlive it and log that the portal is unreachable."""
    for process in reversed(list(processes)):
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_until_answering(url: str, *, timeout: float = 60.0) -> bool:
    """True once `url` answers 200 (the web server is up), False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu-portal-server",
        description="The GPU quota portal on its production server.",
        epilog="Configuration comes from the environment: see docs/deploy.md.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("serve", "setup, then web, worker and beat in the foreground"),
        ("setup", "apply migrations and collect static files"),
        ("web", "the web server only (uvicorn)"),
        ("worker", "the Celery worker (the scheduling cycle)"),
        ("beat", "Celery beat (timers)"),
    ):
        sub.add_parser(name, help=help_text)
    manage = sub.add_parser("manage", help="a manage.py command, e.g. createsuperuser")
    manage.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    env = _environment()
    settings = load_settings(env)
    if args.command == "serve":
        return serve(env, settings)
    if args.command == "setup":
        setup(env)
        return 0
    if args.command == "web":
        web(env, settings)
        return 0
    if args.command == "manage":
        return subprocess.run([sys.executable, "-m", "django", *args.args], env=env).returncode
    check_services(env, database=args.command != "beat")  # beat only sends to Redis
    os.execve(sys.executable, commands(env)[args.command], env)


if __name__ == "__main__":
    sys.exit(main())

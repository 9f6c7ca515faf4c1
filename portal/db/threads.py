"""Database work of async views, on a few threads of their own.

Under the production server (ASGI, `portal.asgi`) an async view awaits `in_database_thread(fn)`:
`fn` runs on one of a fixed set of threads (DATABASE_THREADS), each with its connection taken
for the call and given back after it (to the pool of DATABASE_POOL_SIZE, or kept while it is
usable without one). So thousands of requests that wait (the agents' long polls) hold no thread
and no connection, and those that work share as many threads as the pool has connections.

A caller may say when it gives up waiting for its answer (`caller_waits`: an agent's request,
whose agent sends it again then). Database work still waiting for a thread at that moment is
not done: it raises `GaveUp` instead. Under overload, work done for answers no one reads while
their agents ask again would only add to the wait of every request after it.

Under WSGI (`manage.py runserver`, the test client) an async view runs on its request's thread
anyway: `fn` runs there too, as Django's own `sync_to_async` does, so it sees the request's
transaction (a test's, for instance)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connection

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger(__name__)

# A turn that took longer than this is logged, with where its time went.
SLOW_TURN_SECONDS = 2.0
# Work left undone for callers that had given up is logged at most this often, with a count.
GAVE_UP_LOG_SECONDS = 10.0

_executor: ThreadPoolExecutor | None = None
# When the caller of the database work to come gives up waiting (time.monotonic()), if it says.
_gives_up_at: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "gives_up_at", default=None
)


class GaveUp(Exception):
    """The caller had given up waiting before its database work could begin: it was not done."""


@contextlib.contextmanager
def caller_waits(seconds: float) -> Iterator[None]:
    """Database work asked for within the block is left undone (`GaveUp`) if it has not begun
    `seconds` from now, when its caller will have given up waiting for the answer."""
    token = _gives_up_at.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _gives_up_at.reset(token)


def use_database_threads() -> None:
    """Run async views' database work on the shared threads (called by `portal.asgi`)."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(
            max_workers=settings.DATABASE_THREADS, thread_name_prefix="database"
        )


async def in_database_thread(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run `fn(*args, **kwargs)` where it may use the database, and return what it returns."""
    call = functools.partial(fn, *args, **kwargs)
    if _executor is None:
        return await sync_to_async(call, thread_sensitive=True)()
    return await sync_to_async(
        functools.partial(_with_connection, call, _gives_up_at.get()),
        thread_sensitive=False,
        executor=_executor,
    )()


def _with_connection(call: Callable[[], R], gives_up_at: float | None = None) -> R:
    if gives_up_at is not None and time.monotonic() >= gives_up_at:
        _given_up.note(1)
        raise GaveUp()
    # What Django does around a request (request_started / request_finished), around one call:
    # a broken or too old connection is not reused; with a pool, the connection goes back.
    close_old_connections()
    try:
        return call()
    finally:
        release_database_connection()


def release_database_connection() -> None:
    """With a connection pool, hand this thread's connection back (unless a transaction needs
    it); the next query takes one again. Without one, keep it while it is usable: closing would
    only make the next query open a new connection, which costs more than keeping it."""
    if connection.in_atomic_block:
        return
    if getattr(connection, "pool", None) is not None:
        connection.close()
    else:
        connection.close_if_unusable_or_obsolete()


class KeyedLocks:
    """Database calls about the same keys (an attempt's id), one at a time, waiting on the event
    loop rather than on a database lock: the agents of a gang's nodes report about the same
    attempt at the same moment, and each would otherwise hold one of the few database threads
    while it waits for the job's row lock the one before it holds. Across processes they still
    meet at the row lock, one thread each at most. Under WSGI (each request its own loop and
    thread) this does nothing."""

    def __init__(self) -> None:
        self.locks: dict[int, asyncio.Lock] = {}
        self.users: dict[int, int] = {}

    @contextlib.asynccontextmanager
    async def held(self, keys: Iterable[int]) -> AsyncIterator[None]:
        keys = sorted(set(keys)) if _executor is not None else []
        for key in keys:
            self.users[key] = self.users.get(key, 0) + 1
            self.locks.setdefault(key, asyncio.Lock())
        acquired: list[int] = []
        try:
            for key in keys:  # in order: two requests never wait for each other
                await self.locks[key].acquire()
                acquired.append(key)
            yield
        finally:
            for key in acquired:
                self.locks[key].release()
            for key in keys:
                self.users[key] -= 1
                if not self.users[key]:
                    del self.users[key], self.locks[key]


class KeyedTurns:
    """Database calls about the same keys, in turns (`KeyedLocks`), where the calls that come
    before a turn's database thread has begun its work share it: they run one after another in
    that one database call, each with its own answer or exception, as if each had had its own
    turn; calls in a row that name the same `together` are given to it at once, to do their
    work in fewer statements. The 64 nodes of a gang that report its end at the same moment so
    take a turn or two, not 64: under load each turn waits for a database thread, and the
    reports that come meanwhile join it instead of waiting for it and then for a thread again
    (at 2,000 agents, twice such a wait outlasted the agents' 10 s timeout). A call about other
    keys (or about some of the same keys and others) waits for a turn of its own. A call whose
    caller had given up waiting (`caller_waits`) when the turn's work began is left undone
    (`GaveUp`). Under WSGI each call simply runs."""

    def __init__(self, locks: KeyedLocks) -> None:
        self.locks = locks
        self.waiting: dict[tuple[int, ...], _Turn] = {}  # the turn calls may still join
        self.turns: set[asyncio.Task] = set()

    async def run(
        self, keys: Iterable[int], call: Callable[[], R], *, together: Together | None = None
    ) -> R:
        """Run `call` (it may use the database) in a turn of `keys`; return what it returns.
        `together([calls])`, where given, does the work of such calls in a row (or of this one
        alone), and returns what each would have: (False, its answer) or (True, what it
        raised)."""
        key = tuple(sorted(set(keys)))
        if _executor is None or not key:
            async with self.locks.held(key):
                ((raised, outcome),) = await in_database_thread(
                    _one_after_another, [(call, together)]
                )
            if raised:
                raise outcome
            return outcome
        answer = asyncio.get_running_loop().create_future()
        entry = ((call, together), answer, _gives_up_at.get())
        turn = self.waiting.get(key)
        if turn is None or not turn.join(entry):
            turn = self.waiting[key] = _Turn()
            turn.join(entry)
            # A task of its own: the calls that join the turn still run if this request is
            # cancelled (its client went away) while the turn is awaited.
            task = asyncio.create_task(self._turn(key, turn))
            self.turns.add(task)
            task.add_done_callback(self.turns.discard)
        return await asyncio.shield(answer)

    async def _turn(self, key: tuple[int, ...], turn: _Turn) -> None:
        # Its callers' own times to give up are in its calls; the turn has none (it has the
        # context of the call that began it).
        _gives_up_at.set(None)
        began = time.monotonic()
        ran: list[float] = []  # when the database thread took the turn, and when it was done
        try:
            async with self.locks.held(key):
                given = time.monotonic()
                calls, outcomes = await in_database_thread(_turn_work, ran, turn)
        except BaseException as error:  # the server's shutdown cancels it, too
            calls = turn.close()
            if self.waiting.get(key) is turn:
                del self.waiting[key]
            for _, answer, _ in calls:
                if answer.done():
                    continue
                if isinstance(error, asyncio.CancelledError):
                    answer.cancel()
                else:
                    answer.set_exception(error)
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        if self.waiting.get(key) is turn:
            del self.waiting[key]  # closed: a call that came since began the next turn
        _log_if_slow(key, len(calls), began, given, ran)
        for (_, answer, _), (raised, outcome) in zip(calls, outcomes, strict=True):
            if answer.done():
                continue
            if raised:
                answer.set_exception(outcome)
            else:
                answer.set_result(outcome)


class _Turn:
    """The calls of one turn. The event loop adds them (`join`) until the turn's database
    thread takes them (`close`), under a lock as the two are different threads."""

    def __init__(self) -> None:
        self.calls: list[Entry] = []
        self.closed = False
        self._lock = threading.Lock()

    def join(self, entry: Entry) -> bool:
        """Add the call; False once the turn's work has begun (it waits for the next turn)."""
        with self._lock:
            if self.closed:
                return False
            self.calls.append(entry)
            return True

    def close(self) -> list[Entry]:
        """No call joins any more; the calls it has."""
        with self._lock:
            self.closed = True
            return list(self.calls)


def _turn_work(ran: list[float], turn: _Turn) -> tuple[list[Entry], list[tuple[bool, Any]]]:
    """On the turn's database thread: take its calls and run them (`_one_after_another`), but
    those whose callers have given up waiting (`caller_waits`), which raise `GaveUp`."""
    calls = turn.close()
    now = time.monotonic()
    ran.append(now)
    try:
        late = [at is not None and now >= at for _, _, at in calls]
        live = [call for (call, _, _), gone in zip(calls, late, strict=True) if not gone]
        done = iter(_one_after_another(live))
        if any(late):
            _given_up.note(sum(late))
        return calls, [(True, GaveUp()) if gone else next(done) for gone in late]
    finally:
        ran.append(time.monotonic())


class _GivenUp:
    """Logs the calls left undone for callers that had given up, a count now and then (under
    overload there are thousands): a sign the database threads cannot keep up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unlogged = 0
        self._logged_at = 0.0

    def note(self, calls: int) -> None:
        with self._lock:
            self._unlogged += calls
            now = time.monotonic()
            if now - self._logged_at < GAVE_UP_LOG_SECONDS:
                return
            unlogged, self._unlogged, self._logged_at = self._unlogged, 0, now
        logger.warning(
            "left undone %d agent request(s) whose agents had given up waiting for a database "
            "thread (they send them again): the database threads do not keep up", unlogged,
        )  # fmt: skip


_given_up = _GivenUp()


def _log_if_slow(
    key: tuple[int, ...], calls: int, began: float, given: float, ran: list[float]
) -> None:
    """A turn slower than SLOW_TURN_SECONDS says where its time went: waiting for the turns
    before it (of the same keys), for a database thread, or in its own database work."""
    took = time.monotonic() - began
    if took <= SLOW_TURN_SECONDS or len(ran) != 2:
        return
    logger.warning(
        "slow turn of %d agent request(s) about attempt(s) %s: %.2f s, of which %.2f s waiting "
        "for the turns before it, %.2f s for a database thread, %.2f s in the database work",
        calls, ",".join(map(str, key)), took, given - began, ran[0] - given, ran[1] - ran[0],
    )  # fmt: skip


Call = tuple[Callable[[], Any], "Together | None"]
# A call of a turn, the future of its answer, and when its caller gives up waiting (or None).
Entry = tuple[Call, asyncio.Future, float | None]
Together = Callable[[list[Callable[[], Any]]], list[tuple[bool, Any]]]


def _one_after_another(calls: list[Call]) -> list[tuple[bool, Any]]:
    """(raised, what it returned or raised) of each call, in order, or of those in a row that
    name the same `together`, given to it at once (a call alone, too). Under the production
    server each has the connection handling of a call of its own (`_with_connection`)."""
    outcomes: list[tuple[bool, Any]] = []
    i = 0
    while i < len(calls):
        if i and _executor is not None:  # `in_database_thread` does it for the first
            release_database_connection()
            close_old_connections()
        call, together = calls[i]
        j = i + 1
        while together is not None and j < len(calls) and calls[j][1] is together:
            j += 1
        try:
            if together is not None:
                row = [c for c, _ in calls[i:j]]
                outcomes += together(row)
            else:
                outcomes.append((False, call()))
        except Exception as error:  # noqa: BLE001 (its callers': handed back to them)
            outcomes += [(True, error)] * (j - i)
        i = j
    return outcomes

"""Database calls about the same attempt take turns in a web process, and the calls that come
before a turn's database work has begun share it (portal.db.threads.KeyedTurns): the nodes of
a gang report its end at the same moment, and 64 turns, each waiting for a database thread
under load, outlasted the agents' 10 s report timeout. Each call still gets its own answer."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from portal.db import threads

WAIT = 30  # seconds: only a broken test waits that long


@pytest.fixture
def database_calls(monkeypatch) -> list:
    """The calls to a database thread, on real threads as under the production server."""
    calls: list = []
    real = threads.in_database_thread

    async def counted(fn, *args, **kwargs):
        calls.append(fn)
        return await real(fn, *args, **kwargs)

    with ThreadPoolExecutor(max_workers=3) as executor:
        monkeypatch.setattr(threads, "_executor", executor)
        monkeypatch.setattr(threads, "in_database_thread", counted)
        yield calls


def held_turn():
    """A call that holds its turn (and a database thread) until `go_on` is set."""
    inside, go_on = threading.Event(), threading.Event()

    def call() -> str:
        inside.set()
        go_on.wait(WAIT)
        return "first"

    return call, inside, go_on


def node_report(node: int):
    def call() -> str:
        if node == 2:
            raise ValueError("events: node 2's report is bad")
        return f"node {node}"

    return call


def test_calls_that_come_during_a_turn_share_the_next_one_each_with_its_own_answer(
    database_calls,
):
    turns = threads.KeyedTurns(threads.KeyedLocks())
    first, inside, go_on = held_turn()

    async def main():
        ahead = asyncio.create_task(turns.run([7], first))
        await asyncio.to_thread(inside.wait, WAIT)
        gang = [asyncio.create_task(turns.run([7], node_report(n))) for n in range(5)]
        # Another attempt's call goes on meanwhile, in a turn of its own.
        assert await turns.run([8], lambda: "attempt 8") == "attempt 8"
        go_on.set()
        return await ahead, await asyncio.gather(*gang, return_exceptions=True)

    ahead, answers = asyncio.run(main())
    assert ahead == "first"
    assert answers[:2] == ["node 0", "node 1"] and answers[3:] == ["node 3", "node 4"]
    assert isinstance(answers[2], ValueError)  # only its own caller hears it
    assert len(database_calls) == 3  # the first; attempt 8's; the five of the gang together
    assert turns.waiting == {} and turns.turns == set()


def test_calls_that_come_while_a_turn_waits_for_a_database_thread_join_it(monkeypatch):
    """Every database thread is busy (another attempt's call holds the only one): a gang's
    reports that come while their turn waits for a thread all run in that turn, not in a turn
    after it that would wait for a thread again."""
    calls: list = []
    real = threads.in_database_thread

    async def counted(fn, *args, **kwargs):
        calls.append(fn)
        return await real(fn, *args, **kwargs)

    turns = threads.KeyedTurns(threads.KeyedLocks())
    busy, inside, go_on = held_turn()
    with ThreadPoolExecutor(max_workers=1) as executor:
        monkeypatch.setattr(threads, "_executor", executor)
        monkeypatch.setattr(threads, "in_database_thread", counted)

        async def main():
            other = asyncio.create_task(turns.run([8], busy))
            await asyncio.to_thread(inside.wait, WAIT)
            first = asyncio.create_task(turns.run([7], node_report(0)))
            await asyncio.sleep(0.05)  # its turn now waits for the database thread
            rest = [asyncio.create_task(turns.run([7], node_report(n))) for n in (1, 3, 4)]
            await asyncio.sleep(0.05)
            go_on.set()
            return await other, await asyncio.gather(first, *rest)

        other, answers = asyncio.run(main())
    assert other == "first" and answers == ["node 0", "node 1", "node 3", "node 4"]
    assert len(calls) == 2  # attempt 8's, and one for the whole gang of attempt 7
    assert turns.waiting == {} and turns.turns == set()


def test_calls_that_name_the_same_together_are_given_to_it_at_once(database_calls):
    turns = threads.KeyedTurns(threads.KeyedLocks())
    first, inside, go_on = held_turn()
    given: list[list[str]] = []

    def reports(calls) -> list[tuple[bool, object]]:
        """Answers several nodes' reports at once, as if each had come alone."""
        given.append([call() for call in calls])
        return [(False, f"{name}: ok") for name in given[-1]]

    async def main():
        ahead = asyncio.create_task(turns.run([7], first))
        await asyncio.to_thread(inside.wait, WAIT)
        gang = [turns.run([7], lambda n=n: f"node {n}", together=reports) for n in range(3)]
        poll = turns.run([7], lambda: "a poll, alone")
        later = turns.run([7], lambda: "node 3", together=reports)
        waiting = asyncio.gather(*gang, poll, later)
        await asyncio.sleep(0.1)
        go_on.set()
        return await ahead, await waiting

    ahead, answers = asyncio.run(main())
    assert answers == ["node 0: ok", "node 1: ok", "node 2: ok", "a poll, alone", "node 3: ok"]
    assert given == [["node 0", "node 1", "node 2"], ["node 3"]]  # those in a row, at once
    assert len(database_calls) == 2


def test_a_caller_that_goes_away_takes_no_other_call_of_its_turn_with_it(database_calls):
    turns = threads.KeyedTurns(threads.KeyedLocks())
    first, inside, go_on = held_turn()
    ran: list[str] = []

    def leaving() -> str:
        ran.append("leaving")
        return "nobody hears this"

    async def main():
        ahead = asyncio.create_task(turns.run([7], first))
        await asyncio.to_thread(inside.wait, WAIT)
        gone = asyncio.create_task(turns.run([7], leaving))  # it begins the next turn
        await asyncio.sleep(0)
        staying = asyncio.create_task(turns.run([7], lambda: "answered"))
        await asyncio.sleep(0)
        gone.cancel()  # its client went away while the turn was awaited
        go_on.set()
        return await ahead, await staying, await asyncio.gather(gone, return_exceptions=True)

    ahead, staying, (gone,) = asyncio.run(main())
    assert (ahead, staying) == ("first", "answered")
    assert isinstance(gone, asyncio.CancelledError)
    assert ran == ["leaving"]  # its report was applied all the same: nothing accepted is lost


def test_under_wsgi_each_call_simply_runs(monkeypatch):
    monkeypatch.setattr(threads, "_executor", None)
    turns = threads.KeyedTurns(threads.KeyedLocks())

    async def main():
        return await asyncio.gather(turns.run([1], lambda: 1), turns.run([1], lambda: 2))

    assert asyncio.run(main()) == [1, 2]
    assert turns.waiting == {}


def test_a_call_whose_caller_gave_up_before_a_database_thread_was_free_is_left_undone(
    monkeypatch, caplog
):
    """Its agent gave up waiting and sends the request again: under overload, doing it anyway
    would only add to the wait of every request after it. A caller still waiting is answered,
    in the same turn or alone."""
    turns = threads.KeyedTurns(threads.KeyedLocks())
    busy, inside, go_on = held_turn()
    ran: list[str] = []

    def work(name: str):
        return lambda: ran.append(name) or name

    monkeypatch.setattr(threads, "_given_up", threads._GivenUp())  # nothing logged yet
    with ThreadPoolExecutor(max_workers=1) as executor:
        monkeypatch.setattr(threads, "_executor", executor)

        async def call(keys, name, seconds):
            with threads.caller_waits(seconds):
                return await turns.run(keys, work(name))

        async def main():
            other = asyncio.create_task(turns.run([8], busy))
            await asyncio.to_thread(inside.wait, WAIT)
            calls = [
                asyncio.create_task(call([7], "gave up", 0.05)),  # it begins attempt 7's turn
                asyncio.create_task(call([7], "waits", WAIT)),
                asyncio.create_task(call([], "alone, gave up", 0.05)),
                asyncio.create_task(call([], "alone, waits", WAIT)),
            ]
            await asyncio.sleep(0.2)
            go_on.set()
            return await other, await asyncio.gather(*calls, return_exceptions=True)

        other, answers = asyncio.run(main())
    assert other == "first"
    assert isinstance(answers[0], threads.GaveUp) and isinstance(answers[2], threads.GaveUp)
    assert (answers[1], answers[3]) == ("waits", "alone, waits")
    assert sorted(ran) == ["alone, waits", "waits"]
    assert any("left undone" in r.getMessage() for r in caplog.records)  # for the operator
    assert turns.waiting == {} and turns.turns == set()

"""Agent requests about the same attempt wait for each other on the event loop, not on a
database lock (portal.db.threads.KeyedLocks): the nodes of a gang report together, and each
waiting on the job's row lock would hold one of the few database threads."""

from __future__ import annotations

import asyncio

from portal.db import threads


def test_requests_about_one_attempt_run_one_at_a_time_and_others_go_on(monkeypatch):
    monkeypatch.setattr(threads, "_executor", object())  # as under the production server
    locks = threads.KeyedLocks()
    inside: list[int] = []
    most = {"same": 0, "any": 0}

    async def request(keys: list[int]) -> None:
        async with locks.held(keys):
            inside.append(keys[0])
            most["any"] = max(most["any"], len(inside))
            most["same"] = max(most["same"], max(inside.count(k) for k in inside))
            await asyncio.sleep(0.01)
            inside.remove(keys[0])

    async def main() -> None:
        await asyncio.gather(*(request([7]) for i in range(5)),
                             request([8]), request([9, 7]))  # fmt: skip

    asyncio.run(main())
    assert most["same"] == 1  # never two requests about attempt 7 at once
    assert most["any"] >= 2  # attempt 8's went on meanwhile
    assert locks.locks == {} and locks.users == {}  # nothing kept for attempts done with


def test_under_wsgi_nothing_waits(monkeypatch):
    monkeypatch.setattr(threads, "_executor", None)
    locks = threads.KeyedLocks()

    async def main() -> int:
        async with locks.held([1]), locks.held([1]):  # would wait forever if it locked
            return len(locks.locks)

    assert asyncio.run(main()) == 0

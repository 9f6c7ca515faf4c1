"""Long polls wait on the web process's one Redis subscription (scheduler.cycle.wake): a node's
notification wakes every poll of that node, and no other node's, on the polls' event loop."""

from __future__ import annotations

import asyncio
import threading

from scheduler.cycle.wake import OrderWaiter, notify_nodes

# Node ids no live system in the same Redis database uses.
NODE, OTHER = 10**9 + 7, 10**9 + 8


def test_a_notification_wakes_the_polls_of_its_node_only():
    async def polls() -> tuple[bool, bool, bool]:
        first = OrderWaiter()  # the first waiter of a process waits for the subscription
        first.watch(NODE)
        first.close()
        mine, also_mine, other = OrderWaiter(), OrderWaiter(), OrderWaiter()
        for waiter, node in ((mine, NODE), (also_mine, NODE), (other, OTHER)):
            waiter.watch(node)
        try:
            threading.Thread(target=notify_nodes, args=([NODE],)).start()
            woken = await asyncio.gather(mine.wait(30), also_mine.wait(30))
            return (*woken, await other.wait(0.5))
        finally:
            for waiter in (mine, also_mine, other):
                waiter.close()

    assert asyncio.run(polls()) == (True, True, False)


def test_a_poll_is_given_the_orders_its_notifications_carry():
    """Orders in a node's notification reach its waiting polls as they are; a
    notification that carries nothing (or the process's subscription coming up) tells them to
    read their orders again, whatever else came."""
    stop = {"attempt": 5, "grace_seconds": 30, "started": True}
    later = {"attempt": 6, "job": 3, "gpu_indices": [0, 1], "env": {"A": "1"}}

    async def heard(waiter: OrderWaiter, enough) -> None:
        """Wait until what `waiter` was told is `enough` (notifications come one by one)."""
        while not enough(waiter.carried):
            waiter.event.clear()
            assert await waiter.wait(30), waiter.carried

    async def polls() -> tuple[dict | None, dict | None]:
        first = OrderWaiter()
        first.watch(NODE)
        first.close()
        carried, mixed = OrderWaiter(), OrderWaiter()
        carried.watch(NODE)
        mixed.watch(OTHER)
        try:
            notify_nodes((), orders={NODE: {"run": [], "stop": [stop]},
                                     OTHER: {"run": [], "stop": [stop]}})  # fmt: skip
            notify_nodes([OTHER], orders={NODE: {"run": [later], "stop": []}})
            await heard(carried, lambda news: news is not None and len(news["run"]) == 1)
            await heard(mixed, lambda news: news is None)
            return carried.carried, mixed.carried
        finally:
            carried.close()
            mixed.close()

    assert asyncio.run(polls()) == ({"run": [later], "stop": [stop]}, None)

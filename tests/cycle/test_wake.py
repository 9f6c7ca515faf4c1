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

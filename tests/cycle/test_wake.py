"""Long polls wait on the web process's one Redis subscription (scheduler.cycle.wake): a node's
notification wakes every poll of that node, and no other node's."""

from __future__ import annotations

import threading

from scheduler.cycle.wake import OrderWaiter, notify_nodes

# Node ids no live system in the same Redis database uses.
NODE, OTHER = 10**9 + 7, 10**9 + 8


def test_a_notification_wakes_the_polls_of_its_node_only():
    first = OrderWaiter(NODE)  # the first waiter of a process waits for the subscription
    first.close()
    mine, also_mine, other = OrderWaiter(NODE), OrderWaiter(NODE), OrderWaiter(OTHER)
    try:
        threading.Thread(target=notify_nodes, args=([NODE],)).start()
        assert mine.wait(30) and also_mine.wait(30)
        assert not other.event.is_set()
    finally:
        for waiter in (mine, also_mine, other):
            waiter.close()

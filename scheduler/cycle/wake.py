"""Wake node agents' long polls when their orders change (Redis pub/sub, one channel a node).
A notification says "read your orders again", or, when a node's only change is new orders
(attempts placed there, or told to stop), carries them: a woken poll then answers without a
database step, which is what an order's delivery time is made of under load."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

import redis

from portal.redis import redis_client
from scheduler.cycle.orders import NewOrders

logger = logging.getLogger(__name__)

# Channels are global to a Redis server: they carry the portal's database index, so portals
# sharing a server (on different indexes) do not wake each other's agents.
CHANNEL = "portal:{db}:agent:node:{node_id}"
# The message of a notification that carries nothing: the polls read their orders again.
READ_AGAIN = b"1"


def _channel(node_id: int | str) -> str:
    db = redis_client().connection_pool.connection_kwargs.get("db", 0)
    return CHANNEL.format(db=db, node_id=node_id)


def notify_nodes(node_ids: Iterable[int], *, orders: Mapping[int, NewOrders] | None = None) -> None:
    """Tell the agents of these nodes that their orders changed, and those of the nodes in
    `orders` that they have these new orders (`scheduler.cycle.orders`), which is all that
    changed for them unless they are in `node_ids` too. Best effort: an agent that misses it
    sees the change at its next poll."""
    ids = set(node_ids)
    orders = orders or {}
    if not ids and not orders:
        return
    try:
        pipe = redis_client().pipeline(transaction=False)
        for node_id in sorted(ids | set(orders)):
            message = READ_AGAIN if node_id in ids else json.dumps(orders[node_id]).encode()
            pipe.publish(_channel(node_id), message)
        pipe.execute()
    except redis.RedisError:
        logger.warning("could not notify nodes %s", sorted(ids | set(orders)), exc_info=True)


def _carried(message: bytes) -> NewOrders | None:
    """The orders a notification carries, or None when its polls must read their orders
    again."""
    if message == READ_AGAIN:
        return None
    try:
        orders = json.loads(message)
        carried = {"run": list(orders["run"]), "stop": list(orders["stop"])}
    except (ValueError, TypeError, KeyError):
        logger.warning("unreadable order notification %r: reading the orders again", message)
        return None
    return carried


class _Listener:
    """One Redis subscription per process (a pattern over every node's channel), in a thread of
    its own, shared by all the long polls waiting in the process: a poll registers a waker for
    its node, without a Redis connection or a thread of its own. A waker is given the orders the
    notification carries, or None (read the orders again)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting: dict[int, set[Callable[[NewOrders | None], None]]] = defaultdict(set)
        # Set at the first outcome of the first subscription (subscribed, or Redis down).
        self.settled = threading.Event()
        self.thread: threading.Thread | None = None

    def add(self, node_id: int, wake: Callable[[NewOrders | None], None]) -> None:
        with self.lock:
            self.waiting[node_id].add(wake)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="order-listener", daemon=True)
                self.thread.start()

    def remove(self, node_id: int, wake: Callable[[NewOrders | None], None]) -> None:
        with self.lock:
            wakers = self.waiting.get(node_id)
            if wakers is not None:
                wakers.discard(wake)
                if not wakers:
                    del self.waiting[node_id]

    def _wake(self, node_id: int | None, carried: NewOrders | None = None) -> None:
        """Wake the polls of one node, or of every node (None), with the orders the
        notification carried (None: read the orders again)."""
        with self.lock:
            if node_id is None:
                wakers = [w for node_wakers in self.waiting.values() for w in node_wakers]
            else:
                wakers = list(self.waiting.get(node_id, ()))
        for wake in wakers:
            wake(carried)

    def _run(self) -> None:
        delay = 0.5
        while True:
            pubsub = None
            try:
                pubsub = redis_client().pubsub()
                pubsub.psubscribe(_channel("*"))
                while True:
                    message = pubsub.get_message(timeout=1.0)
                    if message is None:
                        continue
                    if message["type"] == "psubscribe":
                        # Polls that started before the subscription was in place read their
                        # orders again: a change in between may have gone unheard.
                        self.settled.set()
                        self._wake(None)
                        delay = 0.5
                    elif message["type"] == "pmessage":
                        node_id = message["channel"].rsplit(b":", 1)[-1]
                        if node_id.isdigit():
                            self._wake(int(node_id), _carried(message["data"]))
            except redis.RedisError:
                self.settled.set()
                logger.warning("lost the Redis subscription for agent polls; retrying in %.1f s",
                               delay, exc_info=True)  # fmt: skip
            finally:
                if pubsub is not None:
                    with contextlib.suppress(redis.RedisError):
                        pubsub.close()
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


_listener = _Listener()


class OrderWaiter:
    """A long poll's wait for its node's orders to change, on the event loop of the poll: while
    it waits it holds no thread and no database connection, only this object. Made on the
    loop; `watch` (from any thread) registers it before the orders are read, so that a change
    committed in between is not missed. Without Redis (or before the process's subscription is
    in place, at most a moment) the wait is a plain sleep of the whole time. Once woken,
    `carried` says what the notifications said."""

    SUBSCRIBE_WAIT_SECONDS = 3.0  # longest a process's first poll waits for the subscription

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()
        self.node_ids: list[int] = []
        # The orders the notifications that came carried; None once one of them (or the
        # process's subscription coming up) said to read the orders again.
        self.carried: NewOrders | None = {"run": [], "stop": []}

    def watch(self, node_ids: int | Iterable[int]) -> None:
        """Start listening for the changes of a node (an agent's poll), or of several (a
        connector's). May block (up to SUBSCRIBE_WAIT_SECONDS, at a process's first poll): call
        it off the event loop, in the poll's database step."""
        self.node_ids = [node_ids] if isinstance(node_ids, int) else list(node_ids)
        for node_id in self.node_ids:
            _listener.add(node_id, self._wake)
        _listener.settled.wait(self.SUBSCRIBE_WAIT_SECONDS)

    def _wake(self, carried: NewOrders | None) -> None:
        # From the listener's thread; the loop may be gone (the poll answered and ended).
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._woken, carried)

    def _woken(self, carried: NewOrders | None) -> None:
        if carried is None or self.carried is None:
            self.carried = None
        else:
            self.carried["run"] += carried["run"]
            self.carried["stop"] += carried["stop"]
        self.event.set()

    async def wait(self, seconds: float) -> bool:
        """Wait up to `seconds` for a notification; True if one came."""
        try:
            await asyncio.wait_for(self.event.wait(), seconds)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        for node_id in self.node_ids:
            _listener.remove(node_id, self._wake)

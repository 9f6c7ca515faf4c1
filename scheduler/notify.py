"""Wake node agents' long polls when their orders change (Redis pub/sub, one channel a node)."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterable

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

CHANNEL = "portal:agent:node:{node_id}"


@functools.cache
def redis_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2)


def notify_nodes(node_ids: Iterable[int]) -> None:
    """Tell the agents of these nodes that their orders changed. Best effort: an agent that
    misses it sees the change at its next poll."""
    ids = sorted(set(node_ids))
    if not ids:
        return
    try:
        pipe = redis_client().pipeline(transaction=False)
        for node_id in ids:
            pipe.publish(CHANNEL.format(node_id=node_id), b"1")
        pipe.execute()
    except redis.RedisError:
        logger.warning("could not notify nodes %s", ids, exc_info=True)


class OrderWaiter:
    """Subscribe before reading the orders, then wait: a change committed in between is not
    missed."""

    def __init__(self, node_id: int) -> None:
        self.pubsub = None
        try:
            self.pubsub = redis_client().pubsub(ignore_subscribe_messages=True)
            self.pubsub.subscribe(CHANNEL.format(node_id=node_id))
        except redis.RedisError:
            logger.warning("long poll without Redis: plain wait", exc_info=True)
            self.pubsub = None

    def wait(self, seconds: float) -> bool:
        """Wait up to `seconds` for a notification; True if one came."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.pubsub is None:
                time.sleep(min(left, 1.0))
                continue
            try:
                message = self.pubsub.get_message(timeout=min(left, 1.0))
            except redis.RedisError:
                self.pubsub = None
                continue
            if message is not None:
                return True
        return False

    def close(self) -> None:
        if self.pubsub is not None:
            with contextlib.suppress(redis.RedisError):
                self.pubsub.close()

"""The portal's Redis client (the broker is Celery's own): the cycle's coalescing keys and idle
fingerprint, and the agents' wake-ups."""

from __future__ import annotations

import functools

import redis
from django.conf import settings


@functools.cache
def redis_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2)

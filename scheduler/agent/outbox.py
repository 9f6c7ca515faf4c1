"""What a node agent or a connector has to tell the portal and has not had acknowledged yet.

Events wait here in order. Each request (a poll, a report) carries the events no other request
carries at that moment, and they leave only once the portal has taken them: when it cannot be
reached they stay, and go with a later request, in order. The portal ignores a replay, so an
event that went twice (an answer lost on the way back) does no harm."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from scheduler.agent.protocol import EVENT_EXITED
from scheduler.agent.transport import PortalClient, PortalUnreachable

logger = logging.getLogger("scheduler.agent")

MAX_BACKOFF_SECONDS = 10.0


class Backoff:
    def __init__(self) -> None:
        self.delay = 0.0
        self.next_try = 0.0

    def ready(self) -> bool:
        return time.monotonic() >= self.next_try

    def failed(self) -> None:
        self.delay = min(MAX_BACKOFF_SECONDS, max(0.25, self.delay * 2))
        self.next_try = time.monotonic() + self.delay

    def succeeded(self) -> None:
        self.delay = 0.0
        self.next_try = 0.0


class Outbox:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[dict] = []
        self.in_flight: set[int] = set()  # id() of the events a request carries now
        self.filled = threading.Event()  # set with each new event, for the reporter
        self.backoff = Backoff()  # of the reports

    def __iter__(self) -> Iterator[dict]:
        with self.lock:
            return iter(list(self.events))

    def __len__(self) -> int:
        with self.lock:
            return len(self.events)

    def add(self, event: dict) -> None:
        with self.lock:
            self.events.append(event)
        self.filled.set()

    def pending_exits(self) -> set[int]:
        """The attempts whose exit the portal has not acknowledged yet."""
        with self.lock:
            return {e["attempt"] for e in self.events if e["type"] == EVENT_EXITED}

    def take(self, *, everything: bool = False) -> list[dict]:
        """The events no other request carries now (`everything`: all of them), marked as
        carried."""
        with self.lock:
            events = [e for e in self.events if everything or id(e) not in self.in_flight]
            self.in_flight.update(id(e) for e in events)
            return events

    def sent(self, events: list[dict], *, delivered: bool) -> None:
        """The request carrying `events` ended: drop them if the portal took them."""
        ids = {id(e) for e in events}
        with self.lock:
            self.in_flight -= ids
            if delivered:
                self.events = [e for e in self.events if id(e) not in ids]

    def report(
        self,
        http: PortalClient,
        path: str,
        headers: Callable[[], dict],
        *,
        everything: bool = False,
        extra: dict | None = None,
    ) -> bool:
        """POST the events no poll carries (`everything`: all) to `path`, with `extra` in the
        body; on failure keep them and back off. Returns whether the portal took them."""
        if not self.backoff.ready():
            return False
        events = self.take(everything=everything)
        if not events and not extra:
            return True
        delivered = False
        try:
            response = http.post(path, json={"events": events, **(extra or {})},
                                 headers=headers(), timeout=10)  # fmt: skip
        except PortalUnreachable as error:
            logger.warning("report failed (%s); %d event(s) kept", error, len(events))
            self.backoff.failed()
            return False
        else:
            if response.status_code == 401:
                self.backoff.failed()  # the poller registers again
            elif response.status_code != 200:
                logger.error("report refused (%s): %s", response.status_code, response.text[:500])
                self.backoff.failed()
            else:
                self.backoff.succeeded()
                delivered = True
        finally:
            self.sent(events, delivered=delivered)
        return delivered

"""What a node agent or a connector has to tell the portal and has not had acknowledged yet.

Events wait here in order. Each request (a poll, a report) carries the events no other request
carries at that moment, and they leave only once the portal has taken them: when it cannot be
reached they stay, and go with a later request, in order. The portal ignores a replay, so an
event that went twice (an answer lost on the way back) does no harm."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from scheduler.agent.protocol import ANSWER_SECONDS, EVENT_EXITED
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


class EndedAttempts:
    """The attempts that ended here, which are never started again: the portal may still order
    one to run in an answer it computed before it took the end. Each is forgotten once an
    answer computed after the portal acknowledged its end has been applied and ordered nothing
    for it, so a long-lived agent or connector keeps the recent ones, not every attempt it ran.

    Polls are numbered as they are sent. An end that a poll carried is known to that poll's
    answer (the portal applies a poll's events before it answers); one that a report carried,
    to the answer of the first poll sent after the report was acknowledged."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.polls = 0  # polls sent so far
        # attempt → the first poll whose answer knows it ended (None: not acknowledged yet)
        self.known_from: dict[int, int | None] = {}

    def __contains__(self, attempt: int) -> bool:
        return attempt in self.known_from

    def __iter__(self) -> Iterator[int]:
        with self.lock:
            return iter(list(self.known_from))

    def __len__(self) -> int:
        return len(self.known_from)

    def add(self, attempt: int) -> None:
        with self.lock:
            self.known_from.setdefault(attempt, None)

    def poll_sent(self) -> int:
        """Number the poll about to be sent."""
        with self.lock:
            self.polls += 1
            return self.polls

    def acknowledged(self, attempts: Iterable[int], *, poll: int | None) -> None:
        """The portal took the ends of `attempts`, with poll number `poll` (None: a report)."""
        with self.lock:
            known = poll if poll is not None else self.polls + 1
            for attempt in attempts:
                if attempt in self.known_from and self.known_from[attempt] is None:
                    self.known_from[attempt] = known

    def forget(self, *, answered: int, keep: set[int]) -> None:
        """Applied the answer to poll `answered`: forget the attempts it knew ended, but those
        in `keep` (ordered in it, or still listed by a cluster manager)."""
        with self.lock:
            done = [
                attempt
                for attempt, known in self.known_from.items()
                if known is not None and known <= answered and attempt not in keep
            ]
            for attempt in done:
                del self.known_from[attempt]


class Outbox:
    def __init__(self, ended: EndedAttempts | None = None) -> None:
        self.ended = ended  # told which ends the portal took
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

    def sent(self, events: list[dict], *, delivered: bool, poll: int | None = None) -> None:
        """The request carrying `events` ended (poll number `poll`, None for a report): drop
        them if the portal took them."""
        ids = {id(e) for e in events}
        with self.lock:
            self.in_flight -= ids
            if delivered:
                self.events = [e for e in self.events if id(e) not in ids]
        if delivered and self.ended is not None:
            exits = [e["attempt"] for e in events if e["type"] == EVENT_EXITED]
            self.ended.acknowledged(exits, poll=poll)

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
                                 headers=headers(), timeout=ANSWER_SECONDS)  # fmt: skip
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

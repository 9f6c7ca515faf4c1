"""What a node agent or a connector has to tell the portal and has not had acknowledged yet.

Events wait here in order. Each request (a poll, a report) carries the oldest events no other
request carries at that moment, at most a batch of them (MAX_BATCH_EVENTS, MAX_BATCH_BYTES), and
they leave only once the portal has taken them: when it cannot be reached they stay, and go with
a later request, in order. Those a batch leaves behind go with the next requests at once, so a
long outage's events all get through, batch by batch. The portal ignores a replay, so an event that
went twice (an answer lost on the way back) does no harm.

An event the portal refuses (its 400 names it: `events[3].detail: ...`) can never go: it leaves
the outbox with an ERROR in the log, and the events beside it, which the portal applied, go
again (`Outbox.refused`), so one bad event does not hold back those queued after it."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from scheduler.agent.protocol import ANSWER_SECONDS, EVENT_EXITED
from scheduler.agent.transport import PortalClient, PortalUnreachable, Response

logger = logging.getLogger("scheduler.agent")

MAX_BACKOFF_SECONDS = 10.0

# The most one request carries: the portal refuses more than 1000 events in a request
# (scheduler.nodes.views.MAX_EVENTS) and a body over 1 MiB (its DATA_UPLOAD_MAX_MEMORY_SIZE by
# default, as nginx's client_max_body_size), and a poll's body has its attempt lists (and a
# connector's, its nodes) beside the events. One event goes alone whatever its size. A portal
# that finds a batch too big all the same (a lower limit) gets smaller ones from then on.
MAX_BATCH_EVENTS = 500
MAX_BATCH_BYTES = 512 * 1024

# The keys of the portal's 400 that name an event of the request (`events[3].end`).
_EVENT_FIELD = re.compile(r"events\[(\d+)\]")


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
        # The most one request carries (`take`), halved when the portal finds a batch too big.
        self.most_events = MAX_BATCH_EVENTS
        self.most_bytes = MAX_BATCH_BYTES
        # The attempts whose exit the portal refused (`refused`): never acknowledged.
        self.refused_exits: set[int] = set()

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
        """The attempts whose exit the portal has not acknowledged yet, and those whose exit it
        refused: polls list them as stopping here, so the portal neither orders them to run
        again nor answers every poll at once with their run orders."""
        with self.lock:
            pending = {e["attempt"] for e in self.events if e["type"] == EVENT_EXITED}
            return pending | self.refused_exits

    def take(self, *, everything: bool = False) -> list[dict]:
        """The oldest events no other request carries now (`everything`: the oldest of all),
        in order, as many as one request carries (`most_events`, `most_bytes` of JSON; one
        event at least), marked as carried."""
        events: list[dict] = []
        size = 0
        with self.lock:
            for event in self.events:
                if not everything and id(event) in self.in_flight:
                    continue
                size += len(json.dumps(event)) + 2  # as the transport encodes it, and ", "
                if events and (len(events) >= self.most_events or size > self.most_bytes):
                    break
                events.append(event)
            self.in_flight.update(id(e) for e in events)
        return events

    def sent(self, events: list[dict], *, delivered: bool, poll: int | None = None) -> None:
        """The request carrying `events` ended (poll number `poll`, None for a report): drop
        them if the portal took them, and wake the reporter for those no request carries."""
        ids = {id(e) for e in events}
        with self.lock:
            self.in_flight -= ids
            if delivered:
                self.events = [e for e in self.events if id(e) not in ids]
            more = delivered and any(id(e) not in self.in_flight for e in self.events)
        if delivered and self.ended is not None:
            exits = [e["attempt"] for e in events if e["type"] == EVENT_EXITED]
            self.ended.acknowledged(exits, poll=poll)
        if more:
            self.filled.set()

    def refused(self, events: list[dict], response: Response, *, what: str) -> bool:
        """Whether `response` is the portal's refusal of the request (`what`: "report",
        "poll") that carried `events`, which another request settles; they are then no longer
        carried, and the reporter is woken to send what is left at once.

        - It names events (`events[3].end: ...`): the portal read the request and applied the
          others (docs/agent.md). Those it names can never go: each leaves the outbox with an
          ERROR (a refused exit's attempt stays among `pending_exits`, never acknowledged); the
          others stay, in order, and go again (replays, which the portal ignores), so that
          another bad one among them is named in turn.
        - It found the request too big (413; a 400 naming only `body` or `events`, too long;
          a 400 that is no JSON object, as Django's development server answers): it applied
          nothing. All stay, and batches are halved from now on (a lone event too big for it:
          False, after an ERROR).
        Any other answer (a success, a 401, a 5xx, another 400): False, the caller's to handle.
        """
        status = response.status_code
        if not events or status == 401 or not 400 <= status < 500:
            return False
        try:
            answer = json.loads(response.content)
        except ValueError:
            answer = None
        if status != 413 and isinstance(answer, dict) and not set(answer) <= {"events", "body"}:
            named = {
                int(match[1]): f"{field}: {message}" if field not in str(message) else message
                for field, message in answer.items()
                if (match := _EVENT_FIELD.match(field)) and int(match[1]) < len(events)
            }
            if not named:
                return False
            self._drop(events, named, what=what, status=status)
            return True
        if status not in (400, 413):
            return False  # a page of something in front of the portal: it read nothing
        if len(events) == 1:
            logger.error("%s refused as too big (%s) though it carried one event, %s: it stays "
                         "in the outbox until the portal takes bigger requests", what, status,
                         _named(events[0]))  # fmt: skip
            return False
        with self.lock:
            self.most_events = min(self.most_events, len(events) // 2)
            self.most_bytes = min(self.most_bytes, sum(len(json.dumps(e)) for e in events) // 2)
        logger.warning("%s of %d event(s) refused as too big (%s); sending at most %d event(s), "
                       "%d bytes, at a time", what, len(events), status, self.most_events,
                       self.most_bytes)  # fmt: skip
        self.sent(events, delivered=False)
        self.filled.set()
        return True

    def _drop(self, events: list[dict], named: dict[int, str], *, what: str, status: int) -> None:
        """The portal refused `events[i]` for each i of `named` (why): they leave the outbox."""
        refused = [events[i] for i in sorted(named)]
        for i in sorted(named):
            logger.error("%s refused (%s) %s, which is not sent again: %s", what, status,
                         _named(events[i]), named[i])  # fmt: skip
        ids = {id(e) for e in refused}
        with self.lock:
            self.events = [e for e in self.events if id(e) not in ids]
            self.refused_exits.update(e["attempt"] for e in refused if e["type"] == EVENT_EXITED)
        self.sent(events, delivered=False)
        self.filled.set()

    def report(
        self,
        http: PortalClient,
        path: str,
        headers: Callable[[], dict],
        *,
        everything: bool = False,
        extra: dict | None = None,
    ) -> bool:
        """POST the oldest events no poll carries (`everything`: the oldest), a batch of them
        (`take`), to `path`, with `extra` in the body. Returns whether the portal took them;
        the reporter is woken for those left. On failure they stay and the reports back off;
        a refusal that names events or finds the batch too big is settled as `refused` says;
        another 400 (a connector's `nodes`) means the portal applied the events: they leave."""
        if not self.backoff.ready():
            return False
        events = self.take(everything=everything)
        if not events and not extra:
            return True
        delivered = taken = False
        try:
            response = http.post(path, json={"events": events, **(extra or {})},
                                 headers=headers(), timeout=ANSWER_SECONDS)  # fmt: skip
        except PortalUnreachable as error:
            logger.warning("report failed (%s); %d event(s) kept", error, len(events))
            self.backoff.failed()
            self.sent(events, delivered=False)
            return False
        if response.status_code == 200:
            self.backoff.succeeded()
            delivered = taken = True
        elif self.refused(events, response, what="report"):
            self.backoff.succeeded()  # what is left goes at once
            return False
        elif response.status_code == 401:
            self.backoff.failed()  # the poller registers again
        else:
            logger.error("report refused (%s): %s", response.status_code, response.text[:500])
            self.backoff.failed()
            taken = _read(response)
        self.sent(events, delivered=taken)
        return delivered


def _read(response: Response) -> bool:
    """Whether the portal read the request it refused: its 400 is its own (a JSON object),
    naming a field other than the request's events or body."""
    if response.status_code != 400:
        return False
    try:
        answer = json.loads(response.content)
    except ValueError:
        return False
    return isinstance(answer, dict) and not {"events", "body"} & set(answer)


def _named(event: dict) -> str:
    """An event as a log names it: `exited event of attempt 17`."""
    return f"{event.get('type')} event of attempt {event.get('attempt')}"

"""HTTP endpoints of the node agent (`/api/v1/agent/`): register, poll for orders, report.

Agents authenticate with `Authorization: Node <token>`, the token they got when they
registered (stored hashed). User API tokens are not accepted here, and node tokens are not
accepted anywhere else. Bad input gets a 400 naming the field."""

from __future__ import annotations

import functools
import json
import math
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, ValidationError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from portal.db.threads import (
    KeyedLocks,
    KeyedTurns,
    caller_waits,
    in_database_thread,
    release_database_connection,
)
from scheduler.agent.protocol import (
    ANSWER_SECONDS,
    CONNECTOR_ANSWER_SECONDS,
    END_REASONS,
    EVENT_CHECKPOINT,
    EVENT_EXITED,
    EVENT_STARTED,
    EVENT_TYPES,
    NODE_STATES,
    POLL_ANSWER_SECONDS,
)
from scheduler.cycle.wake import OrderWaiter
from scheduler.models import MAX_GPUS_PER_NODE, Connector, Node
from scheduler.nodes import connectors
from scheduler.nodes.attempts import (
    attempts_start,
    node_report,
    nodes_report,
    stops_ordered_first,
)
from scheduler.nodes.connectors import ClusterNode, connector_for_token
from scheduler.nodes.services import (
    NodeConflict,
    node_for_token,
    node_heartbeat,
    node_poll_orders,
    node_poll_start,
    node_register,
    orders_with_news,
    poll_wait_seconds,
    starts_grantable,
    starts_granted,
)
from shares.models import validate_gpu_type

AUTH_SCHEME = "Node"
NOT_AUTHENTICATED = (
    "Authorization: send 'Node <token>' with the token this node got when it registered."
)
BODY_NOT_JSON = "body: must be a JSON object."
BODY_TOO_LARGE = (
    "body: at most {limit} bytes (DATA_UPLOAD_MAX_MEMORY_SIZE); send the events in smaller batches."
)
MAX_EVENTS = 1000
MAX_ID = 2**62  # below the database's largest integer (SQLite's and PostgreSQL's bigint)


# A gang's nodes report about the same attempt together: one at a time per web process, and
# those that come while one waits go together in the next turn.
attempt_locks = KeyedLocks()
attempt_turns = KeyedTurns(attempt_locks)


class DecidedStarts:
    """Attempts whose start a request of this process has decided (granted, or refused as its
    stop was ordered first). The other nodes of a gang that ask to start the same attempt need
    not wait for one another then: `attempts_start` grants an attempt that already started by
    its UPDATE's own condition, without the job's lock, so they go at once, side by side.
    Before, the 64 nodes of a gang took turns, one database call each, for seconds under load,
    and could hear no stop order meanwhile. A refused attempt's stop order is kept too (a stop
    once ordered stays ordered): the other nodes get it without asking the database, where each
    would wait for the job's lock in turn, holding a database connection (64 such starts took
    4.5 s under load). The oldest are forgotten past KEEP (such a start then waits its turn
    again, as before)."""

    KEEP = 10_000

    def __init__(self) -> None:
        self.seen: OrderedDict[int, None] = OrderedDict()
        self.stops: OrderedDict[int, dict] = OrderedDict()  # refused attempt → its stop order

    def undecided(self, attempt_ids: list[int]) -> list[int]:
        return [a for a in attempt_ids if a not in self.seen]

    def decided(self, attempt_ids: list[int]) -> None:
        for attempt_id in attempt_ids:
            self.seen[attempt_id] = None
        while len(self.seen) > self.KEEP:
            self.seen.popitem(last=False)

    def stopped(self, orders: list[dict]) -> None:
        """These attempts' starts were refused: their stops were ordered first."""
        for order in orders:
            self.stops[order["attempt"]] = order
        while len(self.stops) > self.KEEP:
            self.stops.popitem(last=False)

    def stops_of(self, attempt_ids: set[int]) -> dict[int, dict]:
        """The stop orders known here of those of the attempts whose starts were refused."""
        return {a: self.stops[a] for a in attempt_ids if a in self.stops}

    def forget(self) -> None:
        self.seen.clear()
        self.stops.clear()


decided_starts = DecidedStarts()


class BadRequest(Exception):
    def __init__(self, field: str, message: str) -> None:
        self.errors = {field: message}


def _refused(error: ValidationError) -> JsonResponse:
    """A 400 naming the first field the model's rules refused and why, as a BadRequest's: one
    field, one message (a field's several messages joined)."""
    field, messages = next(iter(error.message_dict.items()))
    return JsonResponse({"body" if field == "__all__" else field: " ".join(messages)}, status=400)


def _body(request: HttpRequest) -> dict:
    """The request's JSON object, or BadRequest naming `body` (too large: the agent's outbox
    sends smaller batches on such an answer, docs/agent.md)."""
    try:
        raw = request.body
    except RequestDataTooBig:
        raise BadRequest(
            "body", BODY_TOO_LARGE.format(limit=settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        ) from None
    try:
        data = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):
        # RecursionError: nesting deeper than the parser's stack ("[[[[...").
        raise BadRequest("body", BODY_NOT_JSON) from None
    if not isinstance(data, dict):
        raise BadRequest("body", BODY_NOT_JSON)
    return data


def _int(data: dict, name: str, *, low: int = 0, high: int = MAX_ID, required=True) -> int | None:
    value = data.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(name, f"{name}: must be an integer between {low} and {high}.")
    return value


def _str(data: dict, name: str, *, max_length: int, required=True) -> str:
    value = data.get(name, None if required else "")
    if not isinstance(value, str) or (required and not value) or len(value) > max_length:
        raise BadRequest(name, f"{name}: must be a non-empty string of at most {max_length}.")
    if _UNSTORABLE.search(value):
        # A name or token with such a character is not a real one: refused, not replaced.
        raise BadRequest(name, f"{name}: {UNSTORABLE_TEXT}")
    return value


def _text(data: dict, name: str, *, max_length: int) -> str:
    """Free text from a process (its log tail, why it could not start): optional, and what a
    database cannot store (`_UNSTORABLE`) becomes U+FFFD rather than refusing the report (the
    agent would resend it forever)."""
    value = data.get(name, "")
    if not isinstance(value, str) or len(value) > max_length:
        raise BadRequest(name, f"{name}: must be a string of at most {max_length} characters.")
    return _UNSTORABLE.sub("\ufffd", value)


# Characters no text column takes: NUL (PostgreSQL's text and jsonb refuse it) and the halves
# of UTF-16 surrogate pairs, which JSON may carry alone ("\ud800") but UTF-8 cannot encode
# (SQLite and PostgreSQL refuse them alike: the request failed with a 500).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
UNSTORABLE_TEXT = "must not contain NUL characters or unpaired UTF-16 surrogates."


def _unstorable(value: Any) -> bool:
    """Whether JSON from an agent holds text a database cannot store (`_UNSTORABLE`)."""
    if isinstance(value, str):
        return _UNSTORABLE.search(value) is not None
    if isinstance(value, dict):
        return any(_unstorable(k) or _unstorable(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_unstorable(v) for v in value)
    return False


def _ids(data: dict, name: str, *, most: int | None = None) -> set[int]:
    value = data.get(name, [])
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_ID for v in value
    ):
        raise BadRequest(
            name, f"{name}: must be a list of attempt ids (integers between 1 and {MAX_ID})."
        )
    if most is not None and len(value) > most:
        raise BadRequest(name, f"{name}: at most {most} attempt ids.")
    return set(value)


def _authenticated_node(request: HttpRequest) -> Node | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme != AUTH_SCHEME:
        return None
    return node_for_token(token.strip())


@dataclass(frozen=True)
class Principal:
    """Who may call an endpoint: a node's agent or a connector, found from the request's
    Authorization header, and the 401 a request without it gets."""

    authenticate: Callable[[HttpRequest], Any]
    not_authenticated: Callable[[], JsonResponse]


def agent_view(
    authenticated: bool = True,
    about=lambda data: (),
    principal: Principal | None = None,
    once: DecidedStarts | None = None,
    together: bool = False,
    answer_seconds: float | None = None,
):
    """POST-only JSON view, async: the body is parsed on the event loop, then `view` runs with
    the database (`in_database_thread`), one at a time with other requests `about` the same
    attempts (their ids in the body; those that come while one waits share the next turn,
    `KeyedTurns`), but for attempts `once` has seen decided; `together`: `view([AgentCall])`
    answers such requests at once (`KeyedTurns`' protocol);
    `authenticated`: the node (or the connector, for `principal` CONNECTOR) is passed in, or
    401. Its database work is left undone if it has not begun when the agent gives up waiting
    for the answer (`answer_seconds`, by default the protocol's ANSWER_SECONDS; `caller_waits`):
    the agent sends the request again."""
    principal = principal or NODE

    def decorate(view):
        @csrf_exempt
        @require_POST
        @functools.wraps(view)
        async def wrapper(request: HttpRequest) -> JsonResponse:
            with caller_waits(ANSWER_SECONDS if answer_seconds is None else answer_seconds):
                return await answer(request)

        async def answer(request: HttpRequest) -> JsonResponse:
            try:
                data = _body(request)
                if not authenticated:
                    return await in_database_thread(view, request, data)
                keys = list(about(data))
                if once is None:
                    call = AgentCall(principal, view, request, data)
                    return await attempt_turns.run(keys, call, together=view if together else None)
                while True:
                    alone = once.undecided(keys)
                    async with attempt_locks.held(alone):
                        if once.undecided(alone) != alone:
                            continue  # decided while this request waited: no need to wait
                        response = await in_database_thread(
                            _authenticated_call, principal, view, request, data
                        )
                        if response.status_code == 200:
                            once.decided(alone)
                        return response
            except BadRequest as error:
                return JsonResponse(error.errors, status=400)
            except ValidationError as error:
                return _refused(error)

        return wrapper

    return decorate


@dataclass(frozen=True)
class AgentCall:
    """A request's call of its view, with its caller authenticated first."""

    principal: Principal
    view: Callable
    request: HttpRequest
    data: dict

    def __call__(self) -> JsonResponse:
        return _authenticated_call(self.principal, self.view, self.request, self.data)


def _authenticated_call(principal: Principal, view, request: HttpRequest, data: dict):
    caller = principal.authenticate(request)
    if caller is None:
        return principal.not_authenticated()
    return view(request, caller, data)


def _not_authenticated() -> JsonResponse:
    return JsonResponse({"detail": NOT_AUTHENTICATED}, status=401)


NODE = Principal(_authenticated_node, _not_authenticated)


@agent_view(authenticated=False)
def register(request: HttpRequest, data: dict) -> JsonResponse:
    """{join_token, name, gpu_type, gpus, gpu_details?, asks_to_start?} → {node, token, ...}."""
    join_token = _str(data, "join_token", max_length=128)
    name = _str(data, "name", max_length=253)
    gpu_type = _str(data, "gpu_type", max_length=32)
    gpus = _int(data, "gpus", low=1, high=MAX_GPUS_PER_NODE)
    details = data.get("gpu_details", [])
    if not isinstance(details, list) or not all(isinstance(d, dict) for d in details):
        raise BadRequest("gpu_details", "gpu_details: must be a list of objects.")
    if _unstorable(details):
        raise BadRequest("gpu_details", f"gpu_details: {UNSTORABLE_TEXT}")
    asks_to_start = data.get("asks_to_start", False)
    if not isinstance(asks_to_start, bool):
        raise BadRequest("asks_to_start", "asks_to_start: must be true or false.")
    try:
        node, token = node_register(
            join_token=join_token, name=name, gpu_type=gpu_type, gpus=gpus, gpu_details=details,
            asks_to_start=asks_to_start,
        )  # fmt: skip
    except PermissionError as error:
        return JsonResponse({"join_token": str(error)}, status=403)
    except NodeConflict as error:
        return JsonResponse(error.errors, status=409)
    return JsonResponse(
        {
            "node": node.name,
            "token": token,
            "poll_wait_seconds": settings.AGENT_POLL_MAX_WAIT_SECONDS,
            "heartbeat_timeout_seconds": settings.NODE_HEARTBEAT_TIMEOUT_SECONDS,
        },
        status=201,
    )


@csrf_exempt
@require_POST
async def poll(request: HttpRequest) -> JsonResponse:
    """Heartbeat and long poll: {running: [attempt ids], stopping: [attempt ids], wait: s,
    events?: [...], grants?: bool} → {run: [...], stop: [...], results: [...]}. `events` are
    applied first, as by `report` (their results in `results`), so an agent can send what it
    has to say with its next poll instead of a request of its own. Answers at once when the
    orders differ from what the agent reports; otherwise waits up to `wait` seconds for them to
    change, on the event loop: a waiting poll holds no thread and no database connection.
    `grants`: the agent starts the one-node attempts whose run orders say `granted`, without
    asking (`starts_granted`)."""
    return await _long_poll(
        request,
        principal=NODE,
        start=lambda node, **poll: node_poll_start(node=node, **poll),
        again=lambda node, running, grants: node_poll_orders(
            node=node, running=running, grants=grants
        ),
        more=_poll_fields,
        report=lambda node, events: node_report(node=node, events=events),
        with_news=orders_with_news,
        granting=_granted_in_answer,
    )


async def _granted_in_answer(node: Node, orders: dict, grants: bool) -> dict:
    """A woken poll's orders, with their starts granted where the agent asked for grants; in
    the database only where there is a start to grant (a stop order never waits for it)."""
    if not grants or not starts_grantable(orders):
        return orders
    return await in_database_thread(starts_granted, node=node, orders=orders)


def _poll_fields(data: dict) -> dict:
    """What an agent's poll carries beside its orders and events: `grants`."""
    grants = data.get("grants", False)
    if not isinstance(grants, bool):
        raise BadRequest("grants", "grants: must be true or false.")
    return {"grants": grants}


async def _long_poll(
    request: HttpRequest, *, principal: Principal, start, again, more=lambda data: {},
    report, with_news=None, granting=None,
) -> JsonResponse:  # fmt: skip
    """A long poll, of an agent or a connector: `start(caller, running, stopping, events,
    waiter, **more(data))` its database step (a PollStart), `again(caller, running,
    **more(data))` the orders read again when a change woke the waiting poll, unless the
    notifications carried the new orders and `with_news(orders, news, running)` gives the
    orders with them, and `await granting(caller, orders, **more(data))` the orders to answer
    with then. A poll refused for bad input still applies its well-formed events
    (`report(caller, events)`, see `Events`)."""
    try:
        data = _body(request)
        events = _events(data, required=False)
    except BadRequest as error:
        return JsonResponse(error.errors, status=400)
    try:
        running = _ids(data, "running")
        stopping = _ids(data, "stopping")
        wait = data.get("wait")
        if wait is not None and (
            isinstance(wait, bool)
            or not isinstance(wait, int | float)
            or (isinstance(wait, float) and not math.isfinite(wait))  # NaN, Infinity
        ):
            raise BadRequest("wait", "wait: must be a number of seconds.")
        extra = more(data)
    except BadRequest as error:
        events.refused = error
    if events.refused is not None:
        return await _refused_poll(request, principal, report, events)
    events = events.checked
    # The agent waits for the answer at least as long as the poll may wait, and a margin.
    waiter = OrderWaiter()
    try:
        with caller_waits(poll_wait_seconds(wait) + POLL_ANSWER_SECONDS):
            found = await attempt_turns.run(
                (event["attempt"] for event in events),
                functools.partial(
                    _poll_start, request, principal, start, running=running,
                    stopping=stopping, events=events, waiter=waiter, **extra,
                ),
            )  # fmt: skip
            if found is None:
                return principal.not_authenticated()
            caller, begun = found
            orders = begun.orders
            if not begun.news and await waiter.wait(poll_wait_seconds(wait)):
                if with_news is not None and waiter.carried is not None:
                    orders = with_news(orders, waiter.carried, running)
                    if granting is not None:
                        orders = await granting(caller, orders, **extra)
                else:
                    orders = await in_database_thread(again, caller, running, **extra)
    except ValidationError as error:
        return _refused(error)
    finally:
        waiter.close()
    return JsonResponse({**orders, "results": begun.results})


async def _refused_poll(
    request: HttpRequest, principal: Principal, report, events: Events
) -> JsonResponse:
    """The 400 of a poll with bad input, once its well-formed events are applied, as a report
    would apply them (the caller authenticated first: 401 without)."""
    refused = JsonResponse(events.refused.errors, status=400)
    if not events.checked:
        return refused

    def applied(_request: HttpRequest, caller, checked: list[dict]) -> JsonResponse:
        report(caller, checked)
        return refused

    with caller_waits(ANSWER_SECONDS):
        return await attempt_turns.run(
            (event["attempt"] for event in events.checked),
            functools.partial(_authenticated_call, principal, applied, request, events.checked),
        )


def _poll_start(request: HttpRequest, principal: Principal, start, **poll):
    caller = principal.authenticate(request)
    if caller is None:
        return None
    begun = start(caller, **poll)
    if not begun.news:
        release_database_connection()  # the poll waits next: it needs no connection meanwhile
    return caller, begun


def _attempts_named(data: dict) -> list[int]:
    """The attempt ids a start (`attempts`) or a report (`events`) is about, those that are ids
    at all (the view checks the rest)."""
    values = data.get("attempts")
    if values is None:
        events = data.get("events")
        if not isinstance(events, list):
            return []
        values = [event.get("attempt") for event in events if isinstance(event, dict)]
    if not isinstance(values, list):
        return []
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


@agent_view(about=_attempts_named, once=decided_starts)
def start(request: HttpRequest, node: Node, data: dict) -> JsonResponse:
    """{attempts: [attempt ids]} → {start: [attempt ids], stop: [stop orders]}: the agent has
    these attempts' run orders and starts those in `start`; an attempt whose stop was ordered
    first never starts (`attempts_start`), and its stop order comes in `stop`, as a poll would
    give it. At most MAX_GPUS_PER_NODE attempts: each holds a GPU here."""
    attempts = _ids(data, "attempts", most=MAX_GPUS_PER_NODE)
    node_heartbeat(node=node)
    known = decided_starts.stops_of(attempts)  # refused already, for another node of the gang
    asked = attempts - known.keys()
    granted = attempts_start(node=node, attempt_ids=asked)
    stops = stops_ordered_first(node=node, attempt_ids=asked - granted)
    decided_starts.stopped(stops)
    stops += known.values()
    return JsonResponse(
        {"start": sorted(granted), "stop": sorted(stops, key=lambda order: order["attempt"])}
    )


@agent_view(about=_attempts_named, together=True)
def report(calls: list[AgentCall]) -> list[tuple[bool, Any]]:
    """{events: [{type: started|exited|log, attempt, ...}]} → {results: ["ok"|"ignored"]}.
    An exited event has `end` (exit, timeout, never_started, lost), `exit_code`,
    `signalled` (SIGTERM had been sent), `log_tail`, `detail`. Events are applied in order;
    replays are ignored. The reports of nodes about the same attempts that come at the same
    moment (a gang's nodes report its end) are applied together (`nodes_report`), each
    answered as if it had come alone."""
    outcomes: list[tuple[bool, Any]] = [(False, None)] * len(calls)
    reports: list[tuple[int, Node, list[dict]]] = []
    for i, call in enumerate(calls):
        try:
            node = call.principal.authenticate(call.request)
            if node is None:
                outcomes[i] = (False, call.principal.not_authenticated())
                continue
            events = _events(call.data, required=True)
            node_heartbeat(node=node)
        except Exception as error:  # noqa: BLE001 (this request's: answered to it)
            outcomes[i] = (True, error)
            continue
        reports.append((i, node, events))
    try:
        answers = nodes_report([(node, events.checked) for _, node, events in reports])
    except Exception as error:  # noqa: BLE001 (answered to every request of them)
        answers = [error] * len(reports)
    for (i, _, events), results in zip(reports, answers, strict=True):
        if isinstance(results, Exception):
            outcomes[i] = (True, results)
        elif events.refused is not None:
            outcomes[i] = (True, events.refused)
        else:
            outcomes[i] = (False, JsonResponse({"results": results}))
    return outcomes


@dataclass
class Events:
    """A request's events: those well-formed, in order, to apply, and the refusal of the first
    of the others (None: none), answered with a 400 once the well-formed ones are applied, so
    that one bad event does not hold back the exits beside it (the agent sends its events
    again until they are taken; those applied are then replays, ignored)."""

    checked: list[dict]
    refused: BadRequest | None = None


def _events(data: dict, *, required: bool) -> Events:
    events = data.get("events")
    if events is None and not required:
        return Events([])
    if not isinstance(events, list) or len(events) > MAX_EVENTS:
        raise BadRequest("events", f"events: must be a list of at most {MAX_EVENTS} events.")
    found = Events([])
    for i, event in enumerate(events):
        try:
            found.checked.append(_event(event, i))
        except BadRequest as error:
            found.refused = found.refused or error
    return found


def _cluster_job(value: Any) -> dict:
    """A connector's start: what its cluster manager runs the attempt as, {id, allocations:
    [{node, gpu_indices}]}."""
    message = (
        "cluster_job: must be {id: string, allocations: [{node: string, gpu_indices: "
        f"[integers below {MAX_GPUS_PER_NODE}]}}]}}."
    )
    if not isinstance(value, dict) or not isinstance(value.get("id"), str | int):
        raise BadRequest("cluster_job", message)
    allocations = value.get("allocations", [])
    if not isinstance(allocations, list) or len(allocations) > 1000:
        raise BadRequest("cluster_job", message)
    checked = []
    for allocation in allocations:
        indices = allocation.get("gpu_indices") if isinstance(allocation, dict) else None
        if (
            not isinstance(allocation, dict)
            or not isinstance(allocation.get("node"), str)
            or len(allocation["node"]) > 253
            or not isinstance(indices, list)
            or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_GPUS_PER_NODE
                for i in indices
            )
        ):
            raise BadRequest("cluster_job", message)
        checked.append({"node": allocation["node"], "gpu_indices": indices})
    if _unstorable(checked) or _unstorable(value["id"]):
        raise BadRequest("cluster_job", message)
    return {"id": str(value["id"])[:100], "allocations": checked}


MAX_CHECKPOINT_AGE = 366 * 86400.0


def _age(event: dict) -> float:
    """A checkpoint's age in seconds, by the agent's clock (so a skewed clock does not move
    it)."""
    age = event.get("age")
    if (
        isinstance(age, bool)
        or not isinstance(age, int | float)
        or not 0 <= age <= MAX_CHECKPOINT_AGE
    ):
        raise BadRequest(
            "age", f"age: must be a number of seconds between 0 and {MAX_CHECKPOINT_AGE:g}."
        )
    return float(age)


def _event(event: Any, i: int) -> dict:
    where = f"events[{i}]"
    if not isinstance(event, dict):
        raise BadRequest(where, f"{where}: must be an object.")
    kind = event.get("type")
    if kind not in EVENT_TYPES:
        raise BadRequest(f"{where}.type", f"{where}.type: one of {', '.join(EVENT_TYPES)}.")
    try:
        attempt = _int(event, "attempt", low=1)
        log = _text(event, "log_tail", max_length=1_000_000)
        checked = {"type": kind, "attempt": attempt, "log": log}
        if kind == EVENT_EXITED:
            end = event.get("end")
            if end not in END_REASONS:
                raise BadRequest("end", f"end: one of {', '.join(END_REASONS)}.")
            checked["end"] = end
            checked["exit_code"] = _int(event, "exit_code", low=-255, high=255, required=False)
            signalled = event.get("signalled", False)
            if not isinstance(signalled, bool):
                raise BadRequest("signalled", "signalled: must be true or false.")
            checked["signalled"] = signalled
            checked["detail"] = _text(event, "detail", max_length=2000)
        if kind in (EVENT_STARTED, EVENT_EXITED) and event.get("cluster_job") is not None:
            checked["cluster_job"] = _cluster_job(event["cluster_job"])
        if kind == EVENT_CHECKPOINT:
            checked["age"] = _age(event)
    except BadRequest as error:
        ((field, message),) = error.errors.items()
        raise BadRequest(f"{where}.{field}", f"{where}.{message}") from None
    return checked


# --- Connectors (`gpu-agent slurm`): the same words, for all the nodes of a cluster ----------

CONNECTOR_AUTH_SCHEME = "Connector"
CONNECTOR_NOT_AUTHENTICATED = (
    "Authorization: send 'Connector <token>' with the token this connector got when it registered."
)
MAX_CONNECTOR_NODES = 20_000
MAX_CONNECTOR_STARTS = 10_000


def _authenticated_connector(request: HttpRequest) -> Connector | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme != CONNECTOR_AUTH_SCHEME:
        return None
    return connector_for_token(token.strip())


def _connector_not_authenticated() -> JsonResponse:
    return JsonResponse({"detail": CONNECTOR_NOT_AUTHENTICATED}, status=401)


def _cluster_nodes(data: dict, *, required: bool) -> list[ClusterNode]:
    """`nodes`: [{name, gpu_type, gpus, state, reason?, outside_gpus?}], as the cluster manager
    sees them."""
    nodes = data.get("nodes")
    if nodes is None and not required:
        return []
    if not isinstance(nodes, list) or len(nodes) > MAX_CONNECTOR_NODES:
        raise BadRequest("nodes", f"nodes: must be a list of at most {MAX_CONNECTOR_NODES} nodes.")
    checked = []
    for i, node in enumerate(nodes):
        where = f"nodes[{i}]"
        if not isinstance(node, dict):
            raise BadRequest(where, f"{where}: must be an object.")
        try:
            gpus = _int(node, "gpus", low=1, high=MAX_GPUS_PER_NODE)
            state = node.get("state")
            if state not in NODE_STATES:
                raise BadRequest("state", f"state: one of {', '.join(NODE_STATES)}.")
            checked.append(
                ClusterNode(
                    name=_str(node, "name", max_length=253),
                    gpu_type=_gpu_type(node),
                    gpus=gpus,
                    state=state,
                    reason=_text(node, "reason", max_length=300),
                    outside_gpus=_int(node, "outside_gpus", low=0, high=gpus, required=False) or 0,
                )
            )
        except BadRequest as error:
            ((field, message),) = error.errors.items()
            raise BadRequest(f"{where}.{field}", f"{where}.{message}") from None
    return checked


def _gpu_type(node: dict) -> str:
    """A cluster node's GPU type, checked here as the model checks it (`validate_gpu_type`):
    refused as part of the request, the events beside it are still applied (`Events`)."""
    value = _str(node, "gpu_type", max_length=32)
    try:
        validate_gpu_type(value)
    except ValidationError as error:
        raise BadRequest("gpu_type", error.messages[0]) from None
    return value


@agent_view(authenticated=False, answer_seconds=CONNECTOR_ANSWER_SECONDS)
def connector_register(request: HttpRequest, data: dict) -> JsonResponse:
    """{join_token, name, kind, nodes: [...]} → {connector, token, nodes, ...}: the connector
    and every node of its cluster."""
    join_token = _str(data, "join_token", max_length=128)
    name = _str(data, "name", max_length=253)
    kind = data.get("kind")
    if kind not in Connector.Kind.values:
        raise BadRequest("kind", f"kind: one of {', '.join(Connector.Kind.values)}.")
    nodes = _cluster_nodes(data, required=True)
    try:
        connector, token = connectors.connector_register(
            join_token=join_token, name=name, kind=kind, nodes=nodes
        )
    except PermissionError as error:
        return JsonResponse({"join_token": str(error)}, status=403)
    except NodeConflict as error:
        return JsonResponse(error.errors, status=409)
    return JsonResponse(
        {
            "connector": connector.name,
            "token": token,
            "nodes": [node.name for node in nodes],
            "poll_wait_seconds": settings.AGENT_POLL_MAX_WAIT_SECONDS,
            "heartbeat_timeout_seconds": settings.NODE_HEARTBEAT_TIMEOUT_SECONDS,
        },
        status=201,
    )


CONNECTOR = Principal(_authenticated_connector, _connector_not_authenticated)


@agent_view(about=_attempts_named, principal=CONNECTOR, answer_seconds=CONNECTOR_ANSWER_SECONDS)
def connector_start(request: HttpRequest, connector: Connector, data: dict) -> JsonResponse:
    """{attempts: [attempt ids]} → {start: [attempt ids]}, as an agent's start."""
    attempts = _ids(data, "attempts", most=MAX_CONNECTOR_STARTS)
    connectors.connector_heartbeat(connector=connector)
    started = connectors.connector_start(connector=connector, attempt_ids=attempts)
    return JsonResponse({"start": sorted(started)})


@agent_view(about=_attempts_named, principal=CONNECTOR)
def connector_report(request: HttpRequest, connector: Connector, data: dict) -> JsonResponse:
    """{events: [...], nodes?: [...]} → {results: [...]}, as an agent's report; `nodes`: what
    the cluster manager now says of some of them."""
    events = _events(data, required=True)
    try:
        nodes = _cluster_nodes(data, required=False)
    except BadRequest as error:
        nodes, events.refused = [], error
    connectors.connector_nodes_update(connector=connector, nodes=nodes)
    connectors.connector_heartbeat(connector=connector)
    results = connectors.connector_report(connector=connector, events=events.checked)
    if events.refused is not None:
        raise events.refused
    return JsonResponse({"results": results})


@csrf_exempt
@require_POST
async def connector_poll(request: HttpRequest) -> JsonResponse:
    """A connector's heartbeat and long poll, as an agent's (`poll`), for all its nodes:
    {running, stopping, wait, events?, nodes?, full?} → {run: [...], stop: [...], results,
    and resend_nodes when the portal wants every node in the next poll's `nodes`}. A run order
    names all the nodes of its attempt (`nodes`: [{node, gpu_indices}]); `full`: the run
    orders of the attempts in `running` too, answered at once."""
    return await _long_poll(
        request,
        principal=CONNECTOR,
        start=lambda connector, **poll: connectors.connector_poll_start(connector=connector,
                                                                        **poll),
        again=lambda connector, running, **_fields: connectors.connector_orders(
            connector=connector, running=running
        ),
        more=_connector_poll_fields,
        report=lambda connector, events: connectors.connector_report(connector=connector,
                                                                      events=events),
    )  # fmt: skip


def _connector_poll_fields(data: dict) -> dict:
    """What a connector's poll carries beside an agent's: `nodes` and `full`."""
    full = data.get("full", False)
    if not isinstance(full, bool):
        raise BadRequest("full", "full: must be true or false.")
    return {"nodes": _cluster_nodes(data, required=False), "full": full}

"""How a message goes out on each channel: e-mail through Django's mail (SMTP), a webhook as
JSON signed with HMAC-SHA256, Slack's incoming webhook as {"text": ...}. Network only: no
database here, so the dispatch can run these on threads.

Every call is bounded by NOTIFICATIONS_TIMEOUT_SECONDS (connect and answer), so an endpoint
that does not answer holds up only its own messages. Webhooks and Slack connect only to the
addresses `notifications.targets` allows, and follow no redirect."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import smtplib
from dataclasses import dataclass

import requests
from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from notifications.targets import GuardedAdapter, TargetRefused, webhook_address

SIGNATURE_HEADER = "X-Portal-Signature-256"
EVENT_HEADER = "X-Portal-Event"
DELIVERY_HEADER = "X-Portal-Delivery"
USER_AGENT = "gpu-quota-portal-notifications"
# How much of an endpoint's answer a failure records.
ANSWER_CHARS = 300
REFUSED = "refused, not sent (a configuration error: not tried again): {reason}"


@dataclass(frozen=True)
class Message:
    """One delivery as the channels see it."""

    delivery_id: int
    channel: str
    target: str
    secret: str
    kind: str
    payload: dict


@dataclass(frozen=True)
class Outcome:
    ok: bool
    detail: str
    # The endpoint itself is unreachable or refuses everything (not just this message): the
    # endpoint's other messages wait for this one's next try.
    endpoint_down: bool = False
    # Trying again cannot help (the target is refused): the delivery is given up at once.
    give_up: bool = False


def signature(body: bytes, secret: str) -> str:
    """The value of X-Portal-Signature-256: "sha256=" and the hex HMAC-SHA256 of the body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def webhook_body(message: Message) -> bytes:
    """The generic webhook's body: the payload, with the delivery's id, as compact JSON."""
    data = {"delivery": message.delivery_id, **message.payload}
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


def _job_page(message: Message) -> str | None:
    """The job's page on the portal (`NOTIFICATIONS_PORTAL_URL` set), for a person to follow."""
    return (message.payload.get("job") or {}).get("page")


def slack_body(message: Message) -> bytes:
    page = _job_page(message)
    text = message.payload["text"] + (f"\n<{page}|the job's page>" if page else "")
    return json.dumps({"text": text}).encode()


def post(message: Message, session: requests.Session) -> Outcome:
    """A webhook or Slack message: one POST. 2xx is sent; anything else is a failure."""
    if message.channel == "slack":
        body, headers = slack_body(message), {}
    else:
        body = webhook_body(message)
        headers = {EVENT_HEADER: message.kind, DELIVERY_HEADER: str(message.delivery_id)}
        if message.secret:
            headers[SIGNATURE_HEADER] = signature(body, message.secret)
    headers |= {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    timeout = settings.NOTIFICATIONS_TIMEOUT_SECONDS
    try:
        webhook_address(message.target)  # refused as at subscription (a target made before)
        response = session.post(
            message.target, data=body, headers=headers, timeout=timeout, allow_redirects=False
        )
    except TargetRefused as error:
        return Outcome(False, REFUSED.format(reason=error), give_up=True)
    except requests.RequestException as error:
        return Outcome(False, f"{type(error).__name__}: {error}"[:ANSWER_CHARS], True)
    answer = f"HTTP {response.status_code} {response.text[:ANSWER_CHARS]}".strip()
    if response.is_redirect:
        answer = f"{answer} (redirect to {response.headers['Location']!r} not followed)"
    if 200 <= response.status_code < 300:
        return Outcome(True, answer)
    # A server error or throttling says the endpoint is in trouble; a 4xx is about this message.
    return Outcome(False, answer, response.status_code >= 500 or response.status_code == 429)


def email_subject(message: Message) -> str:
    share = message.payload.get("share")
    return f"[gpu-portal] {message.kind}" + (f" · share {share}" if share else "")


def email_body(message: Message) -> str:
    lines = [message.payload["text"], ""]
    if page := _job_page(message):
        lines += [f"The job's page: {page}", ""]
    for key in ("job", "preemption", "changes"):
        if message.payload.get(key):
            lines.append(f"{key}: {json.dumps(message.payload[key], indent=2, sort_keys=True)}")
    lines += ["", "You get this because of a subscription in the GPU quota portal."]
    return "\n".join(lines)


def send_emails(messages: list[Message]) -> list[Outcome | None]:
    """The messages over one SMTP connection. A server that cannot be reached or drops the
    connection fails the message being sent and leaves the rest untried (None, endpoint down);
    a refused recipient fails only its own message."""
    outcomes: list[Outcome | None] = []
    connection = get_connection(timeout=settings.NOTIFICATIONS_TIMEOUT_SECONDS)
    try:
        connection.open()
    except (OSError, smtplib.SMTPException) as error:
        detail = f"SMTP: {type(error).__name__}: {error}"[:ANSWER_CHARS]
        return [Outcome(False, detail, True)] + [None] * (len(messages) - 1)
    try:
        for message in messages:
            email = EmailMessage(
                subject=email_subject(message),
                body=email_body(message),
                from_email=settings.DEFAULT_FROM_EMAIL,
                to=[message.target],
                headers={EVENT_HEADER: message.kind, DELIVERY_HEADER: str(message.delivery_id)},
                connection=connection,
            )
            try:
                email.send()
                outcomes.append(Outcome(True, f"SMTP accepted for {message.target}"))
            except smtplib.SMTPRecipientsRefused as error:
                outcomes.append(Outcome(False, f"SMTP refused: {error}"[:ANSWER_CHARS]))
            except (OSError, smtplib.SMTPException) as error:
                detail = f"SMTP: {type(error).__name__}: {error}"[:ANSWER_CHARS]
                outcomes.append(Outcome(False, detail, True))
                outcomes += [None] * (len(messages) - len(outcomes))
                break
    finally:
        with contextlib.suppress(OSError, smtplib.SMTPException):
            connection.close()
    return outcomes


def send_group(messages: list[Message]) -> list[Outcome | None]:
    """The messages of one endpoint, in order. Once the endpoint is down, the rest are not
    tried (None): they wait for the failed one's next try."""
    if messages[0].channel == "email":
        return send_emails(messages)
    results: list[Outcome | None] = []
    with requests.Session() as session:
        session.trust_env = False  # no proxy from the environment: it would connect unchecked
        session.mount("http://", GuardedAdapter())
        session.mount("https://", GuardedAdapter())
        for message in messages:
            outcome = post(message, session)
            results.append(outcome)
            if outcome.endpoint_down:
                results += [None] * (len(messages) - len(results))
                break
    return results

"""Which addresses a webhook or Slack message may reach. A user names the URL, so without a
rule the portal would post to whatever its own network reaches (server-side request forgery):
a loopback service, the cloud's metadata address, a host of the private network. So a target
whose host resolves to a loopback, private, link-local, multicast, reserved, unspecified or
otherwise non-public address is refused, unless the address is inside one of
NOTIFICATIONS_WEBHOOK_ALLOWED_NETS (comma-separated CIDRs, empty by default).

The URL is read as the sender reads it (`webhook_address`: requests prepares it, urllib3 takes
the host and port from it), at subscription and at each send alike, so the address checked is
the address posted to. What parsers read differently is refused outright: a control character
(urlsplit drops a tab that urllib3 refuses), a backslash (part of the host to urlsplit, a "/"
to urllib3), a port outside 1..65535 (requests drops a port 0 and posts to the default one).

The rule is checked when a subscription is made (`check_target`) and again at each send, on
the address actually connected to: `GuardedAdapter` resolves the host once, checks every
address, and connects only to those checked, so a name that resolves elsewhere the second
time (DNS rebinding) gains nothing. TLS still verifies the certificate against the host's
name. Network only, no database."""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, LocationParseError, NewConnectionError
from urllib3.util import connection, parse_url

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Messages that tests assert: each names the field and the rule.
URL_INVALID = "target: a webhook URL must be http:// or https:// with a host (got {target!r})."
AMBIGUOUS_CHARACTER = (
    "target: {target!r} holds a control character (a tab, a line break, ...) or a backslash, "
    "which URL parsers read differently; a webhook URL has none (in its path, percent-encode "
    "them: %09, %5C)."
)
HOST_UNRESOLVED = "target: the host {host!r} does not resolve to an address."
ADDRESS_REFUSED = (
    "target: {host!r} resolves to {address}, a {kind} address; webhooks go only to public "
    "addresses (an admin may allow networks in NOTIFICATIONS_WEBHOOK_ALLOWED_NETS)."
)
PORT_INVALID = "target: the port of {target!r} is not a number from 1 to 65535."
ALLOWED_NETS_INVALID = "NOTIFICATIONS_WEBHOOK_ALLOWED_NETS: {net!r} is not a network in CIDR form."


# C0 controls, DEL and the backslash: Python's urlsplit drops tabs and line breaks that
# urllib3 refuses, and reads a backslash as part of the host where urllib3 reads a "/".
_AMBIGUOUS = re.compile(r"[\x00-\x1f\x7f\\]")
PORTS = range(1, 65536)


class TargetRefused(Exception):
    """The target is no URL the sender can post to as written, or its host does not resolve,
    or resolves to an address the rule refuses. Its message is one of the messages above."""


def allowed_nets() -> list[Network]:
    """NOTIFICATIONS_WEBHOOK_ALLOWED_NETS, parsed."""
    nets = []
    for net in settings.NOTIFICATIONS_WEBHOOK_ALLOWED_NETS.split(","):
        if net.strip():
            try:
                nets.append(ipaddress.ip_network(net.strip(), strict=False))
            except ValueError as error:
                raise ImproperlyConfigured(ALLOWED_NETS_INVALID.format(net=net.strip())) from error
    return nets


def refused_kind(address: Address) -> str | None:
    """Why the address is refused ("loopback", "private", ...), or None if it may be reached."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    kinds = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        ("non-public", not address.is_global),
    )
    kind = next((name for name, matches in kinds if matches), None)
    if kind is None or any(address in net for net in allowed_nets()):
        return None
    return kind


def checked_addresses(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, each allowed by the rule; else TargetRefused."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError) as error:
        raise TargetRefused(HOST_UNRESOLVED.format(host=host)) from error
    addresses = list(dict.fromkeys(sockaddr[0] for *_, sockaddr in found))
    if not addresses:
        raise TargetRefused(HOST_UNRESOLVED.format(host=host))
    for address in addresses:
        kind = refused_kind(ipaddress.ip_address(address))
        if kind:
            raise TargetRefused(ADDRESS_REFUSED.format(host=host, address=address, kind=kind))
    return addresses


def webhook_address(url: str) -> tuple[str, int]:
    """The host and port a message to `url` goes to, read as the sender reads it (requests
    prepares the URL, urllib3 takes the host and port from it). TargetRefused where the URL
    holds a control character or a backslash (read differently by other parsers: by a person,
    too), is no http(s) URL with a host, or has a port outside 1..65535: the sender would refuse
    it, or (port 0, which requests drops) post where it does not say. No network."""
    if _AMBIGUOUS.search(url):
        raise TargetRefused(AMBIGUOUS_CHARACTER.format(target=url))
    try:
        written = parse_url(url)  # as requests reads it first, with the port as written
        prepared = requests.PreparedRequest()
        prepared.prepare_url(url, None)
        sent = parse_url(prepared.url)
    except (LocationParseError, requests.RequestException):
        raise TargetRefused(_unreadable(url)) from None
    if written.scheme not in ("http", "https") or not sent.host:
        raise TargetRefused(URL_INVALID.format(target=url))
    if written.port is not None and written.port not in PORTS:
        raise TargetRefused(PORT_INVALID.format(target=url))
    return sent.host.strip("[]"), sent.port or (443 if sent.scheme == "https" else 80)


def _unreadable(url: str) -> str:
    """Which rule a URL the sender cannot read breaks: its port (not a number from 1 to 65535),
    else the URL's form. The message only: the URL is refused either way."""
    try:
        _ = urlsplit(url).port  # ValueError: no number, or one above 65535
    except ValueError:
        return PORT_INVALID.format(target=url)
    return URL_INVALID.format(target=url)


def check_target(url: str) -> None:
    """A webhook URL the sender can post to (`webhook_address`) whose host the rule allows;
    else TargetRefused."""
    checked_addresses(*webhook_address(url))


class _GuardedConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        """A socket to one of the host's checked addresses (urllib3 would resolve it anew)."""
        error: Exception | None = None
        for address in checked_addresses(self._dns_host, self.port):
            try:
                return connection.create_connection(
                    (address, self.port),
                    self.timeout,
                    source_address=self.source_address,
                    socket_options=self.socket_options,
                )
            except TimeoutError as timeout:
                error = ConnectTimeoutError(
                    self, f"Connection to {self.host} timed out. (connect timeout={self.timeout})"
                )
                error.__cause__ = timeout
            except OSError as refused:
                error = NewConnectionError(self, f"Failed to establish a new connection: {refused}")
                error.__cause__ = refused
        raise error


class _GuardedHTTPSConnection(_GuardedConnection, HTTPSConnection):
    pass


class _GuardedPool(HTTPConnectionPool):
    ConnectionCls = _GuardedConnection


class _GuardedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


class GuardedAdapter(HTTPAdapter):
    """A requests transport that connects only to addresses the rule allows; a refused one
    raises TargetRefused from the request. Mount it on a session that ignores the
    environment's proxies (`trust_env = False`): a proxy would connect for us, unchecked."""

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _GuardedPool, "https": _GuardedHTTPSPool}

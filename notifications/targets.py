"""Which addresses a webhook or Slack message may reach. A user names the URL, so without a
rule the portal would post to whatever its own network reaches (server-side request forgery):
a loopback service, the cloud's metadata address, a host of the private network. So a target
whose host resolves to a loopback, private, link-local, multicast, reserved, unspecified or
otherwise non-public address is refused, unless the address is inside one of
NOTIFICATIONS_WEBHOOK_ALLOWED_NETS (comma-separated CIDRs, empty by default).

The rule is checked when a subscription is made (`check_target`) and again at each send, on
the address actually connected to: `GuardedAdapter` resolves the host once, checks every
address, and connects only to those checked, so a name that resolves elsewhere the second
time (DNS rebinding) gains nothing. TLS still verifies the certificate against the host's
name. Network only, no database."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.util import connection

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Messages that tests assert: each names the field and the rule.
HOST_UNRESOLVED = "target: the host {host!r} does not resolve to an address."
ADDRESS_REFUSED = (
    "target: {host!r} resolves to {address}, a {kind} address; webhooks go only to public "
    "addresses (an admin may allow networks in NOTIFICATIONS_WEBHOOK_ALLOWED_NETS)."
)
PORT_INVALID = "target: the port of {target!r} is not a number from 1 to 65535."
ALLOWED_NETS_INVALID = "NOTIFICATIONS_WEBHOOK_ALLOWED_NETS: {net!r} is not a network in CIDR form."


class TargetRefused(Exception):
    """The target's host does not resolve, or resolves to an address the rule refuses. Its
    message is one of the messages above."""


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


def check_target(url: str) -> None:
    """A webhook URL (http or https, with a host) whose host the rule allows; else
    TargetRefused."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as error:
        raise TargetRefused(PORT_INVALID.format(target=url)) from error
    checked_addresses(parts.hostname, port)


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

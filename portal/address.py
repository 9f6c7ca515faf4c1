"""PORTAL_ADDRESS, where the portal listens: read by the settings (PORTAL_HOST, PORTAL_PORT,
ALLOWED_HOSTS) and by `gpu-portal-server` and `make run`. Nothing of Django: the server
command uses it before the settings are loaded."""

from __future__ import annotations

import ipaddress

DEFAULT_ADDRESS = "127.0.0.1:8000"
ADDRESS_MALFORMED = (
    "PORTAL_ADDRESS must be HOST:PORT, with a port from 1 to 65535 and an IPv6 address in "
    "brackets (0.0.0.0:8000, [::1]:8000), not {address!r}."
)


def split_address(address: str) -> tuple[str, int]:
    """PORTAL_ADDRESS's host and port: `0.0.0.0:8000` → ("0.0.0.0", 8000), `[::1]:8000` →
    ("::1", 8000). ValueError (ADDRESS_MALFORMED) for anything else."""
    host, colon, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            host = ""
    elif ":" in host or "[" in host or "]" in host:
        host = ""  # an IPv6 address without brackets, or HOST:PORT:MORE
    port_ok = port.isascii() and port.isdigit() and 1 <= int(port) <= 65535
    if not (colon and host.strip() and port_ok):
        raise ValueError(ADDRESS_MALFORMED.format(address=address))
    return host, int(port)

"""Which ``Host`` headers and browser ``Origin`` headers the server answers.

Any web page can make a browser send a "simple" POST to a loopback server, and a page whose name
is re-pointed at 127.0.0.1 (DNS rebinding) can read the answers too. So a request is refused when
its ``Host`` names something other than the server's own names (by default: the loopback names
when bound to loopback, the bound address and the loopback names when bound to one other address,
anything when bound to a wildcard address such as 0.0.0.0, whose names cannot be known), or when
it carries an ``Origin`` (a browser's cross-site request) other than the server itself or one
allowed with ``--allow-origin``.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable, Sequence

#: the names a loopback server answers to by default
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ANY = "*"


def host_name(value: str) -> str:
    """``Host``-header form -> a bare lowercase name: ``[::1]:8000`` -> ``::1``, ``Example.COM.:80`` ->
    ``example.com``."""
    value = value.strip().lower()
    if value.startswith("["):  # [v6]:port
        return value[1:].split("]", 1)[0]
    if value.count(":") == 1:  # name:port (a bare IPv6 address has more colons)
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def is_loopback(host: str) -> bool:
    name = host_name(host)
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host_name(host)).is_unspecified
    except ValueError:
        return False


def default_hosts(bind: str) -> list[str]:
    """The ``Host`` names a server bound to ``bind`` answers to when none are configured."""
    if is_wildcard(bind):
        return [ANY]
    names = list(LOOPBACK_NAMES)
    if not is_loopback(bind):
        names.insert(0, host_name(bind))
    return names


class Access:
    """The allowed ``Host`` names (``"*"``: any) and extra ``Origin`` values (``"*"``: any)."""

    def __init__(self, hosts: Sequence[str] | None = None, origins: Iterable[str] = ()):
        hosts = LOOPBACK_NAMES if hosts is None else hosts
        self.hosts = [ANY if h.strip() == ANY else host_name(h) for h in hosts]
        self.origins = [o.strip().lower().rstrip("/") for o in origins]

    def host_ok(self, host: str | None) -> bool:
        """A request without a ``Host`` header (HTTP/1.0; never a browser) passes."""
        return host is None or ANY in self.hosts or host_name(host) in self.hosts

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        """No ``Origin`` (not a browser's cross-site request), the server's own origin (its host and
        port as in ``Host``), or one allowed."""
        if origin is None:
            return True
        origin = origin.strip().lower().rstrip("/")
        if ANY in self.origins or origin in self.origins:
            return True
        own = origin.split("://", 1)[1] if "://" in origin else None
        return own is not None and host is not None and own == host.strip().lower()

"""Reading an exporter's listen address (`--metrics` on the node, `--listen` on the operator's
fleet exporter) and saying why a bind failed: one reading for both sides, one line each.

Pure; valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import ipaddress
import os
from typing import Optional, Tuple

DEFAULT_HOST = "127.0.0.1"


class ListenError(ValueError):
    """A bad `--metrics` address; the message is one line for a person."""


def parse_listen(text: str, option: str, default_port: int) -> Tuple[str, int]:
    """`HOST:PORT`, `[V6]:PORT`, `HOST` or `PORT` -> (host, port); the host defaults to
    127.0.0.1 and the port to `default_port` (9835, the node exporter's; the fleet exporter's is
    9836). The host must be an IP address (or `localhost`): the address to bind is said, never
    looked up."""
    raw = text.strip()
    if not raw:
        raise ListenError("%s: give an address to listen on, e.g. 127.0.0.1:%d" % (option, default_port))
    host, port_text = raw, ""
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0:
            raise ListenError("%s %s: unclosed '[' in an IPv6 address" % (option, text[:80]))
        host, rest = raw[1:end], raw[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ListenError("%s %s: expected ':PORT' after ']'" % (option, text[:80]))
        port_text = rest[1:]
    elif raw.isdigit():
        host, port_text = DEFAULT_HOST, raw
    elif raw.count(":") == 1:
        host, port_text = raw.split(":")
    if host == "":
        raise ListenError(
            "%s %s: say which address to bind (127.0.0.1 for this machine only, 0.0.0.0 for every "
            "interface)" % (option, text[:80])
        )
    if host == "localhost":
        host = DEFAULT_HOST
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ListenError("%s %s: %r is not an IP address" % (option, text[:80], host[:64])) from None
    if port_text == "":
        port = default_port
    elif port_text.isdigit() and int(port_text) <= 65535:
        port = int(port_text)
    else:
        raise ListenError("%s %s: the port must be a number from 0 to 65535" % (option, text[:80]))
    return host, port


def exposure_warning(host: str, port: int, option: str) -> Optional[str]:
    """The line an exporter says once, on stderr, when it serves every interface (`0.0.0.0`,
    `::`): plain HTTP without authentication to every network the machine is on, and the safe
    ways docs/prometheus.md names. None for any other address."""
    try:
        unspecified = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return None
    if not unspecified:
        return None
    where = "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)
    return (
        "warning: %s %s serves /metrics on every interface, in plain HTTP without authentication, "
        "to anyone who can reach this machine: its figures name every team, user and host. Safer "
        '(docs/prometheus.md, "Scrape the exporters"): 127.0.0.1 with Prometheus or its agent '
        "beside it, a reverse proxy with TLS and authentication on the one interface Prometheus "
        "comes from, or an SSH tunnel" % (option, where)
    )


def bind_error(host: str, port: int, exc: OSError, option: str) -> str:
    """One line for a failed bind: the address and the system's reason."""
    where = "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)
    # asyncio rewrites strerror into a sentence of its own: the system's words come from errno.
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return "%s %s: cannot listen: %s" % (option, where, reason)

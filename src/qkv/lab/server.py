"""Serving the lab with uvicorn, with what a local server left running needs.

- **Where it listens.** ``check_host`` resolves ``--host``: a malformed or unresolvable one is an
  ``ArgumentError``; one that is not loopback is served only with ``allow_remote=True``
  (``RemoteBind`` otherwise), since the API has no authentication.
- **Who it answers.** The app gets the names it may be reached by (``hosts_for``): 127.0.0.1,
  localhost, [::1] and the given host; every other ``Host`` header is refused (``guard.HostGuard``).
- **How long a connection may dawdle.** ``GuardedH11Protocol`` closes a connection whose request
  (headers and body) has not fully arrived ``Limits.request_timeout_seconds`` after the
  connection opened or the previous response ended (uvicorn itself times out only idle
  keep-alive connections, not one that never finishes its headers: slowloris). Headers are at
  most ``max_header_bytes``, idle keep-alive connections close after ``keep_alive_seconds``, and
  at most ``max_connections`` connections are served at once (uvicorn answers 503 beyond).

``python -m qkv lab`` (``qkv.cli.lab``) is the one caller; it prints the startup lines.
"""

import asyncio
import ipaddress
import re
import socket

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import ArgumentError
from .guard import LOOPBACK_NAMES
from .schemas import Limits, shown

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$", re.IGNORECASE)


class RemoteBind(Exception):
    """A non-loopback ``--host`` without ``--allow-remote``."""


def _syntax(host: str) -> str:
    """``host`` without IPv6 brackets, if it is an IP address or a well-formed DNS name."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        pass
    labels = bare.rstrip(".").split(".")
    if 0 < len(bare) <= 253 and all(_LABEL.match(x) for x in labels) and not labels[-1].isdigit():
        return bare
    raise ArgumentError(f"--host must be an IP address or a host name, got {shown(host)}")


def check_host(host: str, allow_remote: bool = False) -> tuple[str, bool]:
    """``(host to bind, is it loopback)``; ``ArgumentError`` if malformed or unresolvable,
    ``RemoteBind`` if not loopback and ``allow_remote`` is false."""
    bare = _syntax(host)
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(bare, None, proto=socket.IPPROTO_TCP)}
    except (socket.gaierror, UnicodeError) as e:
        raise ArgumentError(f"--host {shown(host)} cannot be resolved: {e}") from None
    addresses = [ipaddress.ip_address(a.split("%")[0]) for a in found]
    loopback = bool(addresses) and all(a.is_loopback for a in addresses)
    if not loopback and not allow_remote:
        raise RemoteBind(
            f"--host {host} ({', '.join(sorted(found))}) is not a loopback address: anyone who can reach it "
            "could use the lab's API, which has no authentication; add --allow-remote to serve it anyway"
        )
    return bare, loopback


def hosts_for(host: str) -> tuple[tuple[str, ...], bool]:
    """The ``Host`` names the app accepts when bound to ``host``, and whether any IP address is
    accepted too (a wildcard bind, ``0.0.0.0`` or ``::``, is reached by the machine's addresses)."""
    names = [*LOOPBACK_NAMES, host]
    wildcard = host in ("0.0.0.0", "::")
    if wildcard:
        names += [socket.gethostname(), socket.getfqdn()]
    return tuple(dict.fromkeys(n for n in names if n)), wildcard


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request has not fully arrived
    ``request_timeout`` seconds after the connection opened or the previous response ended."""

    request_timeout = Limits.request_timeout_seconds
    _deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
            self.transport.close()  # too slow a request: connection_lost tells a waiting app

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()  # the whole request is in

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request on this connection gets the same time

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def make_server(app: FastAPI, host: str, port: int) -> uvicorn.Server:
    """A uvicorn server for ``app`` (made by ``create_app``) with the connection limits of its ``Limits``."""
    lim: Limits = app.state.limits
    protocol = type("LabProtocol", (GuardedH11Protocol,), {"request_timeout": lim.request_timeout_seconds})
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        log_level="warning",
        timeout_graceful_shutdown=2,
        timeout_keep_alive=lim.keep_alive_seconds,
        h11_max_incomplete_event_size=lim.max_header_bytes,
        limit_concurrency=lim.max_connections,
        proxy_headers=False,  # nothing stands in front of a local lab: the peer is who it says
        server_header=False,
        ws="none",
        lifespan="on",
    )
    return uvicorn.Server(config)

"""Serving the lab with uvicorn, with what a local server left running needs.

- **Where it listens.** ``check_host`` resolves ``--host``: a malformed or unresolvable one is an
  ``ArgumentError``; one that is not loopback is served only with ``allow_remote=True``
  (``RemoteBind`` otherwise), since the API has no authentication.
- **Who it answers.** The app gets the names it may be reached by (``hosts_for``): 127.0.0.1,
  localhost, [::1] and the given host; every other ``Host`` header is refused (``guard.HostGuard``).
- **How long a connection may dawdle.** ``GuardedH11Protocol`` closes a connection whose request
  (headers and body) has not fully arrived ``Limits.request_timeout_seconds`` after the
  connection opened or the previous response ended (uvicorn itself times out only idle
  keep-alive connections, not one that never finishes its headers: slowloris). A request's head
  (request line and headers) is at most ``max_header_bytes`` however it arrives (431 beyond,
  ``HeadLimit``), idle keep-alive connections close after ``keep_alive_seconds``, and at most
  ``max_connections`` connections are served at once (uvicorn answers 503 beyond).

``python -m qkv lab`` (``qkv.cli.lab``) is the one caller; it prints the startup lines.
"""

import asyncio
import ipaddress
import json
import re
import socket
from typing import Any

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


class HeadLimit(h11.Connection):
    """h11's server side, with its size limit applied to every request head.

    h11 checks ``max_incomplete_event_size`` only while a head is still incomplete, so a head
    larger than the limit that arrived in one read (a 64 kB header block in one ``send``) was
    parsed and served. Here the bytes a ``Request`` event consumed are counted as well, and a head
    above ``max_head`` bytes is the same ``RemoteProtocolError`` (hint 431) h11 raises for one that
    arrives in pieces. The error h11 raised last is kept in ``refused`` for the answer."""

    def __init__(self, max_head: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head)
        self.max_head = max_head
        self.refused: h11.RemoteProtocolError | None = None

    def _buffered(self) -> int:
        return len(self.trailing_data[0])

    def next_event(self) -> Any:
        before = self._buffered() if self.their_state is h11.IDLE else 0
        try:
            event = super().next_event()
            if isinstance(event, h11.Request) and before - self._buffered() > self.max_head:
                raise h11.RemoteProtocolError("request head above the limit", error_status_hint=431)
        except h11.RemoteProtocolError as e:
            self.refused = e
            raise
        return event


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request has not fully arrived
    ``request_timeout`` seconds after the connection opened or the previous response ended, and
    answering 431 to a request head above ``max_head`` bytes (``HeadLimit``)."""

    request_timeout = Limits.request_timeout_seconds
    max_head = Limits.max_header_bytes
    _deadline: asyncio.TimerHandle | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = HeadLimit(self.max_head)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 refused (always 400): 431 for a head above the limit."""
        refused = getattr(self.conn, "refused", None)
        if refused is None or refused.error_status_hint != 431:
            super().send_400_response(msg)
            return
        text = (
            f"the request's head (request line and headers) is above the lab's limit of "
            f"max_header_bytes={self.max_head} bytes"
        )
        body = json.dumps({"detail": text, "message": text}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        self.transport.write(
            self.conn.send(h11.Response(status_code=431, headers=headers, reason=b"Request Header Fields Too Large"))
        )
        self.transport.write(self.conn.send(h11.Data(data=body)))
        self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()

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
    protocol = type(
        "LabProtocol",
        (GuardedH11Protocol,),
        {"request_timeout": lim.request_timeout_seconds, "max_head": lim.max_header_bytes},
    )
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

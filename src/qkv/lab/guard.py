"""Two ASGI middlewares in front of every route of the lab: the Host check and the body limit.

``HostGuard`` answers 400 to a request whose ``Host`` header names another server than the one
the lab was bound to: a page from ``evil.example`` whose name an attacker re-points at
127.0.0.1 (DNS rebinding) still sends ``Host: evil.example``, so the browser's same-origin rule
cannot be turned against the unauthenticated API. ``BodyLimit`` answers 413 to a body above
``Limits.max_body_bytes``, before anything parses it: at once when ``Content-Length`` says so,
else as soon as a streamed (chunked) body passes the limit. Both answer the lab's refusal JSON.
"""

import ipaddress
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from .schemas import shown

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


async def refuse(send: Send, status: int, message: str) -> None:
    """Send the lab's refusal (``{"detail": message, "message": message}``) and close the connection."""
    body = json.dumps({"detail": message, "message": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*headers, (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def host_name(host: str) -> str:
    """A host as the ``Host`` header writes it, without port: ``::1`` -> ``[::1]``, names lower case."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return f"[{host}]" if ":" in host else host


def _split(header: str) -> str | None:
    """The host part of a ``Host`` header (``name``, ``name:port``, ``[v6]``, ``[v6]:port``); None if malformed."""
    if header.startswith("["):
        end = header.find("]")
        if end < 0:
            return None
        name, rest = header[: end + 1], header[end + 1 :]
    else:
        name, sep, port = header.partition(":")
        rest = sep + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit() and len(rest) <= 6):
        return None
    return host_name(name) if name else None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


class HostGuard:
    """Refuse (400) every request whose ``Host`` is not one of ``hosts`` (any port). With
    ``any_address=True`` (a wildcard bind, ``0.0.0.0`` or ``::``) a host that is an IP address is
    accepted too: a browser that reaches the lab by its address is not being rebound."""

    def __init__(self, app: ASGIApp, hosts: Iterable[str], any_address: bool = False) -> None:
        self.app, self.any_address = app, any_address
        self.hosts = tuple(dict.fromkeys(host_name(h) for h in hosts))

    def allows(self, header: str | None) -> bool:
        name = None if header is None else _split(header.strip())
        return name is not None and (name in self.hosts or (self.any_address and _is_ip(name)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
        if self.allows(header):
            await self.app(scope, receive, send)
            return
        seen = "no Host header" if header is None else f"Host header {shown(header)}"
        await refuse(
            send,
            400,
            f"{seen} is not a name this lab serves (allowed: {', '.join(self.hosts)}); the lab refuses "
            "other names so that a web page cannot reach it through DNS rebinding",
        )


class BodyLimit:
    """Refuse (413) a request body above ``limit`` bytes; the body is read here (at most ``limit``
    bytes) and handed on whole, so nothing downstream ever sees more."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    def _too_large(self, size: str) -> str:
        return f"request body is {size}, above the lab's limit of max_body_bytes={self.limit} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and (not length.strip().isdigit() or int(length) > self.limit):
            said = length.decode("latin-1").strip()
            what = f"{said} bytes" if said.isdigit() else f"of unknown size (Content-Length {shown(said, 20)})"
            await refuse(send, 413, self._too_large(what))
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away before sending its body: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await refuse(send, 413, self._too_large(f"more than {self.limit} bytes (streamed)"))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, delivered = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect a stream waits for

        await self.app(scope, replay, send)

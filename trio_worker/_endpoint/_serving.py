"""The local endpoint on hypercorn, with the bounds a server on a developer's machine needs.

Anything on the machine can reach the local endpoint (docs/security.md), so no peer may
hold it by sending slowly or by opening requests without end. hypercorn bounds some of it
itself, and :class:`Bounded`, an ASGI layer in front of the app, the rest:

* a request head: at most ``h11_max_incomplete_size`` bytes (hypercorn's 16 KiB), and
  complete within ``head_timeout`` of the connection opening or of its previous answer
  (hypercorn's keep-alive timer runs until a whole head is in: one deadline for the whole
  head, which a byte now and then does not extend);
* an idle kept-alive connection: closed after ``head_timeout`` (the same timer);
* a request body: complete within ``body_timeout`` of its head (:class:`Bounded`; 408);
* requests at once: at most ``max_in_flight`` (:class:`Bounded`; past it a 503 that
  closes its connection).
"""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from ._asgi import ASGIApp, Message, Receive, Scope, Send

__all__ = ["Bounded", "EndpointLimits", "serve_endpoint", "url_of"]

log = logging.getLogger("trio_worker")


@dataclass(frozen=True)
class EndpointLimits:
    """The local endpoint's deadlines (seconds) and cap, with named defaults."""

    #: A request head must be complete this long after the connection opened or its
    #: previous answer; an idle connection is closed after it too.
    head_timeout: float = 10.0
    #: A request body must be complete this long after its head: generous for 20 MB on
    #: loopback; what it stops is a body that never ends.
    body_timeout: float = 60.0
    #: Requests served at once. Far above what a worker (a few long-polls and reports)
    #: and a browser (6 per host) open together.
    max_in_flight: int = 256


class _BodyTimeout(Exception):
    pass


def _json_answer(status: int, reason: str, *extra: tuple[bytes, bytes]) -> list[Message]:
    body = json.dumps({"error": reason}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *extra,
    ]
    return [
        {"type": "http.response.start", "status": status, "headers": headers},
        {"type": "http.response.body", "body": body},
    ]


class Bounded:
    """*app* with a deadline on each request body and a cap on requests in flight."""

    def __init__(self, app: ASGIApp, limits: EndpointLimits) -> None:
        self.app = app
        self.limits = limits
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limits = self.limits
        if self.in_flight >= limits.max_in_flight:
            reason = f"too many requests at once (at most {limits.max_in_flight})"
            for message in _json_answer(503, reason, (b"retry-after", b"1")):
                await send(message)
            return
        deadline = trio.current_time() + limits.body_timeout
        body_done = False
        started = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            with trio.move_on_at(deadline) as wait:
                message = await receive()
            if wait.cancelled_caught:
                raise _BodyTimeout
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        self.in_flight += 1
        try:
            await self.app(scope, timed_receive, tracked_send)
        except _BodyTimeout:
            if not started:
                reason = f"request body not received within {limits.body_timeout:g} s"
                for message in _json_answer(408, reason):
                    await send(message)
        finally:
            self.in_flight -= 1


def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address *host* resolves to (``localhost``: IPv4 and IPv6),
    at *port*; with port 0, the first address only (each would get another port).

    Raises:
        OSError: an address cannot be bound; socket.gaierror: *host* does not resolve.
    """
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    addresses = list(dict.fromkeys((family, address) for family, _, _, _, address in found))
    sockets: list[socket.socket] = []
    try:
        for family, address in addresses[:1] if port == 0 else addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(1024)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


async def serve_endpoint(
    app: ASGIApp,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    limits: EndpointLimits = EndpointLimits(),  # frozen: one shared default is safe
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve *app* (behind :class:`Bounded`) on hypercorn at *host*:*port* until cancelled;
    ``task_status.started(bound_port)`` once listening.

    Raises:
        OSError: the address cannot be bound (before ``started``).
    """
    from hypercorn.config import Config
    from hypercorn.trio import serve

    sockets = bind(host, port)
    bound: int = sockets[0].getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.detach()}" for sock in sockets]
    config.accesslog = None
    config.errorlog = logging.getLogger("trio_worker.server")
    config.keep_alive_timeout = limits.head_timeout
    config.graceful_timeout = 1.0
    config.include_server_header = False
    async with trio.open_nursery() as nursery:
        # hypercorn's app type is its own TypedDicts; ours is the plain ASGI shape.
        bounded: Any = Bounded(app, limits)
        await nursery.start(
            lambda task_status: serve(bounded, config, task_status=task_status, mode="asgi")
        )
        task_status.started(bound)


def url_of(host: str, port: int) -> str:
    """The base URL of a server on *host*:*port* (an IPv6 literal in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

"""The fake platform's HTTP/1.1 server: ASGI on trio streams, built on h11.

Every server the product runs is hypercorn (the local endpoint, ``start_app``). The fake
platform keeps this one because the property suite needs two things hypercorn cannot give
through its public API (docs/property-suite.md): serving an in-memory trio stream (its
only public entry, ``hypercorn.trio.serve``, binds sockets from its config), and closing
a connection without any answer (``AbortConnection``, the ``Fault(drop=True)`` of the
fault injection; hypercorn answers an app's exception with a 500).

Theory of operation
-------------------
One trio task per connection (:func:`serve_stream`: a socket, or any trio stream). It
reads bytes into an :class:`h11.Connection` and, for each request, builds the ASGI
``http`` scope and calls the app with an :class:`~._exchange.Exchange`'s bound
``receive``/``send``. Everything for one request happens in the connection's own task;
no per-request task or nursery is created, which keeps the per-request cost to a dict,
two bound methods and, usually, one ``send_all`` for the whole response.

Deadlines and caps (:class:`ServerLimits`): the local endpoint is reachable by anything
on the machine, so no peer may hold a connection by sending slowly. A request head must
be complete ``header_timeout`` seconds after its first byte (or after the connection
opened), its body ``body_timeout`` seconds after the head; an idle kept-alive connection
is closed after ``keep_alive_timeout``; past ``max_connections`` open connections a new
one is answered 503 and closed. Each is one deadline for the whole read, not a per-read
timeout, so a byte every second does not extend it (docs/security.md).

Errors: an exception from the app before the response started gives a 500 and the
connection is closed; after the response started, the connection is closed (the client
sees a truncated response, which is the honest signal). :class:`AbortConnection` raised
by the app closes the connection without any response, which tests use to simulate a
dropped connection. Every error answer is JSON with a one-line ``error`` reason.
Cancelling :func:`serve_asgi` cancels every connection task and closes every socket.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote

import h11
import trio

from ._exchange import (
    RECEIVE_SIZE,
    AbortConnection,
    ASGIApp,
    BodyTimeout,
    ClientDisconnected,
    Exchange,
    Scope,
    bytes_out,
)

__all__ = [
    "BODY_TIMEOUT",
    "HEADER_TIMEOUT",
    "KEEP_ALIVE_TIMEOUT",
    "MAX_CONNECTIONS",
    "ServerLimits",
    "serve_asgi",
    "serve_stream",
    "url_of",
]

logger = logging.getLogger(__name__)

#: Seconds a request head may take, from its first byte (or the connection's opening).
HEADER_TIMEOUT: Final = 10.0
#: Seconds a request body may take, from the end of its head. Generous for 20 MB on
#: loopback; what it stops is a body that never ends.
BODY_TIMEOUT: Final = 60.0
#: An idle keep-alive connection is closed after this many seconds, so clients that
#: vanish without a FIN do not pin file descriptors forever.
KEEP_ALIVE_TIMEOUT: Final = 75.0
#: Open connections served at once; more are answered 503 and closed. Far above what a
#: worker (a few long-polls and reports) and a browser (6 per host) open together.
MAX_CONNECTIONS: Final = 256
#: Unread request body the server will still drain to keep a connection reusable.
MAX_DRAIN_BYTES: Final = 1024 * 1024

_ASGI_INFO: Final = {"version": "3.0", "spec_version": "2.3"}


@dataclass(frozen=True)
class ServerLimits:
    """The server's own deadlines (seconds) and connection cap, with named defaults.

    Example::

        limits = ServerLimits(header_timeout=5.0, max_connections=64)
        await nursery.start(partial(serve_asgi, app, limits=limits))
    """

    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT
    max_connections: int = MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if min(self.header_timeout, self.body_timeout, self.keep_alive_timeout) <= 0:
            raise ValueError("server timeouts must be positive")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")


class _Server:
    """Per-server state: the app, the limits and the count of open connections."""

    def __init__(self, app: ASGIApp, limits: ServerLimits) -> None:
        self.app = app
        self.limits = limits
        self.open_connections = 0

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """Serve one connection until it closes; never lets an error escape.

        An escaping exception would crash ``serve_listeners`` and with it every other
        connection, so everything short of cancellation is logged and swallowed here.
        """
        self.open_connections += 1
        try:
            if self.open_connections > self.limits.max_connections:
                await _refuse_connection(stream, self.limits.max_connections)
            else:
                await self._serve(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
            pass
        except Exception:
            logger.exception("HTTP connection handler failed")
        finally:
            self.open_connections -= 1
            await trio.aclose_forcefully(stream)

    async def _serve(self, stream: trio.abc.Stream) -> None:
        conn = h11.Connection(h11.SERVER)
        server = client = None
        if isinstance(stream, trio.SocketStream):  # an in-memory stream has no addresses
            try:
                server = _address(stream.socket.getsockname())
                client = _address(stream.socket.getpeername())
            except OSError:
                return  # already reset by the peer
        limits = self.limits
        # One cancel scope per connection whose deadline is moved, rather than a new
        # scope per request: it only bounds the wait for (and the reading of) the next
        # request head. A new connection owes its first head within header_timeout.
        with trio.CancelScope() as head_scope:
            head_scope.deadline = trio.current_time() + limits.header_timeout
            while True:
                try:
                    event = await self._next_request_event(conn, stream, head_scope)
                except h11.RemoteProtocolError as exc:
                    await _send_error(conn, stream, exc.error_status_hint, str(exc))
                    return
                if type(event) is not h11.Request:
                    return  # ConnectionClosed
                head_scope.deadline = math.inf
                body_deadline = trio.current_time() + limits.body_timeout
                if not await self._run_app(conn, stream, event, server, client, body_deadline):
                    return
                if conn.their_state is h11.SEND_BODY:  # a body the app did not read
                    head_scope.deadline = min(
                        trio.current_time() + limits.keep_alive_timeout, body_deadline
                    )
                    if not await _drain_request_body(conn, stream):
                        return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
                head_scope.deadline = trio.current_time() + limits.keep_alive_timeout
        if head_scope.cancelled_caught and conn.their_state is h11.IDLE and _head_begun(conn):
            reason = f"request head not received within {limits.header_timeout:g} s"
            await _send_error(conn, stream, 408, reason)

    async def _next_request_event(
        self, conn: h11.Connection, stream: trio.abc.Stream, head_scope: trio.CancelScope
    ) -> h11.Event:
        """The next request head; once its first byte is in, it has header_timeout left."""
        begun = _head_begun(conn)
        if begun:
            self._head_deadline(head_scope)
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                assert not isinstance(event, type)  # PAUSED cannot happen in IDLE
                return event
            try:
                data = await stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if data and not begun:
                begun = True
                self._head_deadline(head_scope)
            conn.receive_data(bytes(data))

    def _head_deadline(self, head_scope: trio.CancelScope) -> None:
        deadline = trio.current_time() + self.limits.header_timeout
        if deadline < head_scope.deadline:
            head_scope.deadline = deadline

    async def _run_app(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        request: h11.Request,
        server: tuple[str, int] | None,
        client: tuple[str, int] | None,
        body_deadline: float,
    ) -> bool:
        """Run the app for one request; True if the connection may be reused."""
        exchange = Exchange(conn, stream, request.method, body_deadline)
        scope = _build_scope(request, server, client)
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except (AbortConnection, ClientDisconnected):
            return False
        except BodyTimeout:
            if not exchange.response_started:
                reason = f"request body not received within {self.limits.body_timeout:g} s"
                await _send_error(conn, stream, 408, reason)
            return False
        except Exception:
            if exchange.disconnected:
                return False
            logger.exception("ASGI app raised on %s %s", scope["method"], scope["path"])
            if not exchange.response_started or exchange.response_headers is not None:
                await _send_error(conn, stream, 500, "internal server error")
            return False
        if exchange.disconnected:
            return False
        if not exchange.response_complete:
            if not exchange.response_started or exchange.response_headers is not None:
                logger.error("ASGI app returned without a response to %s", scope["path"])
                await _send_error(conn, stream, 500, "internal server error")
            return False
        return conn.our_state is h11.DONE


def _head_begun(conn: h11.Connection) -> bool:
    """True when bytes of a next request head are already buffered in *conn*."""
    return bool(conn.trailing_data[0])


def _build_scope(
    request: h11.Request, server: tuple[str, int] | None, client: tuple[str, int] | None
) -> Scope:
    target = request.target
    if not target.startswith(b"/"):  # absolute-form (proxies) or "*"
        scheme_end = target.find(b"://")
        if scheme_end >= 0:
            path_start = target.find(b"/", scheme_end + 3)
            target = target[path_start:] if path_start >= 0 else b"/"
    raw_path, _, query_string = target.partition(b"?")
    path = raw_path.decode("latin-1")
    if "%" in path:
        path = unquote(path)
    return {
        "type": "http",
        "asgi": _ASGI_INFO,
        "http_version": request.http_version.decode("ascii"),
        "method": request.method.decode("ascii"),
        "scheme": "http",
        "path": path,
        "raw_path": raw_path,
        "query_string": query_string,
        "root_path": "",
        # h11 already lowercases header names.
        "headers": list(request.headers),
        "client": client,
        "server": server,
    }


def _address(sockname: Any) -> tuple[str, int] | None:
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        return (str(sockname[0]), int(sockname[1]))
    return None


def _error_body(reason: str) -> bytes:
    return json.dumps({"error": reason.replace("\n", " ")}).encode()


async def _send_error(
    conn: h11.Connection, stream: trio.abc.Stream, status: int, reason: str
) -> None:
    """Best effort: answer *status* with a one-line *reason* and mark the connection closing."""
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    body = _error_body(reason)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    try:
        data = bytes_out(conn, h11.Response(status_code=status, headers=headers))
        data += bytes_out(conn, h11.Data(data=body)) + bytes_out(conn, h11.EndOfMessage())
        await stream.send_all(data)
    except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _refuse_connection(stream: trio.abc.Stream, cap: int) -> None:
    """Answer 503 before reading anything, then close: the server is at its cap."""
    body = _error_body(f"too many connections (at most {cap} at once)")
    head = (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
    )
    with trio.move_on_after(1.0):  # a peer that reads nothing does not hold this task
        await stream.send_all(head + body)


async def _drain_request_body(conn: h11.Connection, stream: trio.abc.Stream) -> bool:
    """Discard a request body the app did not read, so the connection stays usable.

    Returns False (close the connection) when the body is larger than
    :data:`MAX_DRAIN_BYTES` or the client leaves.
    """
    drained = 0
    while conn.their_state is h11.SEND_BODY:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            if drained > MAX_DRAIN_BYTES:
                return False
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                return False
            drained += len(data)
            conn.receive_data(bytes(data))
    return True


def _limits(limits: ServerLimits | None, keep_alive_timeout: float | None) -> ServerLimits:
    limits = limits or ServerLimits()
    if keep_alive_timeout is not None:
        limits = ServerLimits(
            limits.header_timeout, limits.body_timeout, keep_alive_timeout, limits.max_connections
        )
    return limits


async def serve_stream(
    app: ASGIApp,
    stream: trio.abc.Stream,
    *,
    limits: ServerLimits | None = None,
    keep_alive_timeout: float | None = None,
) -> None:
    """Serve *app* on one already open connection (any trio stream) until it closes.

    What :func:`serve_asgi` runs per accepted socket; also how the in-memory network of
    :mod:`trio_worker.testing` serves the fake platform. *keep_alive_timeout*, when
    given, replaces the one in *limits*. Never raises but cancellation; closes *stream*
    on the way out.
    """
    await _Server(app, _limits(limits, keep_alive_timeout)).handle_connection(stream)


async def serve_asgi(
    app: ASGIApp,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    limits: ServerLimits | None = None,
    keep_alive_timeout: float | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve *app* over HTTP/1.1 on *host*:*port* until cancelled.

    Calls ``task_status.started(bound_port)`` once listening, so
    ``port = await nursery.start(serve_asgi, app)`` gives the port picked for ``port=0``.
    When *host* resolves to several addresses and *port* is 0, only the first address is
    served, because each would get a different ephemeral port. *keep_alive_timeout*,
    when given, replaces the one in *limits* (default :class:`ServerLimits()`).

    Raises:
        OSError: if the address cannot be bound (before ``started`` is called).
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    try:
        if port == 0 and len(listeners) > 1:
            for extra in listeners[1:]:
                await extra.aclose()
            listeners = listeners[:1]
        bound_port: int = listeners[0].socket.getsockname()[1]
    except BaseException:
        for listener in listeners:
            await trio.aclose_forcefully(listener)
        raise
    server = _Server(app, _limits(limits, keep_alive_timeout))
    async with trio.open_nursery() as nursery:
        # serve_listeners takes ownership of the listeners and closes them on exit.
        await nursery.start(trio.serve_listeners, server.handle_connection, listeners)
        task_status.started(bound_port)


def url_of(host: str, port: int) -> str:
    """The base URL of a server on *host*:*port* (an IPv6 literal in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

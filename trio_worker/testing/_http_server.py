"""A small HTTP/1.1 server for ASGI apps on trio, built on h11.

Why not an existing ASGI server: the project's only runtime dependencies are trio, httpx
and h11 (pyproject.toml), and the two users of this module, the local endpoint
(``--rp_serve_api``) and the fake platform in :mod:`trio_worker.testing`, need only plain
HTTP/1.1 on loopback. Hypercorn would add a dependency tree; uvicorn is asyncio-only.

Theory of operation
-------------------
One trio task per connection (:func:`serve_stream`: a socket, or any trio stream). It
reads bytes into an :class:`h11.Connection` and, for each request, builds the ASGI
``http`` scope and calls the app with a :class:`_Exchange`'s bound ``receive``/``send``.
Everything for one request happens in the connection's own task; no per-request task or
nursery is created, which keeps the per-request cost to a dict, two bound methods and,
usually, one ``send_all`` for the whole response.

``receive()`` first hands out the request body (chunked or Content-Length, decoded by
h11). Once the body is complete, a further ``receive()`` reads the socket itself and
returns ``http.disconnect`` when the client goes away: that is how an app's long-poll
notices a disconnect (it calls ``receive()`` in a task of its own beside its wait). Bytes
that arrive meanwhile (a pipelined request) are fed to h11 and kept for the next cycle.

The response is written lazily: ``http.response.start`` is only remembered, and the
headers go out together with the first body message. When that first body message is
also the last and the app gave no Content-Length, one is added, so a typical JSON
response keeps the connection reusable without chunked framing.

Errors: an exception from the app before the response started gives a 500 and the
connection is closed; after the response started, the connection is closed (the client
sees a truncated response, which is the honest signal). :class:`AbortConnection` raised
by the app closes the connection without any response, which tests use to simulate a
dropped connection. Cancelling :func:`serve_asgi` cancels every connection task and
closes every socket.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final, TypeVar, TypeVarTuple
from urllib.parse import unquote

import h11
import trio

__all__ = [
    "ASGIApp",
    "AbortConnection",
    "ClientDisconnected",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "ServerThread",
    "run_server_in_thread",
    "serve_asgi",
    "serve_stream",
]

# The same shapes as httpx.ASGITransport's, so one app type-checks against both.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

logger = logging.getLogger(__name__)

#: How many bytes one ``receive_some`` asks for.
RECEIVE_SIZE: Final = 64 * 1024
#: An idle keep-alive connection is closed after this many seconds, so clients that
#: vanish without a FIN do not pin file descriptors forever.
KEEP_ALIVE_TIMEOUT: Final = 75.0
#: Unread request body the server will still drain to keep a connection reusable.
MAX_DRAIN_BYTES: Final = 1024 * 1024

_ASGI_INFO: Final = {"version": "3.0", "spec_version": "2.3"}
_NO_BODY_STATUSES: Final = frozenset({204, 304})


class AbortConnection(Exception):
    """Raise from an ASGI app (before it responds) to close the connection unanswered.

    The client then sees exactly what a dead server or a cut link produces ("server
    disconnected without sending a response"), which is what fault-injection tests need.
    """


class ClientDisconnected(OSError):
    """Raised by ``send()`` when the client has gone away (ASGI spec: an OSError)."""


def _bytes_out(conn: h11.Connection, event: h11.Event) -> bytes:
    data = conn.send(event)
    assert data is not None  # only ConnectionClosed returns None, and we never send it
    return data


def _parts_out(conn: h11.Connection, event: h11.Event) -> list[bytes]:
    """Like :func:`_bytes_out` but without joining, so a body is copied only once."""
    parts = conn.send_with_data_passthrough(event)
    assert parts is not None
    return parts


class _Exchange:
    """One request/response cycle: the ASGI ``receive``/``send`` pair for it."""

    __slots__ = (
        "body_done",
        "conn",
        "disconnected",
        "head_request",
        "response_complete",
        "response_headers",
        "response_started",
        "status",
        "stream",
    )

    def __init__(self, conn: h11.Connection, stream: trio.abc.Stream, method: bytes) -> None:
        self.conn = conn
        self.stream = stream
        self.head_request = method == b"HEAD"
        self.body_done = False
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.status = 0
        self.response_headers: list[tuple[bytes, bytes]] | None = None

    async def receive(self) -> Message:
        """The next request-body chunk, then ``http.disconnect`` once the client leaves."""
        if self.disconnected:
            return {"type": "http.disconnect"}
        if not self.body_done:
            return await self._receive_body()
        if self.response_complete:
            return {"type": "http.disconnect"}
        # The body is complete: the only thing left to learn is that the client left.
        try:
            data = await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self.disconnected = True
            return {"type": "http.disconnect"}
        # A pipelined next request: keep it for the next cycle. Reading further would
        # buffer without bound, and the client is evidently still there.
        self.conn.receive_data(bytes(data))
        await trio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _receive_body(self) -> Message:
        conn = self.conn
        if conn.they_are_waiting_for_100_continue:
            await self.stream.send_all(
                _bytes_out(conn, h11.InformationalResponse(status_code=100, headers=[]))
            )
        chunks: list[bytes] = []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if chunks:
                    break  # hand out what we have rather than wait for more
                try:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    # EOF in the middle of a body: h11 would call it a protocol error,
                    # but for the app it is simply a client that went away.
                    self.disconnected = True
                    return {"type": "http.disconnect"}
                conn.receive_data(bytes(data))
            elif type(event) is h11.Data:
                chunks.append(event.data)
            elif type(event) is h11.EndOfMessage:
                self.body_done = True
                break
            else:  # pragma: no cover - h11 yields only Data/EndOfMessage in SEND_BODY
                raise h11.RemoteProtocolError(f"unexpected event {event!r}")
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return {"type": "http.request", "body": body, "more_body": not self.body_done}

    async def send(self, message: Message) -> None:
        """Write the response; headers are deferred until the first body message."""
        kind = message["type"]
        if kind == "http.response.start":
            if self.response_started:
                raise RuntimeError("http.response.start sent twice")
            self.response_started = True
            self.status = int(message["status"])
            self.response_headers = list(message.get("headers", ()))
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unsupported ASGI message type {kind!r}")
        if not self.response_started or self.response_complete:
            raise RuntimeError("http.response.body outside of a response")
        if self.disconnected:
            raise ClientDisconnected("the client has disconnected")
        body: bytes = message.get("body", b"")
        more_body: bool = message.get("more_body", False)
        conn = self.conn
        out: list[bytes] = []
        if self.response_headers is not None:
            headers = self.response_headers
            self.response_headers = None
            if not more_body and self.status not in _NO_BODY_STATUSES:
                if not any(name.lower() == b"content-length" for name, _ in headers):
                    headers.append((b"content-length", str(len(body)).encode()))
            out += _parts_out(conn, h11.Response(status_code=self.status, headers=headers))
        if body and not self.head_request:
            out += _parts_out(conn, h11.Data(data=body))
        if not more_body:
            out += _parts_out(conn, h11.EndOfMessage())
            self.response_complete = True
        if not out:
            return
        try:
            # One send_all (one syscall, one segment) for headers and body together.
            await self.stream.send_all(out[0] if len(out) == 1 else b"".join(out))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.disconnected = True
            raise ClientDisconnected("the client has disconnected") from exc


class _Server:
    """Per-server state: the app and the connection handler."""

    def __init__(self, app: ASGIApp, keep_alive_timeout: float) -> None:
        self.app = app
        self.keep_alive_timeout = keep_alive_timeout

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """Serve one connection until it closes; never lets an error escape.

        An escaping exception would crash ``serve_listeners`` and with it every other
        connection, so everything short of cancellation is logged and swallowed here.
        """
        try:
            await self._serve(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
            pass
        except Exception:
            logger.exception("HTTP connection handler failed")
        finally:
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
        # One cancel scope per connection whose deadline is moved, rather than a new
        # scope per request: it only bounds the wait for the next request.
        with trio.CancelScope() as idle_scope:
            while True:
                idle_scope.deadline = trio.current_time() + self.keep_alive_timeout
                try:
                    event = await self._next_request_event(conn, stream)
                except h11.RemoteProtocolError as exc:
                    await _send_error(conn, stream, exc.error_status_hint)
                    return
                if type(event) is not h11.Request:
                    return  # ConnectionClosed
                idle_scope.deadline = math.inf
                if not await self._run_app(conn, stream, event, server, client):
                    return
                idle_scope.deadline = trio.current_time() + self.keep_alive_timeout
                if not await _drain_request_body(conn, stream):
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()

    @staticmethod
    async def _next_request_event(conn: h11.Connection, stream: trio.abc.Stream) -> h11.Event:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                assert not isinstance(event, type)  # PAUSED cannot happen in IDLE
                return event
            try:
                data = await stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            conn.receive_data(bytes(data))

    async def _run_app(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        request: h11.Request,
        server: tuple[str, int] | None,
        client: tuple[str, int] | None,
    ) -> bool:
        """Run the app for one request; True if the connection may be reused."""
        exchange = _Exchange(conn, stream, request.method)
        scope = _build_scope(request, server, client)
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except AbortConnection:
            return False
        except ClientDisconnected:
            return False
        except Exception:
            if exchange.disconnected:
                return False
            logger.exception("ASGI app raised on %s %s", scope["method"], scope["path"])
            if not exchange.response_started or exchange.response_headers is not None:
                await _send_error(conn, stream, 500)
            return False
        if exchange.disconnected:
            return False
        if not exchange.response_complete:
            if not exchange.response_started or exchange.response_headers is not None:
                logger.error("ASGI app returned without a response to %s", scope["path"])
                await _send_error(conn, stream, 500)
            return False
        return conn.our_state is h11.DONE


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


async def _send_error(conn: h11.Connection, stream: trio.abc.Stream, status: int) -> None:
    """Best effort: answer *status* and mark the connection for closing."""
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    body = f"{status} error\n".encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    try:
        data = _bytes_out(conn, h11.Response(status_code=status, headers=headers))
        data += _bytes_out(conn, h11.Data(data=body)) + _bytes_out(conn, h11.EndOfMessage())
        await stream.send_all(data)
    except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass


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


async def serve_stream(
    app: ASGIApp, stream: trio.abc.Stream, *, keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT
) -> None:
    """Serve *app* on one already open connection (any trio stream) until it closes.

    What :func:`serve_asgi` runs per accepted socket; also how the in-memory network of
    :mod:`trio_worker.testing` serves the fake platform. Never raises but cancellation;
    closes *stream* on the way out.
    """
    await _Server(app, keep_alive_timeout).handle_connection(stream)


async def serve_asgi(
    app: ASGIApp,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve *app* over HTTP/1.1 on *host*:*port* until cancelled.

    Calls ``task_status.started(bound_port)`` once listening, so
    ``port = await nursery.start(serve_asgi, app)`` gives the port picked for ``port=0``.
    When *host* resolves to several addresses and *port* is 0, only the first address is
    served, because each would get a different ephemeral port.

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
    server = _Server(app, keep_alive_timeout)
    async with trio.open_nursery() as nursery:
        # serve_listeners takes ownership of the listeners and closes them on exit.
        await nursery.start(trio.serve_listeners, server.handle_connection, listeners)
        task_status.started(bound_port)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ServerThread:
    """A :func:`serve_asgi` running in its own ``trio.run`` on a daemon thread.

    For sync tests and the benchmark harness, which have no trio loop of their own. The
    app runs on that thread's trio loop, so touch its state only through
    :meth:`run_sync`. Usable as a context manager, which calls :meth:`stop`.
    """

    def __init__(
        self,
        thread: threading.Thread,
        host: str,
        port: int,
        token: trio.lowlevel.TrioToken,
        scope: trio.CancelScope,
    ) -> None:
        self._thread = thread
        self._token = token
        self._scope = scope
        self.host = host
        self.port = port
        self.url = _url(host, port)

    def run_sync(self, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """Call ``fn(*args)`` on the server's trio thread and return its result."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the server, close its sockets and wait for the thread to end.

        Raises:
            TimeoutError: if the thread has not ended after *timeout* seconds.
        """
        try:
            trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        except trio.RunFinishedError:
            pass
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("the server thread did not stop")

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def run_server_in_thread(app: ASGIApp, host: str = "127.0.0.1", port: int = 0) -> ServerThread:
    """Start :func:`serve_asgi` in a daemon thread and return once it is listening.

    Raises:
        RuntimeError: chained from the cause, if the server failed to start.
    """
    ready = threading.Event()
    started: dict[str, Any] = {}

    async def main() -> None:
        with trio.CancelScope() as scope:
            started["scope"] = scope
            started["token"] = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                try:
                    started["port"] = await nursery.start(serve_asgi, app, host, port)
                except OSError as exc:  # caught here, so it is not wrapped in a group
                    started["error"] = exc
                    return
                ready.set()

    def target() -> None:
        try:
            trio.run(main)
        except BaseException as exc:
            started["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=target, name=f"asgi-server-{host}:{port}", daemon=True)
    thread.start()
    ready.wait()
    if "error" in started or "port" not in started:
        thread.join()
        raise RuntimeError("the ASGI server failed to start") from started.get("error")
    return ServerThread(thread, host, started["port"], started["token"], started["scope"])

"""A lean HTTP/1.1 front for the benchmark platform: hot routes without h11 or ASGI.

The stream figure ("64 concurrent streams, no gap") sends one POST per chunk. Served by
``trio_worker.testing._http_server`` (h11, an ASGI scope and a ``receive``/``send`` pair per
request) the platform spent more CPU per chunk than either worker, so the figure measured
the platform. This front parses requests itself and hands each complete one either to a
*fast* handler, which answers with a plain ``(status, headers, body)`` tuple, or, when the
fast handler declines it, to an ordinary ASGI app (the routes that are not hot: take,
done, stop, ping, ``/_bench/*``, ``/_stats``).

Theory of operation
-------------------
One trio task per connection keeps a byte buffer. After every read it answers *every*
complete request in the buffer, in order: answers of the fast handler are collected and
written with one ``send_all`` once the buffer is exhausted, so a client that pipelines
requests (several arrive in one read) gets all their answers in one write, and a client
that sends one request at a time (aiohttp) costs one read and one write per request.
Before an ASGI request runs, the answers collected so far are written, because the app
may long-poll (a take waits for a job) and earlier answers must not wait behind it.

The parser accepts what the workers send and rejects the rest with a 400 and a closed
connection: a request line ``METHOD /target HTTP/1.x``, header fields, and a body framed by
``Content-Length`` only (a ``Transfer-Encoding`` request is refused rather than decoded).
A head longer than :data:`MAX_HEAD` is refused the same way, a body longer than
:data:`MAX_BODY` with a 413. Keep-alive is the HTTP/1.1 default; ``Connection: close`` (or
HTTP/1.0 without ``keep-alive``) closes the connection after its answer, and requests
pipelined behind it are ignored.

The ASGI bridge follows ``_http_server``: the scope is built the same way, ``receive()``
hands out the (already complete) body, then waits for the client to leave so that a
long-poll notices a disconnect, and ``AbortConnection`` closes the connection unanswered.
A response is written once its last body message arrives (no route streams its answer).
"""

from __future__ import annotations

import logging
import math
import re
import socket
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote

import trio

from trio_worker.testing._http_server import AbortConnection, ClientDisconnected

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from trio_worker.testing._http_server import ASGIApp, Message

    #: ``(status, headers, body)``; ``content-length`` is added by the front.
    Answer = tuple[int, list[tuple[bytes, bytes]], bytes]

__all__ = ["MAX_BODY", "MAX_HEAD", "LeanRequest", "serve_lean"]

logger = logging.getLogger(__name__)

RECEIVE_SIZE: Final = 256 * 1024
#: Longest request head (request line and header fields) accepted.
MAX_HEAD: Final = 16 * 1024
#: Largest request body accepted (the endpoint API's own limits are lower).
MAX_BODY: Final = 64 * 1024 * 1024
#: An idle connection is closed after this many seconds, as ``_http_server`` does.
KEEP_ALIVE_TIMEOUT: Final = 75.0

_TOKEN: Final = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
# One C-level pass validates a whole head (decoded as latin-1): the request line, then
# header fields whose names are tokens (so no whitespace before the colon, no obs-fold)
# and whose values hold no control characters. Anything else is a 400.
_HEAD: Final = re.compile(
    r"(" + _TOKEN + r") (/[\x21-\x7e\x80-\xff]*) HTTP/1\.([01])"
    r"(?:\r\n" + _TOKEN + r":[\t\x20-\x7e\x80-\xff]*)*"
)
# The fields of a head _HEAD accepted: name and value, the value without its padding.
_FIELD: Final = re.compile(r"\r\n([^:]+):[ \t]*([^\r]*?)[ \t]*(?=\r\n|\Z)")
_NO_BODY_STATUSES: Final = frozenset({204, 304})
_ASGI_INFO: Final = {"version": "3.0", "spec_version": "2.3"}
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"


class _BadRequest(Exception):
    def __init__(self, status: int = 400) -> None:
        super().__init__(status)
        self.status = status


class LeanRequest:
    """One complete request, as the fast handler sees it.

    The head is decoded as latin-1 (every byte is one character); header names are
    lower-case. ``fields`` is ``headers`` as a dict, the last of a repeated name winning.
    """

    __slots__ = ("body", "fields", "headers", "keep_alive", "method", "path", "query", "version")

    def __init__(
        self,
        method: str,
        path: str,
        query: str,
        version: str,
        headers: list[tuple[str, str]],
        fields: dict[str, str],
        keep_alive: bool,
    ) -> None:
        self.method = method
        self.path = path  # the raw path, still percent-encoded
        self.query = query
        self.version = version
        self.headers = headers
        self.fields = fields
        self.keep_alive = keep_alive
        self.body = b""


class _Head:
    """A parsed head whose body may not have arrived yet."""

    __slots__ = ("body_end", "body_start", "expect_continue", "request")

    def __init__(
        self, request: LeanRequest, body_start: int, body_end: int, expect_continue: bool
    ) -> None:
        self.request = request
        self.body_start = body_start
        self.body_end = body_end
        self.expect_continue = expect_continue


def _parse_head(buf: bytearray, pos: int) -> _Head | None:
    """The head starting at *pos*; None if it has not fully arrived.

    Raises:
        _BadRequest: a malformed or oversized head, or a body framing it does not accept.
    """
    end = buf.find(b"\r\n\r\n", pos, pos + MAX_HEAD + 4)
    if end < 0:
        if len(buf) - pos >= MAX_HEAD + 4:  # the whole window was searched
            raise _BadRequest
        return None
    text = buf[pos:end].decode("latin-1")
    match = _HEAD.fullmatch(text)
    if match is None:
        raise _BadRequest
    method, target, minor = match.groups()
    headers = [(name.lower(), value) for name, value in _FIELD.findall(text, match.end(3))]
    fields = dict(headers)
    if "transfer-encoding" in fields:
        raise _BadRequest  # chunked bodies are not decoded: refused, never misread
    length = 0
    value = fields.get("content-length")
    if value is not None:
        if not (value.isdigit() and value.isascii()):
            raise _BadRequest
        # A repeated name shrinks the dict; only then can two lengths disagree.
        if len(fields) < len(headers) and any(
            name == "content-length" and other != value for name, other in headers
        ):
            raise _BadRequest
        length = int(value)
        if length > MAX_BODY:
            raise _BadRequest(413)
    keep_alive = minor == "1"
    connection = fields.get("connection")
    if connection is not None:
        tokens = {token.strip().lower() for token in connection.split(",")}
        if "close" in tokens:
            keep_alive = False
        elif "keep-alive" in tokens:
            keep_alive = True
    expect_continue = minor == "1" and fields.get("expect", "").lower() == "100-continue"
    path, _, query = target.partition("?")
    request = LeanRequest(method, path, query, "1." + minor, headers, fields, keep_alive)
    return _Head(request, end + 4, end + 4 + length, expect_continue)


_REASONS: Final = {status.value: status.phrase.encode() for status in HTTPStatus}


def format_response(
    status: int, headers: list[tuple[bytes, bytes]], body: bytes, *, close: bool
) -> bytes:
    """The bytes of one response; ``content-length`` added unless the headers give one."""
    out = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))]
    has_length = False
    for name, value in headers:
        if name.lower() == b"content-length":
            has_length = True
        out.append(b"%s: %s\r\n" % (name, value))
    if not has_length and status not in _NO_BODY_STATUSES:
        out.append(b"content-length: %d\r\n" % len(body))
    if close:
        out.append(b"connection: close\r\n")
    out.append(b"\r\n")
    out.append(body)
    return b"".join(out)


def _error(status: int) -> bytes:
    body = f"{status} error\n".encode()
    return format_response(
        status, [(b"content-type", b"text/plain; charset=utf-8")], body, close=True
    )


class _Socket:
    """A non-blocking socket, read and written with trio's I/O waits directly.

    Cheaper than ``trio.SocketStream`` on the hot path: a write that the kernel takes
    whole (every answer here) costs one ``send`` and no trip through the scheduler.
    """

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    async def receive(self) -> bytes:
        """The next bytes (b"" at end of stream)."""
        sock = self.sock
        while True:
            # Wait first, read after: a client sending one request at a time has never
            # sent the next one yet when this is called, and a read that fails costs a
            # syscall and an exception. The wait also yields, which keeps a client that
            # is never idle from starving the other connections.
            await trio.lowlevel.wait_readable(sock)
            try:
                return sock.recv(RECEIVE_SIZE)
            except BlockingIOError:
                pass

    async def send_all(self, data: bytes) -> None:
        sock = self.sock
        try:
            sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        if sent == len(data):
            return
        with memoryview(data) as view:
            while sent < len(view):
                await trio.lowlevel.wait_writable(sock)
                try:
                    sent += sock.send(view[sent:])
                except BlockingIOError:
                    pass

    def close(self) -> None:
        trio.lowlevel.notify_closing(self.sock)
        self.sock.close()


class _Connection:
    """One client connection: its buffer and the loop that answers what it holds."""

    __slots__ = ("app", "buf", "client", "eof", "fast", "idle", "partial", "server", "stream")

    def __init__(
        self,
        stream: _Socket,
        app: ASGIApp,
        fast: Callable[[LeanRequest], Awaitable[Answer | None]],
    ) -> None:
        self.stream = stream
        self.app = app
        self.fast = fast
        self.buf = bytearray()
        self.eof = False
        # The head at the start of the buffer whose body is still arriving, so a large
        # body's head is parsed once rather than after every read.
        self.partial: _Head | None = None
        self.idle = trio.CancelScope()
        self.server = _address(stream.sock.getsockname())
        self.client = _address(stream.sock.getpeername())

    async def run(self) -> None:
        # One cancel scope per connection, its deadline moved forward only when less than
        # half of it is left: an idle connection is closed after 37.5 to 75 s, and a
        # read costs no deadline bookkeeping. Running the app lifts it (a long-poll).
        self.idle.deadline = trio.current_time() + KEEP_ALIVE_TIMEOUT
        with self.idle:
            while await self._fill() and await self._answer_buffered():
                pass

    def _refresh_idle(self) -> None:
        now = trio.current_time()
        if self.idle.deadline - now < KEEP_ALIVE_TIMEOUT / 2:
            self.idle.deadline = now + KEEP_ALIVE_TIMEOUT

    async def _fill(self) -> bool:
        """Read once more into the buffer; False at end of stream."""
        self._refresh_idle()
        data = await self.stream.receive()
        if not data:
            return False
        self.buf += data
        return True

    async def _answer_buffered(self) -> bool:
        """Answer every complete request in the buffer; False to close the connection."""
        buf = self.buf
        pos = 0
        out: list[bytes] = []
        keep = True
        try:
            while pos < len(buf):
                head = self.partial if pos == 0 and self.partial else _parse_head(buf, pos)
                if head is None:
                    break
                if head.body_end > len(buf):
                    if head.expect_continue and self.partial is not head:
                        out.append(_CONTINUE)
                    # Kept for the next read, at the start of the trimmed buffer.
                    self.partial = _Head(
                        head.request,
                        head.body_start - pos,
                        head.body_end - pos,
                        head.expect_continue,
                    )
                    break
                self.partial = None
                request = head.request
                request.body = bytes(buf[head.body_start : head.body_end])
                pos = head.body_end
                try:
                    answer = await self.fast(request)
                except AbortConnection:
                    raise
                except Exception:
                    logger.exception("fast handler raised on %r", request.path)
                    out.append(_error(500))
                    keep = False
                    break
                if answer is not None:
                    status, headers, body = answer
                    out.append(format_response(status, headers, body, close=not request.keep_alive))
                else:
                    if out:
                        await self.stream.send_all(b"".join(out))
                        out = []
                    if not await self._asgi(request, more_buffered=pos < len(buf)):
                        keep = False
                        break
                if not request.keep_alive:
                    keep = False
                    break
        except _BadRequest as exc:
            out.append(_error(exc.status))
            keep = False
        except AbortConnection:
            # An injected drop: the answers before it go out, then the connection closes.
            keep = False
        del buf[:pos]
        if out:
            await self.stream.send_all(out[0] if len(out) == 1 else b"".join(out))
        return keep and not self.eof

    async def _asgi(self, request: LeanRequest, *, more_buffered: bool) -> bool:
        """Run the ASGI app for *request*; True if the connection may be reused."""
        exchange = _Exchange(self, request, more_buffered)
        path = request.path
        scope = {
            "type": "http",
            "asgi": _ASGI_INFO,
            "http_version": request.version,
            "method": request.method,
            "scheme": "http",
            "path": unquote(path) if "%" in path else path,
            "raw_path": path.encode("latin-1"),
            "query_string": request.query.encode("latin-1"),
            "root_path": "",
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers],
            "client": self.client,
            "server": self.server,
        }
        self.idle.deadline = math.inf
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except (AbortConnection, ClientDisconnected):
            return False
        except Exception:
            if exchange.disconnected:
                return False
            logger.exception("ASGI app raised on %s %s", scope["method"], scope["path"])
            if not exchange.complete:
                await self._send_quietly(_error(500))
            return False
        finally:
            self.idle.deadline = trio.current_time() + KEEP_ALIVE_TIMEOUT
        if exchange.disconnected:
            return False
        if not exchange.complete:
            logger.error("ASGI app returned without a response to %s", scope["path"])
            await self._send_quietly(_error(500))
            return False
        return True

    async def _send_quietly(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except OSError:
            pass


class _Exchange:
    """The ASGI ``receive``/``send`` pair of one request passed to the app."""

    __slots__ = (
        "body_sent",
        "complete",
        "conn",
        "disconnected",
        "head_request",
        "keep_alive",
        "more_buffered",
        "parts",
        "request",
        "start",
    )

    def __init__(self, conn: _Connection, request: LeanRequest, more_buffered: bool) -> None:
        self.conn = conn
        self.request = request
        self.more_buffered = more_buffered
        self.head_request = request.method == "HEAD"
        self.keep_alive = request.keep_alive
        self.body_sent = False
        self.complete = False
        self.disconnected = False
        self.start: Message | None = None
        self.parts: list[bytes] = []

    async def receive(self) -> Message:
        """The body, then ``http.disconnect`` once the client leaves."""
        if not self.body_sent:
            self.body_sent = True
            return {"type": "http.request", "body": self.request.body, "more_body": False}
        if self.disconnected or self.complete:
            return {"type": "http.disconnect"}
        conn = self.conn
        if not self.more_buffered:
            try:
                data = await conn.stream.receive()
            except OSError:
                data = b""
            if not data:
                self.disconnected = conn.eof = True
                return {"type": "http.disconnect"}
            # A pipelined next request: kept for after this one. The client is
            # evidently still there, and reading on would buffer without bound.
            conn.buf += data
        await trio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    async def send(self, message: Message) -> None:
        """Collect the response; write it in one piece when its last body part arrives."""
        kind = message["type"]
        if kind == "http.response.start":
            if self.start is not None:
                raise RuntimeError("http.response.start sent twice")
            self.start = message
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unsupported ASGI message type {kind!r}")
        if self.start is None or self.complete:
            raise RuntimeError("http.response.body outside of a response")
        if self.disconnected:
            raise ClientDisconnected("the client has disconnected")
        self.parts.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        status = int(self.start["status"])
        headers: list[tuple[bytes, bytes]] = list(self.start.get("headers", ()))
        body = b"".join(self.parts)
        data = format_response(status, headers, body, close=not self.keep_alive)
        if self.head_request or status in _NO_BODY_STATUSES:
            data = data[: len(data) - len(body)]
        try:
            await self.conn.stream.send_all(data)
        except OSError as exc:
            self.disconnected = True
            raise ClientDisconnected("the client has disconnected") from exc
        self.complete = True


def _address(sockname: Any) -> tuple[str, int] | None:
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        return (str(sockname[0]), int(sockname[1]))
    return None


async def serve_lean(
    app: ASGIApp,
    fast: Callable[[LeanRequest], Awaitable[Answer | None]],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve on *host*:*port* until cancelled: *fast* first, *app* for what it declines.

    ``fast(request)`` returns an answer, or None to pass the request to *app*; it may
    raise ``AbortConnection`` to close the connection unanswered. Calls
    ``task_status.started(bound_port)`` once listening (the first address *host*
    resolves to).

    Raises:
        OSError: if the address cannot be bound (before ``started`` is called).
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(socket.SOMAXCONN)
        listener.setblocking(False)
        async with trio.open_nursery() as nursery:
            task_status.started(listener.getsockname()[1])
            while True:
                await trio.lowlevel.wait_readable(listener)
                try:
                    sock, _ = listener.accept()
                except (BlockingIOError, ConnectionAbortedError):
                    continue
                except OSError:
                    # Out of descriptors, say: wait rather than spin, and keep serving.
                    logger.exception("accept failed")
                    await trio.sleep(0.1)
                    continue
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                nursery.start_soon(_handle, _Socket(sock), app, fast)
    finally:
        trio.lowlevel.notify_closing(listener)
        listener.close()


async def _handle(
    stream: _Socket, app: ASGIApp, fast: Callable[[LeanRequest], Awaitable[Answer | None]]
) -> None:
    """Serve one connection; nothing but cancellation escapes (it would end the server)."""
    try:
        await _Connection(stream, app, fast).run()
    except OSError:
        pass  # the client went away (getpeername fails once it has reset)
    except Exception:
        logger.exception("lean HTTP connection failed")
    finally:
        stream.close()

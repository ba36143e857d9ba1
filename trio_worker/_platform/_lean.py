"""The lean HTTP/1.1 client: requests built by hand, answers parsed by h11.

See :mod:`._http` for why the worker has a client of its own. Requests are built as one
bytes object (the hot path); every answer goes through an ``h11.Connection`` per connection,
so what RFC 9112 says a client must reject is rejected: chunk sizes like ``0x10``, bytes
after chunk data, conflicting Content-Lengths, ``Transfer-Encoding: gzip, chunked``, a
``Content-Length`` of ``²``. A connection goes back to the pool only when h11 says both
sides are done and may start again (``Connection: close`` anywhere in the list, HTTP/1.0,
a body delimited by the close all end it). Every h11 error and every failure of the
stream is a :class:`~trio_worker.TransportError` naming the server and what was wrong.

Bounds: a response head (interim answers included) of at most 64 KiB and 128 fields, and
at most ``max_body`` bytes of body per request (docs/protocol.md §2.0).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias
from urllib.parse import quote, urlsplit

import h11
import trio

from .._config import DEFAULT_CONNECT_TIMEOUT, LIMITS, MAX_ANSWER_BYTES
from .._exceptions import AnswerTooLarge, ConfigurationError, TransportError
from ._answer import MAX_HEADER_BYTES, MAX_HEADER_COUNT, NOT_SIMPLE, parse_simple_answer
from ._tls import open_tls_stream, trust_context

if TYPE_CHECKING:
    import ssl
    from collections.abc import Mapping

RECEIVE_SIZE = 65536
# Fast reads of one answer before its bytes go to h11: each re-reads the head from its
# start, so an answer dripping in small pieces must not be parsed over and over.
FAST_READS = 4


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes


#: ``(host, port, tls) -> stream``: how the lean client gets a connection.
StreamOpener: TypeAlias = Callable[[str, int, bool], Awaitable[trio.abc.Stream]]


def _size(count: int) -> str:
    for unit, name in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if count >= unit and count % unit == 0:
            return f"{count // unit} {name}"
    return f"{count} bytes"


def check_size(
    size: int,
    max_body: int,
    method: str,
    url: str,
    status: int = 0,
    parts: Sequence[bytes | bytearray] = (),
) -> None:
    """Raises :class:`AnswerTooLarge` when *size* is over *max_body*, with the first bytes
    read (*parts*): the ids at the head of a refused take answer are still failed."""
    if size > max_body:
        where = url.partition("?")[0]  # the query is nobody's business in a log line
        kept, room = [], LIMITS.answer_head  # not a copy of the whole answer: its head
        for part in parts:
            if room <= 0:
                break
            kept.append(part[:room])
            room -= len(part)
        head = b"".join(kept)
        raise AnswerTooLarge(
            f"{method} {where}: answer over {_size(max_body)}, not read",
            status=status,
            size=size,
            head=head,
        )


# What may not appear in a request target as is: it is percent-encoded instead.
_UNSAFE_TARGET = re.compile(r"[^\x21-\x7e]")
_TARGET_SAFE = "/?#[]@!$&'()*+,;=:%~-._"
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE_BAD = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _static_block(headers: Mapping[str, str]) -> str:
    """The fixed header lines, checked once (:func:`check_headers`)."""
    check_headers(headers)
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items())


def check_headers(headers: Mapping[str, str]) -> None:
    """Refuse fixed headers that cannot be sent: a value with a line break would forge
    headers, and httpx would put the value itself (the API key) in its error message.

    Raises:
        ConfigurationError: naming the header, never its value (it may be the API key).
    """
    for name, value in headers.items():
        if not _HEADER_NAME.fullmatch(name):
            raise ConfigurationError(f"{name!r} is not a valid HTTP header name")
        if _HEADER_VALUE_BAD.search(value) or not _latin1(value):
            raise ConfigurationError(
                f"the {name} header's value holds a control character or a character "
                "outside latin-1, and cannot be sent"
            )


def _latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


@dataclass
class _Connection:
    stream: trio.abc.Stream
    protocol: h11.Connection
    reused: bool = False
    received: int = 0  # bytes of the current answer so far
    closed: bool = False  # the server closed its side during the current answer
    head: bool = False  # the current answer's final head arrived
    # Whether any byte of the current request's answer arrived: only a connection that
    # answered nothing at all may be called stale and the request sent again.
    answered: bool = False

    @property
    def stale(self) -> bool:
        return self.reused and not self.answered

    async def next_event(self) -> object:
        """h11's next event, reading from the stream as long as it needs more."""
        while True:
            event = self.protocol.next_event()
            if event is not h11.NEED_DATA:
                return event
            await self.receive()

    async def receive(self) -> None:
        """Hand h11 the next bytes of the stream (b"": the server closed its side)."""
        data = await self.stream.receive_some(RECEIVE_SIZE)
        if data:
            self.answered = True
            self.received += len(data)
        elif self.stale:
            raise _StaleConnection
        else:
            self.closed = True
        # h11 is typed for bytes; memory streams may hand out a bytearray.
        self.protocol.receive_data(data if type(data) is bytes else bytes(data))


@dataclass(frozen=True)
class _Origin:
    scheme: str
    host: str
    port: int

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"


class _StaleConnection(Exception):
    """A kept-alive connection the server had already closed; retry on a fresh one."""


# h11 is told only what shapes the answer: the method (a HEAD answer has no body) and
# that the request ended. The bytes on the wire are built by hand (faster); what h11 would
# have written is discarded, so its events are prebuilt once per method.
_END = h11.EndOfMessage()
_H11_REQUESTS: dict[str, h11.Request] = {}


def _h11_request(method: str) -> h11.Request:
    event = _H11_REQUESTS.get(method)
    if event is None:
        event = h11.Request(method=method, target="/", headers=[("Host", "-")])
        if len(_H11_REQUESTS) < 16:
            _H11_REQUESTS[method] = event
    return event


def _head_too_large(origin: _Origin) -> TransportError:
    return TransportError(
        f"answer from {origin.where}: response head too large (over {_size(MAX_HEADER_BYTES)})"
    )


@contextlib.contextmanager
def _failures_mapped(connection: _Connection, origin: _Origin) -> Iterator[None]:
    """A failed stream, or h11's verdict on an answer, as the package's own error; a stale
    kept-alive connection as :class:`_StaleConnection` (the request goes again)."""
    try:
        yield
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        if connection.stale:
            raise _StaleConnection from exc
        raise TransportError(f"connection lost with {origin.where}: {exc!r}") from exc
    except h11.ProtocolError as exc:
        raise _protocol_failure(origin, exc, connection) from exc


def _protocol_failure(
    origin: _Origin, exc: h11.ProtocolError, connection: _Connection
) -> TransportError:
    if exc.error_status_hint == 431:  # h11's "Receive buffer too long"
        return _head_too_large(origin)
    if connection.closed and not connection.head:
        return TransportError(f"{origin.where} closed the connection before answering in full")
    text = str(exc)
    text = text if len(text) <= 200 else text[:200] + "..."
    if connection.closed:
        return TransportError(f"{origin.where} closed the connection early: {text}")
    return TransportError(f"malformed answer from {origin.where}: {text}")


class LeanHttp:
    """A small keep-alive HTTP/1.1 client on trio streams, parsing answers with h11.

    Not a general client: no redirects, no cookies, no compression, no proxies. A request
    cancelled mid-flight closes its connection (never returned to the pool half-read), so
    cancellation can never leak a pool slot (the failure mode of encode/httpcore#1093).
    """

    def __init__(
        self,
        headers: Mapping[str, str],
        *,
        open_stream: StreamOpener | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._static = _static_block(headers)
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._ssl = ssl_context
        self._origins: dict[str, _Origin] = {}
        self._open_stream = self._open_network if open_stream is None else open_stream
        self._connect_timeout = connect_timeout

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        await _close_all([c.stream for connections in idle.values() for c in connections])

    def _origin(self, scheme_netloc: str, url: str) -> _Origin:
        origin = self._origins.get(scheme_netloc)
        if origin is not None:
            return origin
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransportError(f"cannot request {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise TransportError(f"cannot request {url!r}: {exc}") from None
        origin = _Origin(parts.scheme, parts.hostname, port)
        if len(self._origins) < 64:
            self._origins[scheme_netloc] = origin
        return origin

    def _prefix(self, method: str, url: str) -> tuple[_Origin, bytes]:
        # Every job has its own done URL, so the split is done by hand on the hot path
        # and only the origin (scheme, host, port) is parsed properly, once.
        scheme, sep, rest = url.partition("://")
        if not sep:
            raise TransportError(f"cannot request {url!r}")
        netloc, slash, target = rest.partition("/")
        for stop in "?#":
            if stop in netloc:  # http://host?query: no path at all
                netloc, _, tail = netloc.partition(stop)
                target, slash = stop + tail + slash + target, ""
        origin = self._origin(f"{scheme}://{netloc}", url)
        target = (slash + target).partition("#")[0]
        if not target.startswith("/"):
            target = "/" + target
        if _UNSAFE_TARGET.search(target):
            # A space, a control or a non-ASCII character (from a template: job ids come
            # encoded) would break the request line: sent percent-encoded as UTF-8.
            target = quote(target, safe=_TARGET_SAFE, errors="surrogatepass")
        head = f"{method} {target} HTTP/1.1\r\nHost: {origin.host_header}\r\n{self._static}"
        try:
            return origin, head.encode("latin-1")
        except UnicodeEncodeError as exc:
            raise TransportError(f"cannot send {url!r} in an HTTP head: {exc}") from None

    async def request(
        self, method: str, url: str, body: bytes = b"", *, max_body: int = MAX_ANSWER_BYTES
    ) -> HttpResponse:
        origin, head = self._prefix(method, url)
        message = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
        answers: list[HttpResponse] = []

        async def exchange(connection: _Connection) -> bool:
            answers.append(await self._exchange(connection, origin, method, message, max_body))
            return self._reusable(connection.protocol)

        await self._on_a_connection(origin, exchange)
        return answers[0]

    async def pipeline(
        self,
        method: str,
        requests: list[tuple[str, bytes]],
        answers: list[HttpResponse],
        *,
        max_body: int = MAX_ANSWER_BYTES,
    ) -> None:
        """Send every ``(url, body)`` request at once on one connection (HTTP/1.1
        pipelining), then read the answers in order, appending each to *answers* as it is
        read. The URLs may differ (the stream routes of several jobs) but must share one
        origin.

        *answers* is the caller's, so a caller whose deadline cut the reading still knows
        which requests were answered: the rest may or may not have been processed, as for
        a single request whose answer never came. A failure after some answers raises
        :class:`TransportError` with *answers* holding those; the connection is then closed.
        """
        if not requests:
            return
        # One job's batch repeats its URL: each distinct URL is split and checked once.
        heads = {url: self._prefix(method, url) for url, _ in requests}
        origin = heads[requests[0][0]][0]
        for other, _ in heads.values():
            if other != origin:
                raise TransportError(
                    f"cannot pipeline requests to {origin.where} and {other.where} "
                    "on one connection"
                )
        message = b"".join(
            heads[url][1] + b"Content-Length: %d\r\n\r\n" % len(body) + body
            for url, body in requests
        )

        async def exchange(connection: _Connection) -> bool:
            return await self._pipelined_exchange(
                connection, origin, method, message, len(requests), answers, max_body
            )

        await self._on_a_connection(origin, exchange)

    async def _on_a_connection(
        self, origin: _Origin, exchange: Callable[[_Connection], Awaitable[bool]]
    ) -> None:
        """Run *exchange* on an idle or a new connection to *origin*; it says whether the
        connection may carry the next request (then it goes back to the pool)."""
        while True:
            connection = await self._connection(origin)
            try:
                reusable = await exchange(connection)
            # aclose_forcefully closes the stream even when cancelled (it only raises
            # afterwards), so no connection outlives a cancelled or failed request and
            # none needs a shield.
            except _StaleConnection:
                # The server closed it while it sat idle; nothing was processed, so the
                # request goes again on a fresh connection.
                await trio.aclose_forcefully(connection.stream)
                continue
            except BaseException:
                await trio.aclose_forcefully(connection.stream)
                raise
            if reusable:
                connection.reused = True
                self._idle.setdefault(origin, []).append(connection)
            else:
                # A cancellation pending here loses the answer, as it would have one
                # checkpoint earlier while its last bytes were read.
                await trio.aclose_forcefully(connection.stream)
            return

    async def _pipelined_exchange(
        self,
        connection: _Connection,
        origin: _Origin,
        method: str,
        message: bytes,
        count: int,
        answers: list[HttpResponse],
        max_body: int,
    ) -> bool:
        """Send *message* (*count* requests), read their answers into *answers*; whether
        the connection may carry the next request.

        Answers of the plain common shape are read by :func:`parse_simple_answer` (a few
        microseconds each, against h11's 25); from the first one that is not, or that drips
        in, h11 reads the rest from the same bytes, so h11's verdict stands on everything
        the fast path does not accept.
        """
        # Only the first answer can find the connection stale: once a byte has come, a
        # close is a lost connection, never a reason to send the whole batch again.
        connection.answered = False
        with _failures_mapped(connection, origin):
            await connection.stream.send_all(message)
            index, rest = await self._read_simple_answers(
                connection, origin, method, count, answers, max_body
            )
            if index == count:
                # Nothing past the last answer, and h11's state untouched (idle).
                return not rest
            connection.protocol.receive_data(rest)
            await self._read_answers_with_h11(
                connection, origin, method, index, count, answers, max_body
            )
        return self._reusable(connection.protocol)

    async def _read_simple_answers(
        self,
        connection: _Connection,
        origin: _Origin,
        method: str,
        count: int,
        answers: list[HttpResponse],
        max_body: int,
    ) -> tuple[int, bytes]:
        """Read answers by the fast path while they are simple; how many were read, and
        the bytes received past them (for h11 when not all were)."""
        if method in ("HEAD", "CONNECT"):
            return 0, b""  # h11 frames their bodies by the method
        buffer = bytearray()
        position = index = reads = 0
        while index < count:
            answer = parse_simple_answer(buffer, position, max_body)
            if answer is NOT_SIMPLE or (answer is None and reads == FAST_READS):
                break
            if answer is not None:
                answers.append(HttpResponse(answer.status, answer.headers, answer.body))
                position, index, reads = answer.end, index + 1, 0
                continue
            data = await connection.stream.receive_some(RECEIVE_SIZE)
            if not data:
                if connection.stale:
                    raise _StaleConnection
                if position < len(buffer):
                    raise TransportError(
                        f"{origin.where} closed the connection before answering in full"
                    )
                raise TransportError(
                    f"{origin.where} closed the connection after {index} of {count} "
                    "pipelined requests"
                )
            connection.answered = True
            buffer += data
            reads += 1
        return index, bytes(buffer[position:])

    async def _read_answers_with_h11(
        self,
        connection: _Connection,
        origin: _Origin,
        method: str,
        first: int,
        count: int,
        answers: list[HttpResponse],
        max_body: int,
    ) -> None:
        """Read answers *first* to *count* with h11, which holds the bytes received so far
        (and has seen no request yet on this connection's current cycle)."""
        protocol = connection.protocol
        for index in range(first, count):
            if index > first:
                if protocol.our_state is not h11.DONE or protocol.their_state is not h11.DONE:
                    # Connection: close (or HTTP/1.0) on the last answer: the server
                    # takes no further request on this connection.
                    raise TransportError(
                        f"{origin.where} closed the connection after {index} of "
                        f"{count} pipelined requests"
                    )
                # Unlike _reusable, bytes past the answer are expected here: they are
                # the next answers.
                protocol.start_next_cycle()
            connection.head = connection.closed = False
            # The bounds on an answer's head count this answer's bytes only.
            connection.received = len(protocol.trailing_data[0])
            protocol.send(_h11_request(method))
            protocol.send(_END)
            head = await self._read_head(connection, origin)
            answers.append(await self._read_body(connection, method, head, max_body, origin))

    @staticmethod
    def _reusable(protocol: h11.Connection) -> bool:
        """Only when h11 says both sides may go on, and nothing unasked-for was received."""
        if protocol.our_state is not h11.DONE or protocol.their_state is not h11.DONE:
            return False  # Connection: close, HTTP/1.0, a body delimited by the close
        extra, closed = protocol.trailing_data
        if extra or closed:
            # Bytes past the answer (the stream is out of step), or the server's close
            # (which h11 reports only on the next read).
            return False
        protocol.start_next_cycle()
        return True

    async def _connection(self, origin: _Origin) -> _Connection:
        idle = self._idle.get(origin)
        if idle:
            return idle.pop()
        with trio.move_on_after(self._connect_timeout) as scope:
            try:
                stream = await self._open_stream(origin.host, origin.port, origin.scheme == "https")
            except (OSError, trio.BrokenResourceError) as exc:
                raise TransportError(f"cannot connect to {origin.where}: {exc}") from exc
        if scope.cancelled_caught:
            raise TransportError(f"cannot connect to {origin.where}: timed out")
        protocol = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)
        return _Connection(stream, protocol)

    async def _open_network(self, host: str, port: int, tls: bool) -> trio.abc.Stream:
        if not tls:
            return await trio.open_tcp_stream(host, port)
        if self._ssl is None:
            self._ssl = trust_context()
        return await open_tls_stream(host, port, self._ssl)

    async def _exchange(
        self,
        connection: _Connection,
        origin: _Origin,
        method: str,
        message: bytes,
        max_body: int,
    ) -> HttpResponse:
        connection.answered = False
        connection.received = 0
        connection.closed = connection.head = False
        with _failures_mapped(connection, origin):
            connection.protocol.send(_h11_request(method))
            connection.protocol.send(_END)
            await connection.stream.send_all(message)
            # Nothing of this answer can be in h11's buffer yet (a connection is pooled
            # only when none was left over): read before asking h11 for an event.
            await connection.receive()
            response = await self._read_head(connection, origin)
            return await self._read_body(connection, method, response, max_body, origin)

    async def _read_head(self, connection: _Connection, origin: _Origin) -> h11.Response:
        while True:
            event = await connection.next_event()
            # h11 bounds a head still incomplete; one that arrived whole in a large read,
            # or an endless run of interim answers, is measured here, so the bound holds
            # for all the heads together however the bytes were split.
            if connection.received > MAX_HEADER_BYTES:
                head_size = connection.received - len(connection.protocol.trailing_data[0])
                if head_size > MAX_HEADER_BYTES:
                    raise _head_too_large(origin)
            if isinstance(event, h11.Response):
                connection.head = True
                break
            if not isinstance(event, h11.InformationalResponse):  # 1xx: skipped
                raise TransportError(f"unexpected answer from {origin.where}: {event!r}")
        if len(event.headers) > MAX_HEADER_COUNT:
            raise TransportError(
                f"answer from {origin.where} has {len(event.headers)} header fields, "
                f"over {MAX_HEADER_COUNT}"
            )
        return event

    async def _read_body(
        self,
        connection: _Connection,
        method: str,
        head: h11.Response,
        max_body: int,
        origin: _Origin,
    ) -> HttpResponse:
        # Names come lower-cased from h11; latin-1 decodes any byte.
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in head.headers}
        url = f"{origin.scheme}://{origin.where}"
        declared = headers.get("content-length")
        if declared is not None and method != "HEAD" and head.status_code not in (204, 304):
            # h11 checked the digits. Refused: only the bytes already here are kept.
            size = int(declared)
            if size > max_body:
                arrived = _arrived_body(connection.protocol)
                check_size(size, max_body, method, url, head.status_code, arrived)
        parts: list[bytes | bytearray] = []
        size = 0
        while True:
            event = await connection.next_event()
            if type(event) is h11.Data:
                size += len(event.data)
                parts.append(event.data)
                check_size(size, max_body, method, url, head.status_code, parts)
            elif type(event) is h11.EndOfMessage:
                return HttpResponse(head.status_code, headers, b"".join(parts))
            else:
                raise TransportError(f"unexpected answer from {origin.where}: {event!r}")


def _arrived_body(protocol: h11.Connection) -> list[bytes | bytearray]:
    """The body bytes h11 holds already, up to ``Limits.answer_head``, read without waiting:
    the head of an answer refused for its declared size (docs/security.md)."""
    parts: list[bytes | bytearray] = []
    size = 0
    while size < LIMITS.answer_head:
        event = protocol.next_event()
        if type(event) is not h11.Data:
            break
        parts.append(event.data)
        size += len(event.data)
    return parts


async def _close_all(streams: list[trio.abc.Stream]) -> None:
    """Close every stream, even when cancelled part-way: each close still happens, and
    the cancellation is raised once they all have."""
    for index, stream in enumerate(streams):
        try:
            await trio.aclose_forcefully(stream)
        except BaseException:
            await _close_all(streams[index + 1 :])
            raise

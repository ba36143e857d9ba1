"""One kept-alive HTTP/1.1 connection of the worker's client, and the one answer parser.

A connection is in one of three phases:

- ``IDLE``: in the pool, no request on it. It is taken for a request only when it is
  *quiet*: no byte waits on its socket (:attr:`Connection.is_quiet`, the pool's
  :class:`~._http.QuietProbe`: the check httpcore makes before reusing a connection). A
  byte on an idle connection is an answer nobody asked for, or the server's close: the
  connection is closed, never read.
- ``EXCHANGING``: one request, or one pipelined round, written, its answers being read.
- ``CLOSED``: closed by us (after a failure, a cancellation, an answer that ended it, or
  anything unasked-for); never used again.

Answers are parsed by h11 and by nothing else, a single request's as a pipelined round's,
so h11's verdict (RFC 9112's rejections) stands on every answer. On top of it, this module
keeps the client's bounds: a response head (interim answers included) of at most 64 KiB
and 128 fields, at most ``max_body`` bytes of body per answer, of which only the first
``keep`` are kept. Nothing unasked-for is ever read as an answer (docs/protocol.md §2.0):
bytes past the last answer expected, or a 204 or 304 that declares a body, close the
connection after the exchange. A connection that carried earlier requests and answers
nothing to a new one is *stale* (the server closed it while idle): the request goes again
on a fresh connection (:class:`StaleConnection`), because nothing of it was processed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import h11
import trio

from .._config import LIMITS, MAX_ANSWER_BYTES
from .._exceptions import TransportError
from ._request import head_too_large, too_large

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._request import Origin

RECEIVE_SIZE: Final = 65536
MAX_HEADER_BYTES: Final = 64 * 1024  # one response head, interim answers included
MAX_HEADER_COUNT: Final = 128  # header fields in one response head

# h11 is told only what shapes the answer: the method (a HEAD answer has no body) and that
# the request ended. The bytes on the wire are built by the pool (faster); what h11 would
# have written is discarded, so its events are prebuilt once per method.
_END = h11.EndOfMessage()
_H11_REQUESTS: dict[str, h11.Request] = {}


class Phase(enum.Enum):
    IDLE = "idle"
    EXCHANGING = "exchanging"
    CLOSED = "closed"


class StaleConnection(Exception):
    """A kept-alive connection the server had already closed; retry on a fresh one."""


class PipeliningUnsupported(TransportError):
    """The platform cannot take pipelined requests on this client: it answers in HTTP/1.0
    or delimits answers by closing, or it is reached through a proxy. Raised before the
    requests it leaves unanswered are sent, so none of them can be processed unawares."""


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    headers: dict[str, str]  # lower-cased names, latin-1 decoded; a repeated name: the last
    body: bytes


class HttpBackend(Protocol):
    async def exchange(
        self,
        method: str,
        requests: Sequence[tuple[str, bytes]],
        answers: list[HttpResponse] | None = None,
        *,
        max_body: int = MAX_ANSWER_BYTES,
        keep_body: int | None = None,
    ) -> list[HttpResponse]:
        """See :meth:`HttpPool.exchange`."""
        ...

    async def aclose(self) -> None: ...


class Connection:
    """One connection: its phase, its h11 state, and the reading of its answers."""

    def __init__(
        self, stream: trio.abc.Stream, origin: Origin, is_quiet: Callable[[], bool]
    ) -> None:
        """*is_quiet*: whether no byte (nor the server's close) waits on its socket."""
        self.stream = stream
        self.origin = origin
        self.is_quiet = is_quiet
        self.protocol = _new_protocol()
        self.phase = Phase.IDLE
        self.exchanges = 0  # requests (or pipelined rounds) written on it, the current included
        self.answered = False  # a byte of the current exchange's answers arrived
        # Why its server is no persistent HTTP/1.1 one (HTTP/1.0, or an answer delimited by
        # the close), once an answer showed it: its origin is never pipelined to again.
        self.not_persistent: str | None = None
        self.idle_since = 0.0  # trio time it last went back to the pool
        # The answer being read: its bytes so far (the head's bound counts these), whether
        # its final head arrived, whether the server closed its side during it.
        self._received = 0
        self._head = False
        self._eof = False
        self._read = self._count = 0  # answers of the exchange under way: read, due

    def __repr__(self) -> str:
        detail = ""
        if self.phase is Phase.EXCHANGING:
            detail = (
                f", {self._read} answer(s) read, {self._count - self._read} due, "
                f"reading {'a body' if self._head else 'a head'}"
                f"{', closed by the server' if self._eof else ''}"
            )
        return (
            f"<Connection to {self.origin.where} {self.phase.value}, "
            f"{self.exchanges} exchange(s){detail}>"
        )

    @property
    def stale(self) -> bool:
        return self.exchanges > 1 and not self.answered

    async def aclose(self) -> None:
        """Close it; the stream is closed even when cancelled (raised afterwards)."""
        self.phase = Phase.CLOSED
        await trio.aclose_forcefully(self.stream)

    async def exchange(
        self,
        wire: bytes,
        method: str,
        requests: Sequence[tuple[str, bytes]],
        answers: list[HttpResponse],
        max_body: int,
        keep: int,
    ) -> bool:
        """Write *wire* (the *requests*, ``(url, body)`` each) and read their answers into
        *answers*, each as it comes; whether the connection may carry the next request.
        Of each body the first *keep* bytes are kept, the rest read and dropped.

        Raises:
            TransportError: for an answer h11 rejects, one over the bounds, or a
                connection lost part-way (*answers* then holds those read before).
            StaleConnection: when a reused connection answered nothing at all.
        """
        self.phase = Phase.EXCHANGING
        self.exchanges += 1
        self.answered = False
        self._read, self._count = 0, len(requests)
        try:
            await self.stream.send_all(wire)
            clean = await self._read_answers(method, requests, answers, max_body, keep)
        except (
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            OSError,
            h11.ProtocolError,
        ) as exc:
            raise self._failure(exc) from exc
        # A server that is no persistent HTTP/1.1 one gets one request per connection.
        return clean and self._end_exchange() and self.not_persistent is None

    # -- reading the answers ----------------------------------------------------------------

    async def _read_answers(
        self,
        method: str,
        requests: Sequence[tuple[str, bytes]],
        answers: list[HttpResponse],
        max_body: int,
        keep: int,
    ) -> bool:
        """Read the answers to *requests*; whether nothing unasked-for came with them."""
        where, count = self.origin.where, len(requests)
        clean = True
        keeps_alive = False  # the last answer was HTTP/1.0 with Connection: keep-alive
        request = _h11_request(method)
        for index in range(count):
            protocol = self.protocol
            if protocol.our_state is not h11.IDLE:  # not the first on this h11 connection
                if protocol.our_state is h11.DONE and protocol.their_state is h11.DONE:
                    # Unlike at the end of an exchange, bytes past the answer are expected
                    # here: they are the next answers.
                    protocol.start_next_cycle()
                elif keeps_alive:
                    # h11 closes after any HTTP/1.0 answer; this server said it goes on,
                    # and the requests behind were written: their answers are read, not
                    # taken for lost and sent again (it has processed them). A fresh h11
                    # takes what follows the answer.
                    self.protocol = protocol = _fresh_protocol(protocol.trailing_data)
                else:
                    # Connection: close (or HTTP/1.0) on the last answer: the server takes
                    # no further request on this connection.
                    raise TransportError(
                        f"{where} closed the connection after {index} of {count} pipelined requests"
                    )
            # The bounds on an answer's head count this answer's bytes only.
            self._received, self._head, self._eof = len(protocol.trailing_data[0]), False, False
            protocol.send(request)
            protocol.send(_END)
            head = await self._read_head()
            keeps_alive = self._note_persistence(method, head)
            label = f"{method} {requests[index][0]}"
            answer = await self._read_body(method, label, head, max_body, keep)
            answers.append(answer)
            self._read += 1
            if (
                answer.status in (204, 304)
                and index + 1 < count
                and _declares_body(answer.headers)
                and await self._skip_declared_body(answer.headers)
            ):
                clean = False
        # A 204 or 304 last in the exchange that carries a body leaves its bytes behind it:
        # _end_exchange sees them if they came with the answer, the quiet check if later.
        return clean

    async def _next_event(self) -> object:
        """h11's next event, reading from the stream as long as it needs more."""
        while True:
            event = self.protocol.next_event()
            if event is not h11.NEED_DATA:
                return event
            await self._receive()

    async def _receive(self) -> None:
        """Hand h11 the next bytes of the stream (b"": the server closed its side)."""
        data = await self.stream.receive_some(RECEIVE_SIZE)
        if data:
            self.answered = True
            self._received += len(data)
        elif self.stale:
            raise StaleConnection
        else:
            self._eof = True
        # h11 is typed for bytes; memory streams may hand out a bytearray.
        self.protocol.receive_data(data if type(data) is bytes else bytes(data))

    async def _read_head(self) -> h11.Response:
        origin = self.origin
        while True:
            event = await self._next_event()
            # h11 bounds a head still incomplete; one that arrived whole in a large read,
            # or an endless run of interim answers, is measured here, so the bound holds
            # for all the heads together however the bytes were split.
            received = self._received
            if received > MAX_HEADER_BYTES:
                if received - len(self.protocol.trailing_data[0]) > MAX_HEADER_BYTES:
                    raise head_too_large(origin, MAX_HEADER_BYTES)
            if isinstance(event, h11.Response):
                self._head = True
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
        self, method: str, label: str, head: h11.Response, max_body: int, keep: int
    ) -> HttpResponse:
        # Names come lower-cased from h11; latin-1 decodes any byte.
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in head.headers}
        status = head.status_code
        declared = headers.get("content-length")
        if declared is not None and method != "HEAD" and status not in (204, 304):
            # h11 checked the digits. Refused: only the bytes already here are kept.
            if int(declared) > max_body:
                raise too_large(int(declared), max_body, label, status, self._arrived_body())
        parts: list[bytes | bytearray] = []
        head_parts: list[bytes | bytearray] = []  # what a refusal keeps, whatever *keep* is
        size = kept = 0
        while True:
            event = await self._next_event()
            if type(event) is h11.Data:
                data = event.data
                size += len(data)
                if size - len(data) < LIMITS.answer_head:
                    head_parts.append(data)
                if size > max_body:
                    raise too_large(size, max_body, label, status, head_parts)
                if kept < keep:
                    part = data[: keep - kept]
                    parts.append(part)
                    kept += len(part)
            elif type(event) is h11.EndOfMessage:
                return HttpResponse(status, headers, b"".join(parts))
            else:
                raise TransportError(f"unexpected answer from {self.origin.where}: {event!r}")

    def _arrived_body(self) -> list[bytes | bytearray]:
        """The body bytes h11 holds already, up to ``Limits.answer_head``, read without
        waiting: the head of an answer refused for its declared size (docs/security.md)."""
        parts: list[bytes | bytearray] = []
        size = 0
        while size < LIMITS.answer_head:
            event = self.protocol.next_event()
            if type(event) is not h11.Data:
                break
            parts.append(event.data)
            size += len(event.data)
        return parts

    def _note_persistence(self, method: str, head: h11.Response) -> bool:
        """Record an answer no persistent HTTP/1.1 server gives; whether it is HTTP/1.0
        saying ``Connection: keep-alive`` with its length stated (its server reads the
        next request on this connection, though h11 closes it)."""
        names = {name for name, _ in head.headers}
        framed = b"content-length" in names or b"transfer-encoding" in names
        bodiless = method == "HEAD" or head.status_code in (204, 304)
        if head.http_version != b"1.1":
            self.not_persistent = f"answers in HTTP/{head.http_version.decode()}"
            tokens = b",".join(value for name, value in head.headers if name == b"connection")
            keep_alive = b"keep-alive" in {token.strip().lower() for token in tokens.split(b",")}
            return keep_alive and (framed or bodiless)
        if not (framed or bodiless):
            self.not_persistent = "ends its answers by closing the connection"
        return False

    async def _skip_declared_body(self, headers: dict[str, str]) -> bool:
        """A 204 or 304 mid-round declared a body: RFC 9112 §6.3 says it has none, so h11
        took the bytes after its head for the next answer, yet a server that says
        Content-Length there may well have sent one. Which it did shows in those bytes: an
        answer starts with ``HTTP/``; anything else is taken as the declared body and
        skipped, so the answers behind it are still read (the requests were processed:
        sending them again would duplicate them). A declared chunked body is not guessed
        at. Whether a body was skipped (then the connection is closed after the exchange).
        """
        where = self.origin.where
        length = headers.get("content-length", "").strip()
        if "transfer-encoding" in headers or not (length.isascii() and length.isdigit()):
            raise TransportError(f"malformed answer from {where}: a 204 or 304 with a body")
        size = int(length)
        # More answers are due, so at least five more bytes come unless the server closes.
        data, eof = self.protocol.trailing_data
        while len(data) < 5 and not eof:
            await self._receive()
            data, eof = self.protocol.trailing_data
        if data.startswith(b"HTTP/"):
            return False  # the server framed it as RFC 9112 says; h11 reads the next answer
        while len(data) < size and not eof:
            await self._receive()
            data, eof = self.protocol.trailing_data
        if len(data) < size:
            raise TransportError(f"{where} closed the connection before answering in full")
        # h11 cannot drop bytes from its buffer: a fresh one takes what follows the body.
        self.protocol = _fresh_protocol((data[size:], eof))
        return True

    def _end_exchange(self) -> bool:
        """Back to idle when h11 says both sides may go on and nothing unasked-for came;
        whether it did (else the connection must be closed)."""
        protocol = self.protocol
        ours, theirs = protocol.our_state, protocol.their_state
        if ours is not h11.DONE or theirs is not h11.DONE:
            if ours is not h11.IDLE or theirs is not h11.IDLE:
                return False  # Connection: close, HTTP/1.0, a body delimited by the close
        extra, closed = protocol.trailing_data
        if extra or closed:
            # Bytes past the answer (the stream is out of step), or the server's close
            # (which h11 reports only on the next read).
            return False
        if ours is h11.DONE:
            protocol.start_next_cycle()
        self.phase = Phase.IDLE
        return True

    def _failure(
        self,
        exc: trio.BrokenResourceError | trio.ClosedResourceError | OSError | h11.ProtocolError,
    ) -> Exception:
        """What an exchange raises for *exc*: h11's verdict on an answer or a failed stream
        as the package's own error, a stale kept-alive connection as
        :class:`StaleConnection` (the request goes again)."""
        where = self.origin.where
        if not isinstance(exc, h11.ProtocolError):
            if self.stale:
                return StaleConnection()
            return TransportError(f"connection lost with {where}: {exc!r}")
        if exc.error_status_hint == 431:  # h11's "Receive buffer too long"
            return head_too_large(self.origin, MAX_HEADER_BYTES)
        if self._eof and not self._head:
            if self._read and not self._received:  # between two answers of a round
                return TransportError(
                    f"{where} closed the connection after {self._read} of {self._count} "
                    "pipelined requests"
                )
            return TransportError(f"{where} closed the connection before answering in full")
        text = str(exc)
        text = text if len(text) <= 200 else text[:200] + "..."
        if self._eof:
            return TransportError(f"{where} closed the connection before answering in full: {text}")
        return TransportError(f"malformed answer from {where}: {text}")


def _h11_request(method: str) -> h11.Request:
    event = _H11_REQUESTS.get(method)
    if event is None:
        event = h11.Request(method=method, target="/", headers=[("Host", "-")])
        if len(_H11_REQUESTS) < 16:
            _H11_REQUESTS[method] = event
    return event


def _new_protocol() -> h11.Connection:
    return h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)


def _fresh_protocol(trailing: tuple[bytes | bytearray, bool]) -> h11.Connection:
    """A new h11 connection that has received *trailing* (h11's ``trailing_data`` of the
    one it replaces: the bytes past the last answer, and whether the server closed)."""
    protocol = _new_protocol()
    data, closed = trailing
    if data:
        protocol.receive_data(bytes(data))
    if closed:
        protocol.receive_data(b"")
    return protocol


def _declares_body(headers: dict[str, str]) -> bool:
    length = headers.get("content-length", "0").strip()
    return length != "0" or "transfer-encoding" in headers

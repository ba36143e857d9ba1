"""Reading the answers of one exchange: the one answer parser of the lean client.

A single request and a pipelined round are read by the same code, :func:`read_answers`:
answers of the plain common shape by :func:`~._answer.parse_simple_answer` (a few
microseconds each, against h11's 25); from the first one that is not, or that drips in,
h11 reads the rest from the same bytes, so h11's verdict stands on everything the fast
path does not accept. What RFC 9112 says a client must reject is rejected: chunk sizes
like ``0x10``, bytes after chunk data, conflicting Content-Lengths,
``Transfer-Encoding: gzip, chunked``, a ``Content-Length`` of ``²``.

Nothing unasked-for is ever read as an answer (docs/protocol.md §2.0): bytes past the last
answer expected, or a 204 or 304 that declares a body, mean the server and the client no
longer agree where answers end, and the connection is closed after the exchange.

Bounds: a response head (interim answers included) of at most 64 KiB and 128 fields; at
most ``max_body`` bytes of body per answer; of each body only its first ``keep_body`` bytes
are kept (the rest is read and dropped, so a round of stream chunks, whose answers only
matter by their status, holds little however large the answers are).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import h11

from .._config import LIMITS
from .._exceptions import TransportError
from ._answer import MAX_HEADER_BYTES, MAX_HEADER_COUNT, NOT_SIMPLE, parse_simple_answer
from ._connection import (
    RECEIVE_SIZE,
    StaleConnection,
    fresh_protocol,
    head_too_large,
)
from ._request import check_size

if TYPE_CHECKING:
    from ._connection import Connection

# Fast reads of one answer before its bytes go to h11: each re-reads the head from its
# start, so an answer dripping in small pieces must not be parsed over and over.
FAST_READS = 4


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes


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


@dataclass(frozen=True)
class Bounds:
    max_body: int  # an answer body over this is a TransportError
    keep_body: int  # bytes of each body kept in its HttpResponse


async def read_answers(
    connection: Connection, method: str, count: int, answers: list[HttpResponse], bounds: Bounds
) -> bool:
    """Read the *count* answers of the exchange under way on *connection* into *answers*;
    whether nothing unasked-for came with them (else the connection must be closed).

    Raises:
        TransportError: for an answer h11 rejects, one over the bounds, or a connection
            lost part-way (*answers* then holds those read before).
        StaleConnection: when a reused connection answered nothing at all.
    """
    index, rest = await _read_simple_answers(connection, method, count, answers, bounds)
    if index == count:
        return not rest  # h11's state untouched (idle)
    if rest:  # (b"" would tell h11 the server closed its side)
        connection.protocol.receive_data(rest)
    return await _read_answers_with_h11(connection, method, index, count, answers, bounds)


async def _read_simple_answers(
    connection: Connection, method: str, count: int, answers: list[HttpResponse], bounds: Bounds
) -> tuple[int, bytes]:
    """Read answers by the fast path while they are simple; how many were read, and the
    bytes received past them (for h11 when not all were)."""
    if method in ("HEAD", "CONNECT"):
        return 0, b""  # h11 frames their bodies by the method
    buffer = bytearray()
    index = reads = 0
    stream = connection.stream
    # An answer whose body is over keep_body is not simple here: h11 reads it, dropping
    # what is not kept, so the buffer never holds more than one read past an answer.
    limit = bounds.keep_body
    while index < count:
        # Nothing read yet (every answer of a round but the pipelined ones): no parse.
        answer = parse_simple_answer(buffer, 0, limit) if buffer else None
        if answer is NOT_SIMPLE or (answer is None and reads == FAST_READS):
            break
        if answer is not None:
            answers.append(HttpResponse(answer.status, answer.headers, answer.body))
            del buffer[: answer.end]
            index, reads = index + 1, 0
            continue
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            if connection.stale:
                raise StaleConnection
            where = connection.origin.where
            if buffer:
                raise TransportError(f"{where} closed the connection before answering in full")
            raise TransportError(
                f"{where} closed the connection after {index} of {count} pipelined requests"
                if count > 1
                else f"{where} closed the connection before answering in full"
            )
        connection.answered = True
        buffer += data
        reads += 1
    return index, bytes(buffer)


async def _read_answers_with_h11(
    connection: Connection,
    method: str,
    first: int,
    count: int,
    answers: list[HttpResponse],
    bounds: Bounds,
) -> bool:
    """Read answers *first* to *count* with h11, which holds the bytes received so far
    (and has seen no request yet on this connection's current cycle)."""
    where = connection.origin.where
    clean = True
    keeps_alive = False  # the last answer was HTTP/1.0 with Connection: keep-alive
    for index in range(first, count):
        protocol = connection.protocol
        if protocol.our_state is not h11.IDLE:  # not the first on this h11 connection
            if protocol.our_state is h11.DONE and protocol.their_state is h11.DONE:
                # Unlike at the end of an exchange, bytes past the answer are expected
                # here: they are the next answers.
                protocol.start_next_cycle()
            elif keeps_alive:
                # h11 closes after any HTTP/1.0 answer; this server said it goes on, and
                # the requests behind were written: their answers are read, not taken
                # for lost and sent again (it has processed them). A fresh h11 takes
                # what follows the answer.
                connection.protocol = protocol = fresh_protocol(protocol.trailing_data)
            else:
                # Connection: close (or HTTP/1.0) on the last answer: the server takes
                # no further request on this connection.
                raise TransportError(
                    f"{where} closed the connection after {index} of {count} pipelined requests"
                )
        # The bounds on an answer's head count this answer's bytes only.
        connection.begin_answer(received=len(protocol.trailing_data[0]))
        protocol.send(_h11_request(method))
        protocol.send(_END)
        head = await _read_head(connection)
        keeps_alive = _note_persistence(connection, method, head)
        answer = await _read_body(connection, method, head, bounds)
        answers.append(answer)
        if answer.status in (204, 304) and index + 1 < count and _declares_body(answer.headers):
            if await _skip_declared_body(connection, answer.headers):
                clean = False
    # A 204 or 304 last in the exchange that carries a body leaves its bytes behind it:
    # end_exchange sees them if they came with the answer, the quiet check if later.
    return connection.end_exchange() and clean


def _note_persistence(connection: Connection, method: str, head: h11.Response) -> bool:
    """Record on *connection* an answer no persistent HTTP/1.1 server gives; whether it
    is HTTP/1.0 saying ``Connection: keep-alive`` with its length stated (its server
    reads the next request on this connection, though h11 closes it)."""
    names = {name for name, _ in head.headers}
    framed = b"content-length" in names or b"transfer-encoding" in names
    bodiless = method == "HEAD" or head.status_code in (204, 304)
    if head.http_version != b"1.1":
        connection.not_persistent = f"answers in HTTP/{head.http_version.decode()}"
        tokens = b",".join(value for name, value in head.headers if name == b"connection")
        keep_alive = b"keep-alive" in {token.strip().lower() for token in tokens.split(b",")}
        return keep_alive and (framed or bodiless)
    if not (framed or bodiless):
        connection.not_persistent = "ends its answers by closing the connection"
    return False


def _declares_body(headers: dict[str, str]) -> bool:
    length = headers.get("content-length", "0").strip()
    return length != "0" or "transfer-encoding" in headers


async def _skip_declared_body(connection: Connection, headers: dict[str, str]) -> bool:
    """A 204 or 304 mid-round declared a body: RFC 9112 §6.3 says it has none, so h11 took
    the bytes after its head for the next answer, yet a server that says Content-Length
    there may well have sent one. Which it did shows in those bytes: an answer starts with
    ``HTTP/``; anything else is taken as the declared body and skipped, so the answers
    behind it are still read (the requests were processed: sending them again would
    duplicate them). A declared chunked body is not guessed at. Whether a body was skipped
    (then the connection is closed after the exchange)."""
    where = connection.origin.where
    length = headers.get("content-length", "").strip()
    if "transfer-encoding" in headers or not (length.isascii() and length.isdigit()):
        raise TransportError(f"malformed answer from {where}: a 204 or 304 with a body")
    size = int(length)
    # More answers are due, so at least five more bytes come unless the server closes.
    data, eof = connection.protocol.trailing_data
    while len(data) < 5 and not eof:
        await connection.receive()
        data, eof = connection.protocol.trailing_data
    if data.startswith(b"HTTP/"):
        return False  # the server framed it as RFC 9112 says; h11 reads the next answer
    while len(data) < size and not eof:
        await connection.receive()
        data, eof = connection.protocol.trailing_data
    if len(data) < size:
        raise TransportError(f"{where} closed the connection before answering in full")
    # h11 cannot drop bytes from its buffer: a fresh one takes what follows the body.
    connection.protocol = fresh_protocol((data[size:], eof))
    return True


async def _read_head(connection: Connection) -> h11.Response:
    origin = connection.origin
    while True:
        event = await connection.next_event()
        # h11 bounds a head still incomplete; one that arrived whole in a large read, or
        # an endless run of interim answers, is measured here, so the bound holds for all
        # the heads together however the bytes were split.
        received = connection.answer.received
        if received > MAX_HEADER_BYTES:
            if received - len(connection.protocol.trailing_data[0]) > MAX_HEADER_BYTES:
                raise head_too_large(origin)
        if isinstance(event, h11.Response):
            connection.answer.head = True
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
    connection: Connection, method: str, head: h11.Response, bounds: Bounds
) -> HttpResponse:
    # Names come lower-cased from h11; latin-1 decodes any byte.
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in head.headers}
    url = connection.origin.url
    max_body, keep = bounds.max_body, bounds.keep_body
    declared = headers.get("content-length")
    if declared is not None and method != "HEAD" and head.status_code not in (204, 304):
        # h11 checked the digits. Refused: only the bytes already here are kept.
        if int(declared) > max_body:
            arrived = _arrived_body(connection.protocol)
            check_size(int(declared), max_body, method, url, head.status_code, arrived)
    parts: list[bytes | bytearray] = []
    head_parts: list[bytes | bytearray] = []  # what a refusal keeps, whatever *keep* is
    size = kept = 0
    while True:
        event = await connection.next_event()
        if type(event) is h11.Data:
            size += len(event.data)
            if size - len(event.data) < LIMITS.answer_head:
                head_parts.append(event.data)
            check_size(size, max_body, method, url, head.status_code, head_parts)
            if kept < keep:
                part = event.data[: keep - kept]
                parts.append(part)
                kept += len(part)
        elif type(event) is h11.EndOfMessage:
            return HttpResponse(head.status_code, headers, b"".join(parts))
        else:
            raise TransportError(f"unexpected answer from {connection.origin.where}: {event!r}")


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

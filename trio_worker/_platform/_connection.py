"""One kept-alive HTTP/1.1 connection, and the one answer parser: llhttp (httptools), each
read fed to it whole, held to h11's verdict and the client's bounds (docs/protocol.md
§2.0, "Parsing" and "Bounds").

Its phase: ``IDLE`` in the pool (reused only when quiet), ``EXCHANGING`` (one request or
one pipelined round written, its answers being read), ``CLOSED`` for good. A reused
connection that answers nothing is *stale* (the server closed it while idle): nothing of
the request was processed, so it goes again on a fresh one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import httptools
import trio

from .._config import LIMITS, MAX_ANSWER_BYTES
from .._exceptions import TransportError
from ._request import StaleConnection, head_too_large, too_large

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .._exceptions import AnswerTooLarge
    from ._request import Origin

RECEIVE_SIZE: Final = 65536
MAX_HEADER_BYTES: Final = 64 * 1024  # one response head, interim answers included
MAX_HEADER_COUNT: Final = 128  # header fields in one response head
# A round's reads kept since one began between two answers (_past_declared_body).
_REPLAY_BYTES: Final = 2 * RECEIVE_SIZE


class Phase(enum.Enum):
    IDLE = "idle"
    EXCHANGING = "exchanging"
    CLOSED = "closed"


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


class _Unasked(Exception):
    """A callback saw an answer begin when none was due."""


class _DeclaredBody(Exception):
    """llhttp failed on what followed a 204 or 304 that declared a body, mid-round."""


class Connection:
    """One connection: its phase, and the reading of its answers (llhttp's callbacks)."""

    def __init__(
        self, stream: trio.abc.Stream, origin: Origin, is_quiet: Callable[[], bool]
    ) -> None:
        """*is_quiet*: whether no byte (nor the server's close) waits on its socket."""
        self.stream = stream
        self.origin = origin
        self.is_quiet = is_quiet
        self.phase = Phase.IDLE
        self.exchanges = 0  # requests (or pipelined rounds) written on it, the current included
        self.answered = False  # a byte of the current exchange's answers arrived
        # Why its server is no persistent HTTP/1.1 one, once an answer showed it.
        self.not_persistent: str | None = None
        self.idle_since = 0.0  # trio time it last went back to the pool
        self._parser = httptools.HttpResponseParser(self)
        self._between = True  # llhttp stands between two messages
        # The exchange under way: its requests, the answers read, those due.
        self._method = ""
        self._requests: Sequence[tuple[str, bytes]] = ()
        self._answers: list[HttpResponse] = []
        self._due = 0
        self._max_body = self._keep = self._hold = 0
        self._out_of_step = self._eof = False  # out of step: bytes past the last answer due
        self._stopped_for: BaseException | None = None  # why a callback stopped llhttp
        self._head_open, self._head_bytes = False, 0  # open: waiting for its final head
        self._replay: list[bytes | bytearray] | None = None
        self._replay_size = self._completed = 0
        self._suspect: tuple[int, dict[str, str]] | None = None
        # The message under way.
        self._status = self._size = self._kept = 0
        self._refused = 0  # its declared length, when over max_body
        self._until_close = False  # its body ends with the connection
        self._keep_alive = False  # llhttp's verdict on the last answer (Connection, version)
        self._fields: list[tuple[bytes, bytes]] = []  # as llhttp hands them over
        self._headers: dict[str, str] = {}
        self._codings: list[str] = []  # its Transfer-Encoding values
        self._parts: list[bytes] = []

    def __repr__(self) -> str:
        detail = ""
        if self.phase is Phase.EXCHANGING:
            reading = "a head" if self._head_open else "a body"
            detail = f", {len(self._answers)} answer(s) read, {self._due} due, reading {reading}"
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
            TransportError: for an answer llhttp rejects, one over the bounds, or a
                connection lost part-way (*answers* then holds those read before).
            StaleConnection: when a reused connection answered nothing at all.
        """
        self.phase = Phase.EXCHANGING
        self.exchanges += 1
        self.answered = self._out_of_step = self._eof = False
        self._method, self._requests = method, requests
        self._answers, self._due = answers, len(requests)
        # A refused answer hands over its first bytes whatever *keep* is (docs/security.md).
        self._max_body, self._keep, self._hold = max_body, keep, max(keep, LIMITS.answer_head)
        self._head_open, self._head_bytes = True, 0
        self._replay, self._suspect = ([] if len(requests) > 1 else None), None
        try:
            await self.stream.send_all(wire)
            while self._due:
                data = await self.stream.receive_some(RECEIVE_SIZE)
                if not data:
                    self._end_of_stream()
                    continue
                self.answered = True
                while data:
                    try:
                        self._feed(data)
                        break
                    except _DeclaredBody:
                        data = await self._past_declared_body()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            if self.stale:
                raise StaleConnection from exc
            raise TransportError(f"connection lost with {self.origin.where}: {exc!r}") from exc
        if self._out_of_step or self.not_persistent or not self._keep_alive:
            return False  # Connection: close, HTTP/1.0, or out of step
        self.phase = Phase.IDLE
        return True

    # -- feeding llhttp -------------------------------------------------------------------

    def _feed(self, data: bytes | bytearray) -> None:
        if self._between and self._due and self._suspect is None and not _starts_an_answer(data):
            # llhttp skips empty lines before a status line and reads RTSP's and ICE's as
            # HTTP's; h11, and so this client, reject them (docs/protocol.md §2.0). An
            # answer that begins inside a read is past this look.
            raise TransportError(
                f"malformed answer from {self.origin.where}: "
                f"{bytes(data[:12])!r} where a status line begins"
            )
        replay = self._replay
        if replay is not None:
            if self._between:  # this read starts a message: the kept bytes start here
                self._replay, self._replay_size, self._completed = [data], len(data), 0
                if self._suspect is not None:
                    self._suspect = (0, self._suspect[1])
            elif self._replay_size <= _REPLAY_BYTES:
                replay.append(data)
                self._replay_size += len(data)
        if not self._head_open:
            self._parse(data)
        else:
            # The answer under way had not shown its final head when this read began: the
            # whole read counts towards the head's bound while that head goes on (the head
            # of an answer that starts mid-read is counted from the next read).
            answer = len(self._answers)
            room = MAX_HEADER_BYTES - self._head_bytes
            if len(data) > room:
                self._parse(data[:room])
                if self._head_open and len(self._answers) == answer:
                    raise head_too_large(self.origin, MAX_HEADER_BYTES)
                self._parse(data[room:])
            else:
                self._parse(data)
            if self._head_open and len(self._answers) == answer:
                self._head_bytes += len(data)
        if self._refused:
            # Refused on its declared length: only what came with its head is kept.
            raise self._too_large(self._refused)

    def _parse(self, data: bytes | bytearray) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            failure, self._stopped_for = self._stopped_for, None
            if isinstance(failure, _Unasked):
                self._out_of_step = True
                return
            assert failure is not None
            raise failure from None
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if not self._due:
                self._out_of_step = True  # bytes past the last answer due
            elif self._suspect is not None:
                raise _DeclaredBody from None
            else:
                text = str(exc) or type(exc).__name__
                raise TransportError(f"malformed answer from {self.origin.where}: {text}") from None

    def _stop(self, failure: BaseException) -> BaseException:
        """What a callback raises: llhttp stops, and :meth:`_parse` raises *failure*."""
        self._stopped_for = failure
        return failure

    def _end_of_stream(self) -> None:
        """The server closed its side: what that means for the answer under way."""
        if self.stale:
            raise StaleConnection
        if not self._eof and not self._between and not self._head_open and self._until_close:
            self._eof = True  # a body delimited by the close, now complete
            self.on_message_complete()
            return
        where = self.origin.where
        if self._between and self._answers and len(self._requests) > 1:
            raise TransportError(
                f"{where} closed the connection after {len(self._answers)} of "
                f"{len(self._requests)} pipelined requests"
            )
        raise TransportError(f"{where} closed the connection before answering in full")

    def _too_large(self, size: int) -> AnswerTooLarge:
        request = f"{self._method} {self._requests[len(self._answers)][0]}"
        return too_large(size, self._max_body, request, self._status, self._parts)

    # -- llhttp's callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        if not self._due:
            raise self._stop(_Unasked())
        self._between = False
        self._size = self._kept = self._refused = 0
        self._fields, self._parts = [], []

    def on_status(self, reason: bytes) -> None:
        # RFC 9112 §4's reason phrase (HTAB, SP, VCHAR, obs-text), as h11 reads it: llhttp
        # lets other control bytes through.
        if reason.translate(None, _REASON_BYTES):
            raise self._stop(
                TransportError(f"malformed answer from {self.origin.where}: {reason[:40]!r}")
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        # Decoded once the head is whole (fewer calls per field); the head's bound bounds
        # how many can come.
        self._fields.append((name, value))

    def on_headers_complete(self) -> None:
        fields, where = self._fields, self.origin.where
        if len(fields) > MAX_HEADER_COUNT:
            raise self._stop(
                TransportError(f"answer from {where} has over {MAX_HEADER_COUNT} header fields")
            )
        # llhttp keeps a value's trailing whitespace; h11, and RFC 9110 §5.5, drop it.
        self._headers = headers = {
            name.decode("latin-1").lower(): value.decode("latin-1").rstrip(" \t")
            for name, value in fields
        }
        self._codings = codings = (
            [
                value.decode("latin-1")
                for name, value in fields
                if name.lower() == b"transfer-encoding"
            ]
            if "transfer-encoding" in headers
            else []
        )
        parser = self._parser
        self._status = status = parser.get_status_code()
        framed = "content-length" in headers or bool(codings)
        if status < 200:
            if status == 101 or framed:
                raise self._stop(TransportError(f"malformed answer from {where}: a {status} here"))
            return  # an interim answer: skipped
        self._head_open = False
        if codings and (len(codings) > 1 or codings[0].strip().lower() != "chunked"):
            raise self._stop(
                TransportError(f"malformed answer from {where}: transfer coding {codings}")
            )
        bodiless = status in (204, 304)
        self._until_close = not (framed or bodiless)
        version = parser.get_http_version()
        if version != "1.1":
            self.not_persistent = f"answers in HTTP/{version}"
        elif self._until_close:
            self.not_persistent = "ends its answers by closing the connection"
        declared = headers.get("content-length")
        if declared is not None and not bodiless and int(declared) > self._max_body:
            self._refused = int(declared)

    def on_body(self, data: bytes) -> None:
        size = self._size = self._size + len(data)
        kept = self._kept
        if kept < self._hold:
            if kept + len(data) > self._hold:
                data = data[: self._hold - kept]
            self._parts.append(data)
            self._kept = kept + len(data)
        if size > self._max_body and not self._refused:
            raise self._stop(self._too_large(size))

    def on_message_complete(self) -> None:
        self._between = True
        self._completed += 1
        status = self._status
        if status < 200:
            return
        if self._refused:  # its whole body came with its head: refused all the same
            raise self._stop(self._too_large(self._refused))
        headers = self._headers
        body = b"".join(self._parts)
        self._answers.append(HttpResponse(status, headers, body[: self._keep]))
        self._due -= 1
        self._head_open, self._head_bytes = self._due > 0, 0
        self._suspect = None
        # Asked now: llhttp forgets the answer's flags once this callback returns.
        self._keep_alive = keep_alive = self._parser.should_keep_alive() and not self._eof
        if not self._due:
            return
        if not keep_alive:
            raise self._stop(
                TransportError(
                    f"{self.origin.where} closed the connection after {len(self._answers)} "
                    f"of {len(self._requests)} pipelined requests"
                )
            )
        if status in (204, 304) and (self._codings or headers.get("content-length", "0") != "0"):
            self._suspect = (self._completed, headers)

    # -- a 204 or 304 that declared a body, mid-round -------------------------------------

    async def _past_declared_body(self) -> bytes | bytearray:
        """llhttp failed on what followed a 204 or 304 that declared a body, answers still
        due: the bytes to parse next. Unless they start ``HTTP/`` they are taken as the
        declared body and skipped, since the requests behind it were processed and sending
        them again would duplicate them (docs/protocol.md §2.0, "Parsing")."""
        assert self._suspect is not None
        (completed, headers), self._suspect = self._suspect, None
        where = self.origin.where
        length = headers.get("content-length")
        replay = self._replay
        if length is None or replay is None or self._replay_size > _REPLAY_BYTES:
            raise TransportError(f"malformed answer from {where}: a 204 or 304 with a body")
        data = b"".join(replay)
        rest = data[_message_end(data, completed) :]
        self._parser = httptools.HttpResponseParser(self)  # llhttp stops at an error
        self._between = True
        size = int(length)
        # More answers are due, so at least five more bytes come unless the server closes.
        while not self._eof and (len(rest) < 5 or (len(rest) < size and rest[:5] != b"HTTP/")):
            more = await self.stream.receive_some(RECEIVE_SIZE)
            self._eof = not more
            rest += more
        if rest.startswith(b"HTTP/"):
            return rest  # framed as RFC 9112 says: the next answer, malformed
        if len(rest) < size:
            raise TransportError(f"{where} closed the connection before answering in full")
        self._out_of_step = True
        return rest[size:]


_REASON_BYTES = bytes([9, 32, *range(0x21, 0x7F), *range(0x80, 0x100)])


def _starts_an_answer(data: bytes | bytearray) -> bool:
    """Whether *data*, the first bytes of an answer, can begin ``HTTP/``."""
    start = bytes(data[:5])
    return b"HTTP/".startswith(start) if len(start) < 5 else start == b"HTTP/"


def _message_end(data: bytes, messages: int) -> int:
    """Where llhttp ends the *messages*-th message of *data*, which starts with a message."""
    if messages == 0:
        return 0
    counter = _Counter()
    parser = httptools.HttpResponseParser(counter)
    for end in range(len(data)):
        parser.feed_data(data[end : end + 1])
        if counter.completed == messages:
            return end + 1
    raise AssertionError("the answer was read from these bytes")  # pragma: no cover


class _Counter:
    completed = 0

    def on_message_complete(self) -> None:
        self.completed += 1

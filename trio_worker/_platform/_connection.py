"""One kept-alive HTTP/1.1 connection of the lean client, and its named state.

Theory of operation. A connection is in one of three phases:

- ``IDLE``: in the pool, no request on it. It is taken for a request only when it is
  *quiet*: no byte waits on its socket (:meth:`Connection.is_quiet`, the check httpcore
  makes before reusing a connection). An idle connection has nothing to say: a byte on it
  is an answer nobody asked for (a proxy's, a server's unsolicited 408 before it closes)
  or the server's close, and either way the connection is closed, never read as the next
  request's answer.
- ``EXCHANGING``: one request, or one pipelined round, written, its answers being read.
  What the current answer has received so far lives in one :class:`AnswerProgress`,
  replaced whole at each answer, never reset field by field.
- ``CLOSED``: closed by us (after a failure, a cancellation, an answer that ended it, or
  anything unasked-for); never used again.

A connection that carried earlier requests and answers nothing at all to a new one is
*stale* (the server closed it while idle, after the quiet check): the request goes again
on a fresh connection (:class:`StaleConnection`), because nothing of it was processed.
"""

from __future__ import annotations

import enum
import select
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import h11
import trio

from .._exceptions import TransportError
from ._answer import MAX_HEADER_BYTES
from ._request import size_text

if TYPE_CHECKING:
    import socket

    from ._request import Origin

RECEIVE_SIZE = 65536


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


@dataclass
class AnswerProgress:
    """What the answer being read has received so far."""

    received: int = 0  # bytes of this answer (its head's bound counts these)
    head: bool = False  # its final head arrived
    eof: bool = False  # the server closed its side during it


@dataclass(eq=False)
class Connection:
    stream: trio.abc.Stream
    origin: Origin
    protocol: h11.Connection = field(default_factory=lambda: new_protocol())
    phase: Phase = Phase.IDLE
    exchanges: int = 0  # requests (or pipelined rounds) written on it, the current included
    answered: bool = False  # a byte of the current exchange's answers arrived
    # Why its server is no persistent HTTP/1.1 one (HTTP/1.0, or an answer delimited by
    # the close), once an answer showed it: its origin is never pipelined to again.
    not_persistent: str | None = None
    answer: AnswerProgress = field(default_factory=AnswerProgress)
    # The quiet check's socket and its poll object, found and registered once: the
    # check runs before every reuse (an open socket keeps its descriptor).
    _quiet_probe: _QuietProbe | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        answer = self.answer
        detail = (
            f", answer at {answer.received} bytes{', head read' if answer.head else ''}"
            f"{', closed by the server' if answer.eof else ''}"
            if self.phase is Phase.EXCHANGING
            else ""
        )
        return (
            f"<Connection to {self.origin.where} {self.phase.value}, "
            f"{self.exchanges} exchange(s){detail}>"
        )

    @property
    def stale(self) -> bool:
        return self.exchanges > 1 and not self.answered

    def begin_exchange(self) -> None:
        assert self.phase is Phase.IDLE, self
        self.phase = Phase.EXCHANGING
        self.exchanges += 1
        self.answered = False
        self.answer = AnswerProgress()

    def begin_answer(self, received: int = 0) -> None:
        """A new answer of this exchange starts, *received* of its bytes already here."""
        self.answer = AnswerProgress(received=received)

    def end_exchange(self) -> bool:
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

    async def aclose(self) -> None:
        """Close it; the stream is closed even when cancelled (raised afterwards)."""
        self.phase = Phase.CLOSED
        await trio.aclose_forcefully(self.stream)

    def is_quiet(self) -> bool:
        """Whether no byte (nor the server's close) waits on this idle connection's socket.

        A stream without a socket of its own (an in-memory one) cannot be asked, and is
        taken as quiet.
        """
        probe = self._quiet_probe
        if probe is None:
            probe = self._quiet_probe = _QuietProbe(_raw_socket(self.stream))
        return probe.quiet()

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
            self.answer.received += len(data)
        elif self.stale:
            raise StaleConnection
        else:
            self.answer.eof = True
        # h11 is typed for bytes; memory streams may hand out a bytearray.
        self.protocol.receive_data(data if type(data) is bytes else bytes(data))

    def failure(
        self,
        exc: trio.BrokenResourceError | trio.ClosedResourceError | OSError | h11.ProtocolError,
    ) -> Exception:
        """What a request raises for *exc*, raised while it ran on this connection: h11's
        verdict on an answer or a failed stream as the package's own error, a stale
        kept-alive connection as :class:`StaleConnection` (the request goes again)."""
        if isinstance(exc, h11.ProtocolError):
            return self._protocol_failure(exc)
        if self.stale:
            return StaleConnection()
        return TransportError(f"connection lost with {self.origin.where}: {exc!r}")

    def _protocol_failure(self, exc: h11.ProtocolError) -> TransportError:
        where = self.origin.where
        if exc.error_status_hint == 431:  # h11's "Receive buffer too long"
            return head_too_large(self.origin)
        if self.answer.eof and not self.answer.head:
            return TransportError(f"{where} closed the connection before answering in full")
        text = str(exc)
        text = text if len(text) <= 200 else text[:200] + "..."
        if self.answer.eof:
            return TransportError(f"{where} closed the connection early: {text}")
        return TransportError(f"malformed answer from {where}: {text}")


class ServerKinds:
    """What each origin's answers showed of its server: a persistent HTTP/1.1 one
    (pipelined requests are safe), or not (HTTP/1.0, or an answer delimited by the close:
    never pipelined to). Shared by a worker's clients, so the take's first answer tells the
    stream chunks' client what the platform is before any chunk goes."""

    def __init__(self) -> None:
        self._persistent: set[Origin] = set()
        self._serial: dict[Origin, str] = {}

    def __repr__(self) -> str:
        return f"<ServerKinds {len(self._persistent)} persistent, {len(self._serial)} not>"

    def pipelines(self, origin: Origin) -> bool:
        """Whether *origin* has shown it keeps HTTP/1.1 connections (and never the opposite)."""
        return origin in self._persistent

    def refusal(self, origin: Origin) -> PipeliningUnsupported | None:
        """The error for a round to *origin*, when it must not be pipelined to."""
        reason = self._serial.get(origin)
        return None if reason is None else PipeliningUnsupported(f"{origin.where} {reason}")

    def note(self, connection: Connection, *, answered: bool) -> None:
        """Learn from the answers *connection* read in its exchange (all of them when
        *answered*, else those before it failed)."""
        origin = connection.origin
        if connection.not_persistent is not None:
            self._serial.setdefault(origin, connection.not_persistent)
            self._persistent.discard(origin)
        elif answered and origin not in self._serial:
            self._persistent.add(origin)


def new_protocol() -> h11.Connection:
    return h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)


def fresh_protocol(trailing: tuple[bytes | bytearray, bool]) -> h11.Connection:
    """A new h11 connection that has received *trailing* (h11's ``trailing_data`` of the
    one it replaces: the bytes past the last answer, and whether the server closed)."""
    protocol = new_protocol()
    data, closed = trailing
    if data:
        protocol.receive_data(bytes(data))
    if closed:
        protocol.receive_data(b"")
    return protocol


def head_too_large(origin: Origin) -> TransportError:
    return TransportError(
        f"answer from {origin.where}: response head too large (over {size_text(MAX_HEADER_BYTES)})"
    )


def _raw_socket(stream: trio.abc.Stream) -> socket.socket | trio.socket.SocketType | None:
    """The socket under *stream* (a TCP stream, or TLS over one), if any."""
    inner: object = stream
    for _ in range(4):
        sock = getattr(inner, "socket", None)
        if sock is not None:
            return sock  # type: ignore[no-any-return]
        inner = getattr(inner, "transport_stream", None)
        if inner is None:
            return None
    return None


class _QuietProbe:
    """httpcore's ``is_socket_readable`` for one socket: a zero-timeout poll of it."""

    __slots__ = ("_poller", "_sock")

    def __init__(self, sock: socket.socket | trio.socket.SocketType | None) -> None:
        self._sock = sock
        self._poller: select.poll | None = None
        if sock is not None and hasattr(select, "poll") and sock.fileno() >= 0:
            self._poller = select.poll()
            self._poller.register(sock.fileno(), select.POLLIN)

    def quiet(self) -> bool:
        sock = self._sock
        if sock is None:
            return True
        if sock.fileno() < 0:
            return False  # closed under us: not usable
        if self._poller is None:  # pragma: no cover - Windows
            readable, _, _ = select.select([sock], [], [], 0)
            return not readable
        return not self._poller.poll(0)

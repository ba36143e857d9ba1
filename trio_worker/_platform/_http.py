"""The worker's own HTTP/1.1 client: one pool, one entry point for every route, its
reuse rule, one deadline per request (docs/protocol.md §2.0; its CPU cost:
docs/benchmarks.md). A request cancelled mid-flight closes its connection, so
cancellation never leaks a slot (encode/httpcore#1093). A :data:`StreamOpener` replaces
the TCP/TLS connect: tests run this very client over in-memory streams.
"""

from __future__ import annotations

import os
import select
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeAlias

import trio

from .._config import DEFAULT_CONNECT_TIMEOUT, MAX_ANSWER_BYTES
from .._exceptions import TransportError
from .._proxies import any_proxy_configured
from ._connection import Connection, HttpBackend, HttpResponse
from ._network import close_all, open_tcp_stream, open_tls_stream, trust_context
from ._request import (
    UNSAFE_TARGET,
    Origin,
    PipeliningUnsupported,
    StaleConnection,
    check_headers,
    parse_origin,
    safe_target,
)

if TYPE_CHECKING:
    import socket
    import ssl
    from collections.abc import Mapping, Sequence

__all__ = [
    "BackendWrapper",
    "HttpBackend",
    "HttpPool",
    "HttpResponse",
    "QuietProbe",
    "ServerKinds",
    "StreamOpener",
    "make_backend",
]

#: ``(host, port, tls) -> stream``: how the pool gets a connection.
StreamOpener: TypeAlias = Callable[[str, int, bool], Awaitable[trio.abc.Stream]]

MAX_CONNECTIONS = 100  # httpcore's default
KEEPALIVE_EXPIRY = 15.0  # aiohttp's, the reference's: within servers' idle timeouts


#: Wraps a backend (the virtual-time suite records every request the worker makes).
BackendWrapper: TypeAlias = Callable[[HttpBackend], HttpBackend]


def make_backend(
    headers: Mapping[str, str],
    *,
    open_stream: StreamOpener | None = None,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    environ: Mapping[str, str] | None = None,
    max_connections: int = MAX_CONNECTIONS,
    keep_body: int | None = None,
    servers: ServerKinds | None = None,
) -> HttpBackend:
    """The pool; with a proxy variable set, :class:`._proxy.ProxyRoutes` over it. An
    injected *open_stream* wins over a proxy variable: its streams are the network.
    *keep_body*, *servers*: as :class:`HttpPool`'s.
    """
    check_headers(headers)  # for httpx too: its errors would quote the API key
    env = os.environ if environ is None else environ
    pool = HttpPool(
        headers,
        open_stream=open_stream,
        connect_timeout=connect_timeout,
        max_connections=max_connections,
        keep_body=keep_body,
        servers=servers,
    )
    if open_stream is not None or not any_proxy_configured(env):
        return pool
    from ._proxy import ProxyRoutes  # httpx: only in a worker that may need it

    return ProxyRoutes(pool, headers, env)


class ServerKinds:
    """What each origin's answers showed: a persistent HTTP/1.1 server (pipelined to) or
    not (docs/protocol.md §2.4). Shared by a worker's clients, so the take's first answer
    tells the stream chunks' client before any chunk goes."""

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


class HttpPool:
    """A keep-alive HTTP/1.1 client on trio streams, for the platform's routes.

    Not a general client: no redirects, no cookies, no compression, no proxies, no HEAD.
    """

    def __init__(
        self,
        headers: Mapping[str, str],
        *,
        open_stream: StreamOpener | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
        keepalive_expiry: float = KEEPALIVE_EXPIRY,
        keep_body: int | None = None,
        servers: ServerKinds | None = None,
    ) -> None:
        """*keep_body*: bytes of each answer's body kept (see :meth:`exchange`). *servers*:
        shared with the worker's other clients (else this pool's own)."""
        check_headers(headers)
        self._static = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self._origins: dict[str, Origin] = {}
        # Take, stop, ping and chunk URLs repeat; a done URL is used once, so the cache
        # is emptied when full.
        self._heads: dict[tuple[str, str], tuple[Origin, bytes]] = {}
        self._idle: dict[Origin, list[Connection]] = {}
        self._idle_count = 0
        self._slots = trio.Semaphore(max_connections)
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self.keep_body = keep_body
        self.connect_timeout = connect_timeout
        self._servers = ServerKinds() if servers is None else servers
        self._ssl = ssl_context
        self._open_stream = self._open_network if open_stream is None else open_stream

    def __repr__(self) -> str:
        in_use = self.max_connections - self._slots.value
        origins = ", ".join(f"{o.where}: {len(c)}" for o, c in self._idle.items() if c)
        return (
            f"<HttpPool {in_use} in use, {self._idle_count} idle"
            f"{f' ({origins})' if origins else ''}, at most {self.max_connections}, "
            f"kept idle for at most {self.keepalive_expiry:g}s>"
        )

    async def aclose(self) -> None:
        idle, self._idle, self._idle_count = self._idle, {}, 0
        await close_all([c for connections in idle.values() for c in connections])

    async def exchange(
        self,
        method: str,
        requests: Sequence[tuple[str, bytes]],
        answers: list[HttpResponse] | None = None,
        *,
        max_body: int = MAX_ANSWER_BYTES,
        keep_body: int | None = None,
    ) -> list[HttpResponse]:
        """Send every ``(url, body)`` request on one connection (several: pipelined, once
        the origin has shown itself persistent) and append each answer to *answers* (a new
        list when None) as it is read; the answers.

        The URLs share one origin. Of each body only the first *keep_body* bytes are kept
        (default: the pool's, else all), the rest read and dropped. *answers* may be the
        caller's, so a caller whose deadline cut the reading knows which were answered.

        Raises:
            TransportError: for any failure below HTTP, an answer over *max_body* bytes of
                body included (:class:`~trio_worker.AnswerTooLarge`); *answers* holds the
                answers read before it, and the connection is closed.
            PipeliningUnsupported: the origin does not keep HTTP/1.1 connections (it
                answered in HTTP/1.0, or delimited an answer by closing): *answers* holds
                the answers to the requests sent, and the rest were not sent.
            ValueError: *method* is HEAD or CONNECT, whose answers this client cannot frame.
        """
        if answers is None:
            answers = []
        if method in ("HEAD", "CONNECT"):
            raise ValueError(f"the platform's client does not send {method} requests")
        # The stream yields only when it must wait (._network): a request past its
        # deadline must not go out.
        await trio.lowlevel.checkpoint_if_cancelled()
        heads = self._heads
        if len(requests) == 1:
            url, body = requests[0]
            origin, head = heads.get((method, url)) or self._head(method, url)
            wires = [head + b"Content-Length: %d\r\n\r\n" % len(body) + body]
        else:
            wires = []
            origin = (heads.get((method, requests[0][0])) or self._head(method, requests[0][0]))[0]
            for url, body in requests:
                other, head = heads.get((method, url)) or self._head(method, url)
                if other != origin:
                    raise TransportError(
                        f"cannot pipeline requests to {origin.where} and {other.where} "
                        "on one connection"
                    )
                wires.append(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            if refusal := self._servers.refusal(origin):
                raise refusal
        keep = self.keep_body if keep_body is None else keep_body
        keep = max_body if keep is None else min(keep, max_body)
        sent = 0
        while sent < len(wires):
            # One request a write until the origin has shown itself persistent: another
            # would process the rest of a write unanswered (docs/protocol.md §2.4).
            count = len(wires) - sent
            if count > 1 and not self._servers.pipelines(origin):
                count = 1
            wire = wires[sent] if count == 1 else b"".join(wires[sent : sent + count])
            batch = requests if count == len(requests) else requests[sent : sent + count]
            if not await self._exchange(origin, wire, method, batch, answers, max_body, keep):
                continue  # stale: nothing of it was processed, it goes again
            sent += count
            if sent < len(wires) and (refusal := self._servers.refusal(origin)):
                raise refusal
        return answers

    def _head(self, method: str, url: str) -> tuple[Origin, bytes]:
        """The origin of *url* and its request head up to its ``Content-Length`` line.

        Raises:
            TransportError: when *url* cannot be requested (scheme, host, port, characters).
        """
        scheme, sep, rest = url.partition("://")
        if not sep:
            raise TransportError(f"cannot request {url!r}")
        netloc, slash, target = rest.partition("/")
        for stop in "?#":
            if stop in netloc:  # http://host?query: no path at all
                netloc, _, tail = netloc.partition(stop)
                target, slash = stop + tail + slash + target, ""
        key = f"{scheme}://{netloc}"
        origin = self._origins.get(key)
        if origin is None:
            origin = parse_origin(url)
            if len(self._origins) < 64:
                self._origins[key] = origin
        target = (slash + target).partition("#")[0]
        if not target.startswith("/"):
            target = "/" + target
        if UNSAFE_TARGET.search(target):
            target = safe_target(target)
        text = f"{method} {target} HTTP/1.1\r\nHost: {origin.host_header}\r\n{self._static}"
        try:
            built = origin, text.encode("latin-1")
        except UnicodeEncodeError as exc:
            raise TransportError(f"cannot send {url!r} in an HTTP head: {exc}") from None
        if len(self._heads) >= 256:
            self._heads.clear()
        self._heads[method, url] = built
        return built

    async def _exchange(
        self,
        origin: Origin,
        wire: bytes,
        method: str,
        requests: Sequence[tuple[str, bytes]],
        answers: list[HttpResponse],
        max_body: int,
        keep: int,
    ) -> bool:
        """One write and its answers, on a connection of its own while they last; False
        when the connection turned out stale (closed, nothing sent)."""
        slots = self._slots
        try:
            slots.acquire_nowait()
        except trio.WouldBlock:
            await slots.acquire()
        try:
            connection = await self._connection(origin)
            # aclose closes the stream even when cancelled: no connection outlives a
            # failed or cancelled request.
            try:
                reusable = await connection.exchange(
                    wire, method, requests, answers, max_body, keep
                )
            except StaleConnection:
                # Closed while idle, nothing processed: again on a fresh connection.
                await connection.aclose()
                return False
            except BaseException:
                self._servers.note(connection, answered=False)
                await connection.aclose()
                raise
            self._servers.note(connection, answered=True)
            if reusable:
                connection.idle_since = trio.current_time()
                self._idle.setdefault(origin, []).append(connection)
                self._idle_count += 1
            else:
                # A cancellation pending here loses the answer, as it would have one
                # checkpoint earlier while its last bytes were read.
                await connection.aclose()
            return True
        finally:
            slots.release()

    async def _connection(self, origin: Origin) -> Connection:
        """An idle connection to *origin* that is quiet and not expired, else a new one."""
        idle = self._idle.get(origin)
        if idle:
            oldest = trio.current_time() - self.keepalive_expiry
            while idle:
                connection = idle.pop()
                self._idle_count -= 1
                if connection.idle_since >= oldest and connection.is_quiet():
                    while idle and idle[0].idle_since < oldest:  # expired behind it
                        self._idle_count -= 1
                        await idle.pop(0).aclose()
                    return connection
                # Expired, or a byte on it (docs/protocol.md §2.0, "Reuse only when quiet").
                await connection.aclose()
        while self._idle_count and self._idle_count + self._in_use() > self.max_connections:
            await self._close_oldest_idle()
        with trio.move_on_after(self.connect_timeout) as scope:
            try:
                stream = await self._open_stream(origin.host, origin.port, origin.scheme == "https")
            except (OSError, trio.BrokenResourceError) as exc:
                raise TransportError(f"cannot connect to {origin.where}: {exc}") from exc
        if scope.cancelled_caught:
            raise TransportError(f"cannot connect to {origin.where}: timed out")
        return Connection(stream, origin, QuietProbe(stream).quiet)

    def _in_use(self) -> int:
        return self.max_connections - self._slots.value

    async def _close_oldest_idle(self) -> None:
        """Make room for a new connection: close the idle one idle the longest."""
        lists = [connections for connections in self._idle.values() if connections]
        oldest = min(lists, key=lambda connections: connections[0].idle_since)
        self._idle_count -= 1
        await oldest.pop(0).aclose()

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context of its connections: the process's one trust store unless one
        was given (built on first use)."""
        if self._ssl is None:
            self._ssl = trust_context()
        return self._ssl

    async def _open_network(self, host: str, port: int, tls: bool) -> trio.abc.Stream:
        if not tls:
            return await open_tcp_stream(host, port)
        return await open_tls_stream(host, port, self.ssl_context)


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


class QuietProbe:
    """httpcore's ``is_socket_readable`` for the socket under a stream, registered once. A
    stream without a socket (an in-memory one) is taken as quiet."""

    __slots__ = ("_poller", "_sock")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._sock = sock = _raw_socket(stream)
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

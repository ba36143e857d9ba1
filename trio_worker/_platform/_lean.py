"""The lean HTTP/1.1 client: one request path for every platform route.

See :mod:`._http` for why the worker has a client of its own. A request is built as one
bytes object (:mod:`._request`, the hot path); its answers are read by the one parser of
:mod:`._reading` (a strict fast path, h11 for everything else); the connection it runs on
is taken and given back by one rule (:mod:`._connection`): an idle connection is used
again only when it is quiet, and goes back to the pool only when h11 says both sides may
go on and nothing unasked-for came. A single request is a round of one: take, done,
stream, stop, progress and ping all share :meth:`LeanHttp.round`.

One deadline per request: the caller's cancel scope bounds the whole of it (connect,
write and every byte of the answer), never a timeout per read, so an answer that drips a
byte at a time cannot hold a request past its deadline. The connect alone also has its own
bound, ``connect_timeout``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, TypeAlias

import h11
import trio

from .._config import DEFAULT_CONNECT_TIMEOUT, MAX_ANSWER_BYTES
from .._exceptions import TransportError
from ._connection import Connection, ServerKinds, StaleConnection
from ._reading import Bounds, HttpResponse, read_answers
from ._request import Origin, RequestHeads, message
from ._socket import LeanSocketStream
from ._tls import open_tls_stream, trust_context

if TYPE_CHECKING:
    import ssl
    from collections.abc import Mapping, Sequence

#: ``(host, port, tls) -> stream``: how the lean client gets a connection.
StreamOpener: TypeAlias = Callable[[str, int, bool], Awaitable[trio.abc.Stream]]


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
        keep_body: int | None = None,
        servers: ServerKinds | None = None,
    ) -> None:
        """*keep_body*: bytes of each answer's body kept (see :meth:`round`), for a client
        whose answers matter by their status only. *servers*: what the origins' answers
        showed, shared with the worker's other clients (else this client's own)."""
        self._heads = RequestHeads(headers)
        self._keep_body = keep_body
        self._idle: dict[Origin, list[Connection]] = {}
        self._servers = ServerKinds() if servers is None else servers
        self._ssl = ssl_context
        self._open_stream = self._open_network if open_stream is None else open_stream
        self._connect_timeout = connect_timeout

    def __repr__(self) -> str:
        idle = sum(len(connections) for connections in self._idle.values())
        return f"<LeanHttp {idle} idle connection(s) to {len(self._idle)} origin(s)>"

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        await close_all([c for connections in idle.values() for c in connections])

    async def request(
        self, method: str, url: str, body: bytes = b"", *, max_body: int = MAX_ANSWER_BYTES
    ) -> HttpResponse:
        """One request; its answer.

        Raises:
            TransportError: for any failure below HTTP, an answer over *max_body* bytes
                of body included.
        """
        answers: list[HttpResponse] = []
        await self.round(method, [(url, body)], answers, max_body=max_body)
        return answers[0]

    async def pipeline(
        self,
        method: str,
        requests: list[tuple[str, bytes]],
        answers: list[HttpResponse],
        *,
        max_body: int = MAX_ANSWER_BYTES,
        keep_body: int | None = None,
    ) -> None:
        """Send every ``(url, body)`` request at once on one connection (HTTP/1.1
        pipelining), then read the answers in order (see :meth:`round`)."""
        if requests:
            await self.round(method, requests, answers, max_body=max_body, keep_body=keep_body)

    async def round(
        self,
        method: str,
        requests: list[tuple[str, bytes]],
        answers: list[HttpResponse],
        *,
        max_body: int = MAX_ANSWER_BYTES,
        keep_body: int | None = None,
    ) -> None:
        """Write every ``(url, body)`` request at once on one connection (a round of
        several is HTTP/1.1 pipelining), then read the answers in order, appending each to
        *answers* as it is read. The URLs may differ (the stream routes of several jobs)
        but must share one origin. Of each answer's body only its first *keep_body* bytes
        are kept (by default, the client's own *keep_body*, else all of it): the rest is
        read and dropped, so a round holds its requests, one read past an answer, and at
        most *keep_body* bytes per answer, however large the answers.

        *answers* is the caller's, so a caller whose deadline cut the reading still knows
        which requests were answered: the rest may or may not have been processed, as for
        a single request whose answer never came.

        Several requests share a write only once the origin has answered as a persistent
        HTTP/1.1 server does (any earlier answer of the worker's clients counts): until
        then the first goes alone, and the rest follow once its answer has shown it.

        Raises:
            TransportError: for any failure below HTTP; *answers* then holds the answers
                read before it, and the connection is closed.
            PipeliningUnsupported: the origin does not keep HTTP/1.1 connections (it
                answered in HTTP/1.0, or delimited an answer by closing): *answers* holds
                the answers to the requests sent, and the rest were not sent.
        """
        # The stream yields only when it has to wait (._socket): a request whose deadline
        # passed before it started must not go out.
        await trio.lowlevel.checkpoint_if_cancelled()
        if len(requests) == 1:
            url, body = requests[0]
            origin, head = self._heads.head(method, url)
            messages = [message(head, body)]
        else:
            # One job's batch repeats its URL: each distinct URL is split and checked once.
            heads = {url: self._heads.head(method, url) for url, _ in requests}
            origin = heads[requests[0][0]][0]
            for other, _ in heads.values():
                if other != origin:
                    raise TransportError(
                        f"cannot pipeline requests to {origin.where} and {other.where} "
                        "on one connection"
                    )
            refusal = self._servers.refusal(origin)
            if refusal is not None:
                raise refusal
            messages = [message(heads[url][1], body) for url, body in requests]
        keep = self._keep_body if keep_body is None else keep_body
        keep = max_body if keep is None else min(keep, max_body)
        bounds = Bounds(max_body, keep)
        sent = 0
        while sent < len(messages):
            connection = await self._connection(origin)
            # Until the origin has answered as a persistent HTTP/1.1 server does, a write
            # carries one request. One that is not (HTTP/1.0, answers delimited by the
            # close) would process what else a write put in its buffer and answer none of
            # it, and each request sent again would be processed twice.
            count = len(messages) - sent
            if count > 1 and not self._servers.pipelines(origin):
                count = 1
            wire = messages[sent] if count == 1 else b"".join(messages[sent : sent + count])
            if not await self._exchange(connection, method, wire, count, answers, bounds):
                continue  # stale: nothing of it was processed, it goes again
            sent += count
            if sent < len(messages) and (refusal := self._servers.refusal(origin)):
                raise refusal

    async def _exchange(
        self,
        connection: Connection,
        method: str,
        wire: bytes,
        count: int,
        answers: list[HttpResponse],
        bounds: Bounds,
    ) -> bool:
        """Write *wire* (*count* requests) on *connection* and read their answers into
        *answers*; False when the connection turned out stale (closed, nothing sent)."""
        connection.begin_exchange()
        try:
            try:
                await connection.stream.send_all(wire)
                clean = await read_answers(connection, method, count, answers, bounds)
            except (
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                OSError,
                h11.ProtocolError,
            ) as exc:
                raise connection.failure(exc) from exc
        # Connection.aclose closes the stream even when cancelled (it only raises
        # afterwards), so no connection outlives a cancelled or failed request and
        # none needs a shield.
        except StaleConnection:
            # The server closed it while it sat idle; nothing was processed, so the
            # request goes again on a fresh connection.
            await connection.aclose()
            return False
        except BaseException:
            self._servers.note(connection, answered=False)
            await connection.aclose()
            raise
        self._servers.note(connection, answered=True)
        # A server that is no persistent HTTP/1.1 one gets one request per connection.
        if clean and connection.end_exchange() and connection.not_persistent is None:
            self._idle.setdefault(connection.origin, []).append(connection)
        else:
            # A cancellation pending here loses the answer, as it would have one
            # checkpoint earlier while its last bytes were read.
            await connection.aclose()
        return True

    async def _connection(self, origin: Origin) -> Connection:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if connection.is_quiet():
                return connection
            # A byte on an idle connection is an answer nobody asked for (or the
            # server's close): never read as the next request's answer.
            await connection.aclose()
        with trio.move_on_after(self._connect_timeout) as scope:
            try:
                stream = await self._open_stream(origin.host, origin.port, origin.scheme == "https")
            except (OSError, trio.BrokenResourceError) as exc:
                raise TransportError(f"cannot connect to {origin.where}: {exc}") from exc
        if scope.cancelled_caught:
            raise TransportError(f"cannot connect to {origin.where}: timed out")
        return Connection(stream, origin)

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context of its connections: the process's one trust store unless one
        was given (built on first use: most workers never need one)."""
        if self._ssl is None:
            self._ssl = trust_context()
        return self._ssl

    async def _open_network(self, host: str, port: int, tls: bool) -> trio.abc.Stream:
        if not tls:
            return LeanSocketStream.adopt(await trio.open_tcp_stream(host, port))
        return await open_tls_stream(host, port, self.ssl_context)


class Closable(Protocol):
    async def aclose(self) -> None: ...


async def close_all(closables: Sequence[Closable]) -> None:
    """Close every one (connections, clients), even when cancelled part-way: each close
    still happens, and the cancellation is raised once they all have."""
    for index, closable in enumerate(closables):
        try:
            await closable.aclose()
        except BaseException:
            await close_all(closables[index + 1 :])
            raise

"""The HTTP the worker speaks: a lean HTTP/1.1 client on trio streams, and an httpx adapter.

Why a client of our own: the platform protocol is a handful of tiny requests to a few
fixed URLs, and every job costs at least two of them. httpx spends about 0.6-1.2 ms of CPU
per request on its general machinery (benchmarks/results: 468 jobs/s for a bare httpx
take+done loop against 2,397 for a raw one), which is the worker's whole budget at the
throughput docs/design.md §11 asks for. :class:`LeanHttp` builds each request as one bytes object,
keeps connections alive, and parses only what the protocol needs (status, headers,
Content-Length or chunked bodies).

:class:`HttpxHttp` keeps httpx for what the lean client does not do: proxies (when a
``*_PROXY`` variable is set) and injected transports (the in-process fake platform of the
virtual-time suite). Both raise the package's :class:`~trio_worker.TransportError` for
every failure below HTTP, so callers handle one family and never see ``httpx``.

Where connections come from is injectable: a :data:`StreamOpener` ``(host, port, tls) ->
stream`` replaces the TCP/TLS connect, so the virtual-time suite runs this very client
(keep-alive, parsing, error mapping) over in-memory streams to the fake platform.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeAlias
from urllib.parse import urlsplit

import httpx
import trio

from .._config import DEFAULT_CONNECT_TIMEOUT
from .._exceptions import TransportError
from ._quiet import own_request_async

if TYPE_CHECKING:
    from collections.abc import Mapping

RECEIVE_SIZE = 65536
MAX_HEADER_BYTES = 64 * 1024
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes


#: ``(host, port, tls) -> stream``: how the lean client gets a connection.
StreamOpener: TypeAlias = Callable[[str, int, bool], Awaitable[trio.abc.Stream]]
#: Wraps a backend (the virtual-time suite records every request the worker makes).
BackendWrapper: TypeAlias = Callable[["HttpBackend"], "HttpBackend"]


class HttpBackend(Protocol):
    async def request(self, method: str, url: str, body: bytes = b"") -> HttpResponse: ...

    async def aclose(self) -> None: ...


def proxy_configured(environ: Mapping[str, str]) -> bool:
    """True when a proxy variable is set: then only httpx knows how to reach the platform."""
    return any(environ.get(name) or environ.get(name.lower()) for name in _PROXY_VARIABLES)


class HttpxHttp:
    """The backend over an ``httpx.AsyncClient`` (proxies, injected transports)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    @own_request_async
    async def request(self, method: str, url: str, body: bytes = b"") -> HttpResponse:
        try:
            async with self._client.stream(method, url, content=body or None) as response:
                # Raw bytes: the protocol's bodies are JSON, and a body httpx cannot decode
                # must not hide the status of an otherwise good answer.
                try:
                    raw = b"".join([chunk async for chunk in response.aiter_raw()])
                except httpx.StreamConsumed:
                    raw = response.content  # built in memory (MockTransport)
                return HttpResponse(response.status_code, dict(response.headers), raw)
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self._client.aclose()


@dataclass
class _Connection:
    stream: trio.abc.Stream
    buffer: bytearray = field(default_factory=bytearray)
    reused: bool = False
    # Whether any byte of the current request's answer arrived: only a connection that
    # answered nothing at all may be called stale and the request sent again.
    answered: bool = False

    async def receive_more(self) -> bool:
        data = await self.stream.receive_some(RECEIVE_SIZE)
        if not data:
            return False
        self.answered = True
        self.buffer += data
        return True

    @property
    def stale(self) -> bool:
        return self.reused and not self.answered


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


class _StaleConnection(Exception):
    """A kept-alive connection the server had already closed; retry on a fresh one."""


class LeanHttp:
    """A small keep-alive HTTP/1.1 client on trio streams.

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
    ) -> None:
        self._static = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None
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
        head = f"{method} {target} HTTP/1.1\r\nHost: {origin.host_header}\r\n{self._static}"
        try:
            return origin, head.encode("latin-1")
        except UnicodeEncodeError as exc:
            raise TransportError(f"cannot send {url!r} in an HTTP head: {exc}") from None

    async def request(self, method: str, url: str, body: bytes = b"") -> HttpResponse:
        origin, head = self._prefix(method, url)
        message = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
        while True:
            connection = await self._connection(origin)
            try:
                response, reusable = await self._exchange(connection, method, message)
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
            return response

    async def _connection(self, origin: _Origin) -> _Connection:
        idle = self._idle.get(origin)
        if idle:
            return idle.pop()
        where = f"{origin.host}:{origin.port}"
        with trio.move_on_after(self._connect_timeout) as scope:
            try:
                stream = await self._open_stream(origin.host, origin.port, origin.scheme == "https")
            except (OSError, trio.BrokenResourceError) as exc:
                raise TransportError(f"cannot connect to {where}: {exc}") from exc
        if scope.cancelled_caught:
            raise TransportError(f"cannot connect to {where}: timed out")
        return _Connection(stream)

    async def _open_network(self, host: str, port: int, tls: bool) -> trio.abc.Stream:
        if not tls:
            return await trio.open_tcp_stream(host, port)
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return await trio.open_ssl_over_tcp_stream(host, port, ssl_context=self._ssl)

    async def _exchange(
        self, connection: _Connection, method: str, message: bytes
    ) -> tuple[HttpResponse, bool]:
        connection.answered = False
        try:
            await connection.stream.send_all(message)
            status, headers, http10 = await self._read_head(connection)
            body, complete = await self._read_body(connection, method, status, headers)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            if connection.stale:
                raise _StaleConnection from exc
            raise TransportError(f"connection lost: {exc!r}") from exc
        keep = headers.get("connection", "").lower()
        reusable = complete and not connection.buffer and keep != "close"
        if http10 and keep != "keep-alive":
            reusable = False
        return HttpResponse(status, headers, body), reusable

    async def _read_head(self, connection: _Connection) -> tuple[int, dict[str, str], bool]:
        while True:  # skips 1xx interim answers
            end = connection.buffer.find(b"\r\n\r\n")
            while end < 0:
                if len(connection.buffer) > MAX_HEADER_BYTES:
                    raise TransportError("response head too large")
                if not await connection.receive_more():
                    if connection.stale:
                        raise _StaleConnection
                    raise TransportError("server closed the connection early")
                end = connection.buffer.find(b"\r\n\r\n")
            if end > MAX_HEADER_BYTES:
                raise TransportError("response head too large")
            head = bytes(connection.buffer[:end]).decode("latin-1")
            del connection.buffer[: end + 4]
            lines = head.split("\r\n")
            try:
                version, code = lines[0].split(" ", 2)[:2]
                status = int(code)
            except ValueError:
                raise TransportError(f"bad status line {lines[0]!r}") from None
            if not version.startswith("HTTP/1."):
                raise TransportError(f"unsupported protocol {version!r}")
            if 100 <= status < 200:
                continue
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep:
                    raise TransportError(f"bad header line {line!r}")
                headers[name.strip().lower()] = value.strip()
            return status, headers, version == "HTTP/1.0"

    async def _read_body(
        self, connection: _Connection, method: str, status: int, headers: dict[str, str]
    ) -> tuple[bytes, bool]:
        if method == "HEAD" or status in (204, 304):
            return b"", True
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return await self._read_chunked(connection), True
        length = headers.get("content-length")
        if length is not None:
            size = int(length) if length.isascii() and length.isdigit() else -1
            if size < 0:
                raise TransportError(f"bad Content-Length {length!r}")
            while len(connection.buffer) < size:
                if not await connection.receive_more():
                    raise TransportError("body shorter than Content-Length")
            body = bytes(connection.buffer[:size])
            del connection.buffer[:size]
            return body, True
        while await connection.receive_more():  # delimited by the connection's end
            pass
        body = bytes(connection.buffer)
        connection.buffer.clear()
        return body, False

    async def _read_chunked(self, connection: _Connection) -> bytes:
        body = bytearray()
        while True:
            line = await self._read_line(connection)
            digits = line.split(";", 1)[0].strip()
            try:
                size = int(digits, 16) if digits.isascii() and digits.isalnum() else -1
            except ValueError:
                size = -1
            if size < 0:
                raise TransportError(f"bad chunk size {line!r}")
            if size == 0:
                while await self._read_line(connection):  # trailers, then the empty line
                    pass
                return bytes(body)
            while len(connection.buffer) < size + 2:
                if not await connection.receive_more():
                    raise TransportError("chunked body cut short")
            body += connection.buffer[:size]
            del connection.buffer[: size + 2]

    async def _read_line(self, connection: _Connection) -> str:
        end = connection.buffer.find(b"\r\n")
        while end < 0:
            if not await connection.receive_more():
                raise TransportError("connection closed inside a chunked body")
            end = connection.buffer.find(b"\r\n")
        line = bytes(connection.buffer[:end]).decode("latin-1")
        del connection.buffer[: end + 2]
        return line


async def _close_all(streams: list[trio.abc.Stream]) -> None:
    """Close every stream, even when cancelled part-way: each close still happens, and
    the cancellation is raised once they all have."""
    for index, stream in enumerate(streams):
        try:
            await trio.aclose_forcefully(stream)
        except BaseException:
            await _close_all(streams[index + 1 :])
            raise


def make_backend(
    headers: Mapping[str, str],
    *,
    transport: httpx.AsyncBaseTransport | None,
    open_stream: StreamOpener | None = None,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    environ: Mapping[str, str] | None = None,
    max_connections: int | None = None,
) -> HttpBackend:
    """The lean client, unless a transport is injected or a proxy must be honoured.

    An injected *open_stream* wins over a proxy variable: the streams it opens are the
    network.
    """
    env = os.environ if environ is None else environ
    if transport is None and (open_stream is not None or not proxy_configured(env)):
        return LeanHttp(headers, open_stream=open_stream, connect_timeout=connect_timeout)
    client = httpx.AsyncClient(
        headers=dict(headers),
        transport=transport,
        # Every request is bounded by a cancel scope; httpx's per-read timeout would cut
        # a legitimate long-poll short.
        timeout=httpx.Timeout(connect=connect_timeout, read=None, write=10.0, pool=10.0),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=64),
    )
    return HttpxHttp(client)

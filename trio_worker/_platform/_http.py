"""The HTTP the worker speaks: a lean HTTP/1.1 client on trio streams, and an httpx adapter.

Why a client of our own: the platform protocol is a handful of tiny requests to a few
fixed URLs, and every job costs at least two of them. httpx spends about 0.6-1.2 ms of CPU
per request on its general machinery (benchmarks/results: 468 jobs/s for a bare httpx
take+done loop against 2,397 for a raw one), which is the worker's whole budget at the
throughput docs/design.md §11 asks for. :class:`LeanHttp` builds each request as one bytes
object and keeps connections alive; the answers are parsed by h11, the parser httpx itself
uses and whose maintainers keep it hardened, so the worker rejects what RFC 9112 says a
client must reject (bad chunk sizes, bytes after chunk data, conflicting Content-Lengths,
transfer codings other than chunked) and reuses a connection only when h11 says both sides
may go on (``Connection: close``, HTTP/1.0).

:class:`HttpxHttp` keeps httpx for what the lean client does not do: proxies (when a
``*_PROXY`` variable is set) and injected transports (the in-process fake platform of the
virtual-time suite). Both raise the package's :class:`~trio_worker.TransportError` for
every failure below HTTP, so callers handle one family and never see ``httpx`` or ``h11``.
Both read at most ``max_body`` bytes of an answer (docs/protocol.md §2.0).

Where connections come from is injectable: a :data:`StreamOpener` ``(host, port, tls) ->
stream`` replaces the TCP/TLS connect, so the virtual-time suite runs this very client
(keep-alive, parsing, error mapping) over in-memory streams to the fake platform.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

import httpx

from .._config import DEFAULT_CONNECT_TIMEOUT, MAX_ANSWER_BYTES
from .._exceptions import TransportError
from ._answer import MAX_HEADER_BYTES, MAX_HEADER_COUNT
from ._lean import (
    RECEIVE_SIZE,
    HttpResponse,
    LeanHttp,
    StreamOpener,
    check_headers,
    check_size,
)
from ._quiet import own_request_async
from ._tls import trust_context

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_HEADER_COUNT",
    "RECEIVE_SIZE",
    "BackendWrapper",
    "HttpBackend",
    "HttpResponse",
    "HttpxHttp",
    "LeanHttp",
    "PipeliningBackend",
    "StreamOpener",
    "make_backend",
    "proxy_configured",
]

_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


#: Wraps a backend (the virtual-time suite records every request the worker makes).
BackendWrapper: TypeAlias = Callable[["HttpBackend"], "HttpBackend"]


class HttpBackend(Protocol):
    async def request(
        self, method: str, url: str, body: bytes = b"", *, max_body: int = MAX_ANSWER_BYTES
    ) -> HttpResponse:
        """One request; an answer body over *max_body* bytes is a :class:`TransportError`."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class PipeliningBackend(HttpBackend, Protocol):
    """A backend that can write several requests at once on one connection (the lean
    client; httpx cannot)."""

    async def pipeline(
        self,
        method: str,
        requests: list[tuple[str, bytes]],
        answers: list[HttpResponse],
        *,
        max_body: int = MAX_ANSWER_BYTES,
    ) -> None:
        """See :meth:`LeanHttp.pipeline`."""
        ...


def proxy_configured(environ: Mapping[str, str]) -> bool:
    """True when a proxy variable is set: then only httpx knows how to reach the platform."""
    return any(environ.get(name) or environ.get(name.lower()) for name in _PROXY_VARIABLES)


class HttpxHttp:
    """The backend over an ``httpx.AsyncClient`` (proxies, injected transports)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    @own_request_async
    async def request(
        self, method: str, url: str, body: bytes = b"", *, max_body: int = MAX_ANSWER_BYTES
    ) -> HttpResponse:
        try:
            async with self._client.stream(method, url, content=body or None) as response:
                # Raw bytes: the protocol's bodies are JSON, and a body httpx cannot decode
                # must not hide the status of an otherwise good answer.
                raw = bytearray()
                try:
                    async for chunk in response.aiter_raw():
                        raw += chunk
                        check_size(len(raw), max_body, method, url, response.status_code, [raw])
                except httpx.StreamConsumed:
                    raw = bytearray(response.content)  # built in memory (MockTransport)
                    check_size(len(raw), max_body, method, url, response.status_code, [raw])
                return HttpResponse(response.status_code, dict(response.headers), bytes(raw))
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self._client.aclose()


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
    check_headers(headers)  # for httpx too: its errors would quote the API key
    env = os.environ if environ is None else environ
    if transport is None and (open_stream is not None or not proxy_configured(env)):
        return LeanHttp(headers, open_stream=open_stream, connect_timeout=connect_timeout)
    client = httpx.AsyncClient(
        headers=dict(headers),
        transport=transport,
        verify=trust_context(),  # the one trust store of every client
        # Every request is bounded by a cancel scope; httpx's per-read timeout would cut
        # a legitimate long-poll short.
        timeout=httpx.Timeout(connect=connect_timeout, read=None, write=10.0, pool=10.0),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=64),
    )
    return HttpxHttp(client)

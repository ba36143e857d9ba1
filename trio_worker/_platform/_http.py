"""The HTTP the worker speaks: one lean HTTP/1.1 client on trio streams, httpx behind a proxy.

Why a client of our own: the platform protocol is a handful of tiny requests to a few
fixed URLs, and every job costs at least two of them. httpx spends about 0.6-1.2 ms of CPU
per request on its general machinery (benchmarks/results: 468 jobs/s for a bare httpx
take+done loop against 2,397 for a raw one), which is the worker's whole budget at the
throughput docs/design.md §11 asks for. :class:`LeanHttp` carries every platform route
(take, done, stream, stop, progress and the heartbeat's ping) on one request path, one
parser and one connection-reuse rule (:mod:`._lean`).

:class:`~._proxy.HttpxHttp` keeps httpx for the one thing the lean client does not do: a
proxy, for the origins the ``*_PROXY`` variables send through one (:mod:`._routes`, by the
one reading of them, :mod:`trio_worker._proxies`); :mod:`._proxy` is imported only then, so
a worker with no proxy never imports httpx. Both raise the package's
:class:`~trio_worker.TransportError` for every failure below HTTP, so callers handle one
family and never see ``httpx`` or ``h11``. Both read at most ``max_body`` bytes of an
answer (docs/protocol.md §2.0).

Where connections come from is injectable: a :data:`StreamOpener` ``(host, port, tls) ->
stream`` replaces the TCP/TLS connect, so tests and the virtual-time suite run this very
client (keep-alive, parsing, error mapping) over in-memory streams to the fake platform
(:func:`trio_worker.testing.memory_network`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

from .._config import DEFAULT_CONNECT_TIMEOUT, MAX_ANSWER_BYTES
from .._proxies import any_proxy_configured
from ._answer import MAX_HEADER_BYTES, MAX_HEADER_COUNT
from ._connection import RECEIVE_SIZE, ServerKinds
from ._lean import LeanHttp, StreamOpener
from ._reading import HttpResponse
from ._request import check_headers
from ._routes import ProxyRoutes

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_HEADER_COUNT",
    "RECEIVE_SIZE",
    "BackendWrapper",
    "HttpBackend",
    "HttpResponse",
    "LeanHttp",
    "PipeliningBackend",
    "StreamOpener",
    "make_backend",
]

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
    client, and the routes over it; httpx cannot). It raises
    :class:`~._connection.PipeliningUnsupported` when the platform cannot take them."""

    async def pipeline(
        self,
        method: str,
        requests: list[tuple[str, bytes]],
        answers: list[HttpResponse],
        *,
        max_body: int = MAX_ANSWER_BYTES,
        keep_body: int | None = None,
    ) -> None:
        """See :meth:`LeanHttp.round`."""
        ...


def make_backend(
    headers: Mapping[str, str],
    *,
    open_stream: StreamOpener | None = None,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    environ: Mapping[str, str] | None = None,
    max_connections: int | None = None,
    keep_body: int | None = None,
    servers: ServerKinds | None = None,
) -> HttpBackend:
    """The lean client; with a proxy variable set, one that routes each origin direct
    (the lean client) or through its proxy (httpx, which knows how):
    :class:`._routes.ProxyRoutes`, by the rules of :func:`trio_worker._proxies.proxy_for`.

    An injected *open_stream* wins over a proxy variable: the streams it opens are the
    network. *keep_body*: bytes of each answer's body kept (the rest read and dropped).
    *servers*: what the origins' answers showed, shared by the clients of one worker.
    """
    check_headers(headers)  # for httpx too: its errors would quote the API key
    env = os.environ if environ is None else environ
    if open_stream is not None or not any_proxy_configured(env):
        return LeanHttp(
            headers,
            open_stream=open_stream,
            connect_timeout=connect_timeout,
            keep_body=keep_body,
            servers=servers,
        )
    return ProxyRoutes(
        headers,
        env,
        connect_timeout=connect_timeout,
        max_connections=max_connections,
        keep_body=keep_body,
        servers=servers,
    )

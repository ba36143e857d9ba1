"""The platform client through a proxy: httpx, the one client that knows how to use one.

Used only for an origin :func:`trio_worker._proxies.proxy_for` sends through a proxy
(:class:`._routes.ProxyRoutes`): httpx is about 30 ms of a worker's start-up
(``python -X importtime``) that a worker without a proxy never uses. :class:`HttpxHttp`
speaks the same :class:`._http.HttpBackend` as the lean client, and raises the package's
:class:`~trio_worker.TransportError` for every failure below HTTP, so callers never see
``httpx``. httpx is told its proxy; it reads no proxy variable itself (``trust_env``
off), so the worker's one reading of them holds (docs/reference.md, "Proxies").

A proxy that wants credentials answers 407 (to the request itself on an ``http://``
platform, to the tunnel's CONNECT on an ``https://`` one). The platform never saw the
request, so it is a :class:`~trio_worker.TransportError` like any failure to reach it: a
report is retried within its budget, never dropped as if the platform had refused it. One
line per proxy says what to fix, with the proxy's credentials hidden.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import httpx

from .._config import MAX_ANSWER_BYTES
from .._exceptions import TransportError
from ._quiet import own_request_async
from ._reading import HttpResponse
from ._request import check_size
from ._tls import trust_context

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._proxies import Proxy

__all__ = ["HttpxHttp", "proxy_backend"]

log = logging.getLogger("trio_worker")

PROXY_AUTHENTICATION_REQUIRED = 407
# Proxies whose 407 has been explained in the log (once per process each).
_explained: set[str] = set()


def proxy_backend(
    headers: Mapping[str, str],
    proxy: Proxy,
    connect_timeout: float,
    max_connections: int | None,
    keep_body: int | None,
) -> HttpxHttp:
    """The httpx client for the origins that go through *proxy*."""
    client = httpx.AsyncClient(
        headers=dict(headers),
        proxy=proxy.url,
        trust_env=False,  # the proxy is ours to pick (trio_worker._proxies), not httpx's
        verify=trust_context(),  # the one trust store of every client
        # Every request is bounded by a cancel scope; httpx's per-read timeout would cut
        # a legitimate long-poll short.
        timeout=httpx.Timeout(connect=connect_timeout, read=None, write=10.0, pool=10.0),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=64),
    )
    return HttpxHttp(client, keep_body, proxy=proxy)


def refused_by_proxy(proxy: Proxy) -> TransportError:
    """The error of a request the proxy refused with 407, and the one line that says
    what to fix (the first time for each proxy)."""
    if proxy.url not in _explained:
        _explained.add(proxy.url)
        log.error(
            "the proxy %s (from %s) answered 407 Proxy Authentication Required: put its "
            "user name and password in %s (http://user:password@host:port); the worker's "
            "requests fail until it accepts them, reports are retried meanwhile",
            proxy.shown,
            proxy.variable,
            proxy.variable,
        )
    return TransportError(
        f"the proxy {proxy.shown} refused the request: 407 Proxy Authentication Required"
    )


class HttpxHttp:
    """The backend over an ``httpx.AsyncClient``, for the origins behind a proxy only."""

    def __init__(
        self, client: httpx.AsyncClient, keep_body: int | None = None, *, proxy: Proxy | None = None
    ) -> None:
        self._client = client
        self._keep_body = keep_body
        self._proxy = proxy

    @own_request_async
    async def request(
        self, method: str, url: str, body: bytes = b"", *, max_body: int = MAX_ANSWER_BYTES
    ) -> HttpResponse:
        try:
            async with self._client.stream(method, url, content=body or None) as response:
                if response.status_code == PROXY_AUTHENTICATION_REQUIRED and self._proxy:
                    raise refused_by_proxy(self._proxy)
                # Raw bytes: the protocol's bodies are JSON, and a body httpx cannot decode
                # must not hide the status of an otherwise good answer.
                keep = max_body if self._keep_body is None else min(self._keep_body, max_body)
                raw = bytearray()
                size = 0
                try:
                    async for chunk in response.aiter_raw():
                        size += len(chunk)
                        check_size(size, max_body, method, url, response.status_code, [raw])
                        if len(raw) < keep:
                            raw += chunk[: keep - len(raw)]
                except httpx.StreamConsumed:
                    raw = bytearray(response.content)  # built in memory (MockTransport)
                    check_size(len(raw), max_body, method, url, response.status_code, [raw])
                    del raw[keep:]
                return HttpResponse(response.status_code, dict(response.headers), bytes(raw))
        except httpx.ProxyError as exc:
            # httpcore words a refused CONNECT as "<status> <reason>".
            if self._proxy is not None and str(exc).startswith(f"{PROXY_AUTHENTICATION_REQUIRED} "):
                raise refused_by_proxy(self._proxy) from exc
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self._client.aclose()

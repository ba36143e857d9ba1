"""A client for a worker with proxy variables set: each origin direct, or through its proxy.

:func:`trio_worker._proxies.proxy_for` decides, per origin (scheme, host and port), once:
direct requests go on the lean client as in a worker with no proxy at all (pipelined
stream chunks included); proxied ones on an httpx client for that proxy
(:mod:`._proxy`, imported only when an origin needs one). So ``NO_PROXY=api.runpod.ai``
keeps the platform's traffic on the lean client while ``HTTPS_PROXY`` still serves what
the handler downloads, and the platform's loopback twin in a local run is never proxied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._config import MAX_ANSWER_BYTES
from .._proxies import proxy_for
from ._connection import PipeliningUnsupported, ServerKinds
from ._lean import LeanHttp, close_all

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._proxy import HttpxHttp
    from ._reading import HttpResponse

__all__ = ["ProxyRoutes"]


class ProxyRoutes:
    """A backend (``_http.HttpBackend``) over the lean client and one httpx client per
    proxy."""

    def __init__(
        self,
        headers: Mapping[str, str],
        environ: Mapping[str, str],
        *,
        connect_timeout: float,
        max_connections: int | None,
        keep_body: int | None,
        servers: ServerKinds | None = None,
    ) -> None:
        self._headers = dict(headers)
        self._environ = dict(environ)  # read once: a worker's proxies do not move
        self._connect_timeout = connect_timeout
        self._max_connections = max_connections
        self._keep_body = keep_body
        self._direct = LeanHttp(
            headers, connect_timeout=connect_timeout, keep_body=keep_body, servers=servers
        )
        self._origins: dict[str, LeanHttp | HttpxHttp] = {}  # "scheme://host:port" -> its client
        self._proxied: dict[str, HttpxHttp] = {}  # proxy URL -> its client

    def __repr__(self) -> str:
        proxied = sum(backend is not self._direct for backend in self._origins.values())
        return f"<ProxyRoutes {len(self._origins) - proxied} direct, {proxied} proxied origin(s)>"

    def route(self, url: str) -> LeanHttp | HttpxHttp:
        """The client that carries requests to *url*'s origin."""
        scheme, _, rest = url.partition("://")
        origin = f"{scheme}://{rest.partition('/')[0].partition('?')[0]}"
        backend = self._origins.get(origin)
        if backend is None:
            backend = self._origins[origin] = self._backend_for(url)
        return backend

    def _backend_for(self, url: str) -> LeanHttp | HttpxHttp:
        proxy = proxy_for(url, self._environ)
        if proxy is None:
            return self._direct
        backend = self._proxied.get(proxy.url)
        if backend is None:
            # Only here, when some origin needs a proxy: importing httpx costs start-up time
            # (docs/benchmarks.md) that a worker which never uses it should not pay.
            from ._proxy import proxy_backend

            backend = self._proxied[proxy.url] = proxy_backend(
                self._headers,
                proxy,
                self._connect_timeout,
                self._max_connections,
                self._keep_body,
            )
        return backend

    async def request(
        self, method: str, url: str, body: bytes = b"", *, max_body: int = MAX_ANSWER_BYTES
    ) -> HttpResponse:
        return await self.route(url).request(method, url, body, max_body=max_body)

    async def pipeline(
        self,
        method: str,
        requests: list[tuple[str, bytes]],
        answers: list[HttpResponse],
        *,
        max_body: int = MAX_ANSWER_BYTES,
        keep_body: int | None = None,
    ) -> None:
        """Pipelined on the lean client when the origin is direct; through a proxy,
        :class:`PipeliningUnsupported` before anything is sent (httpx never pipelines)."""
        if not requests:
            return
        backend = self.route(requests[0][0])
        if backend is not self._direct:
            raise PipeliningUnsupported("requests to the platform go through a proxy")
        await self._direct.pipeline(
            method, requests, answers, max_body=max_body, keep_body=keep_body
        )

    async def aclose(self) -> None:
        backends: list[LeanHttp | HttpxHttp] = [self._direct, *self._proxied.values()]
        self._origins.clear()
        self._proxied.clear()
        await close_all(backends)

"""The client of a worker with proxy variables set: each origin direct (the pool, pipelining
included) or through its proxy (httpx), as :func:`trio_worker._proxies.proxy_for` decides,
once per origin (docs/reference.md, "Proxies"). Imported only with a proxy variable set,
and httpx only once an origin needs a proxy (its start-up cost: docs/benchmarks.md).
:class:`HttpxHttp` raises the package's ``TransportError`` for every failure below HTTP, a
proxy's 407 included (the platform never saw the request), so callers never see httpx.
"""

from __future__ import annotations

import contextvars
import logging
from typing import TYPE_CHECKING, Protocol

from .._config import MAX_ANSWER_BYTES
from .._exceptions import TransportError
from .._proxies import proxy_for
from ._connection import HttpBackend, HttpResponse
from ._network import close_all, trust_context
from ._request import PipeliningUnsupported, too_large

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import httpx

    from .._proxies import Proxy

__all__ = ["HttpxHttp", "ProxyRoutes"]


class DirectPool(HttpBackend, Protocol):
    """What this module needs of :class:`._http.HttpPool`: its requests and its limits."""

    connect_timeout: float
    max_connections: int
    keepalive_expiry: float
    keep_body: int | None


log = logging.getLogger("trio_worker")

PROXY_AUTHENTICATION_REQUIRED = 407
# Proxies whose 407 has been explained in the log (once per process each).
_explained: set[str] = set()


class ProxyRoutes:
    """A backend (``_http.HttpBackend``) over the pool and one httpx client per proxy."""

    def __init__(
        self, pool: DirectPool, headers: Mapping[str, str], environ: Mapping[str, str]
    ) -> None:
        self._pool = pool
        self._headers = dict(headers)
        self._environ = dict(environ)  # read once: a worker's proxies do not move
        self._origins: dict[str, DirectPool | HttpxHttp] = {}  # "scheme://host:port" -> client
        self._proxied: dict[str, HttpxHttp] = {}  # proxy URL -> its client

    def __repr__(self) -> str:
        proxied = sum(backend is not self._pool for backend in self._origins.values())
        return f"<ProxyRoutes {len(self._origins) - proxied} direct, {proxied} proxied origin(s)>"

    def route(self, url: str) -> DirectPool | HttpxHttp:
        """The client that carries requests to *url*'s origin."""
        scheme, _, rest = url.partition("://")
        origin = f"{scheme}://{rest.partition('/')[0].partition('?')[0]}"
        backend = self._origins.get(origin)
        if backend is None:
            backend = self._origins[origin] = self._backend_for(url)
        return backend

    def _backend_for(self, url: str) -> DirectPool | HttpxHttp:
        proxy = proxy_for(url, self._environ)
        if proxy is None:
            return self._pool
        backend = self._proxied.get(proxy.url)
        if backend is None:
            backend = self._proxied[proxy.url] = HttpxHttp.through(proxy, self._headers, self._pool)
        return backend

    async def exchange(
        self,
        method: str,
        requests: Sequence[tuple[str, bytes]],
        answers: list[HttpResponse] | None = None,
        *,
        max_body: int = MAX_ANSWER_BYTES,
        keep_body: int | None = None,
    ) -> list[HttpResponse]:
        """On the pool when the origin is direct; through a proxy, one request at a time
        (several: :class:`PipeliningUnsupported` before anything is sent)."""
        answers = [] if answers is None else answers
        if requests:
            await self.route(requests[0][0]).exchange(
                method, requests, answers, max_body=max_body, keep_body=keep_body
            )
        return answers

    async def aclose(self) -> None:
        backends: list[DirectPool | HttpxHttp] = [self._pool, *self._proxied.values()]
        self._origins.clear()
        self._proxied.clear()
        await close_all(backends)


class HttpxHttp:
    """The backend over an ``httpx.AsyncClient``, for the origins behind a proxy only."""

    def __init__(
        self, client: httpx.AsyncClient, keep_body: int | None = None, *, proxy: Proxy | None = None
    ) -> None:
        self._client = client
        self._keep_body = keep_body
        self._proxy = proxy
        _quiet_their_loggers()

    @classmethod
    def through(cls, proxy: Proxy, headers: Mapping[str, str], pool: DirectPool) -> HttpxHttp:
        """The httpx client for the origins that go through *proxy*, with *pool*'s limits."""
        import httpx

        client = httpx.AsyncClient(
            headers=dict(headers),
            proxy=proxy.url,
            trust_env=False,  # the proxy is ours to pick (trio_worker._proxies), not httpx's
            verify=trust_context(),  # the one trust store of every client
            # Every request is bounded by a cancel scope; httpx's per-read timeout would cut
            # a legitimate long-poll short.
            timeout=httpx.Timeout(connect=pool.connect_timeout, read=None, write=10.0, pool=10.0),
            limits=httpx.Limits(
                max_connections=pool.max_connections,
                max_keepalive_connections=pool.max_connections,
                keepalive_expiry=pool.keepalive_expiry,
            ),
        )
        return cls(client, pool.keep_body, proxy=proxy)

    async def exchange(
        self,
        method: str,
        requests: Sequence[tuple[str, bytes]],
        answers: list[HttpResponse] | None = None,
        *,
        max_body: int = MAX_ANSWER_BYTES,
        keep_body: int | None = None,
    ) -> list[HttpResponse]:
        """One request (httpx never pipelines: several raise
        :class:`PipeliningUnsupported` before anything is sent)."""
        answers = [] if answers is None else answers
        if len(requests) > 1:
            raise PipeliningUnsupported("requests to the platform go through a proxy")
        for url, body in requests:
            token = _own_request.set(True)
            try:
                answers.append(await self._request(method, url, body, max_body, keep_body))
            finally:
                _own_request.reset(token)
        return answers

    async def _request(
        self, method: str, url: str, body: bytes, max_body: int, keep_body: int | None
    ) -> HttpResponse:
        import httpx

        keep = self._keep_body if keep_body is None else keep_body
        keep = max_body if keep is None else min(keep, max_body)
        try:
            async with self._client.stream(method, url, content=body or None) as response:
                status = response.status_code
                if status == PROXY_AUTHENTICATION_REQUIRED and self._proxy:
                    raise refused_by_proxy(self._proxy)
                # Raw bytes: the protocol's bodies are JSON, and a body httpx cannot decode
                # must not hide the status of an otherwise good answer.
                raw = bytearray()
                size = 0
                try:
                    async for chunk in response.aiter_raw():
                        size += len(chunk)
                        if size > max_body:
                            raise too_large(size, max_body, f"{method} {url}", status, [raw])
                        if len(raw) < keep:
                            raw += chunk[: keep - len(raw)]
                except httpx.StreamConsumed:
                    raw = bytearray(response.content)  # built in memory (MockTransport)
                    if len(raw) > max_body:
                        raise too_large(
                            len(raw), max_body, f"{method} {url}", status, [raw]
                        ) from None
                    del raw[keep:]
                return HttpResponse(status, dict(response.headers), bytes(raw))
        except httpx.ProxyError as exc:
            # httpcore words a refused CONNECT as "<status> <reason>".
            if self._proxy is not None and str(exc).startswith(f"{PROXY_AUTHENTICATION_REQUIRED} "):
                raise refused_by_proxy(self._proxy) from exc
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self._client.aclose()


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


# -- httpx's log lines for the worker's own requests ----------------------------------------

# The loggers httpx and httpcore log requests on (a filter acts only on the logger a
# record is made on, not on records that propagate through it, so each is named).
HTTP_LOGGERS = (
    "httpx",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
)

_own_request: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "trio_worker_own_request", default=False
)


class DropOwnRequests(logging.Filter):
    """Drops httpx's and httpcore's per-request records below WARNING of the SDK's own
    requests (marked by a context variable, never the user's), unless the user set one of
    those loggers' levels: an application that sets the root to INFO (``import runpod``
    does) would get a line per take."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or not _own_request.get():
            return True
        return level_set_by_user(record.name)


def level_set_by_user(name: str) -> bool:
    """Whether *name* or one of its ancestors below the root has a level of its own."""
    logger: logging.Logger | None = logging.getLogger(name)
    root = logging.getLogger()
    while logger is not None and logger is not root:
        if logger.level != logging.NOTSET:
            return True
        logger = logger.parent
    return False


_FILTER = DropOwnRequests()


def _quiet_their_loggers() -> None:
    """Put the filter on httpx's and httpcore's loggers (idempotent)."""
    for name in HTTP_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)

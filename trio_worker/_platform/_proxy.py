"""The platform client behind a proxy: httpx, the one client that knows how to use one.

Imported only when a ``*_PROXY`` variable is set (:func:`._http.make_backend`): httpx is
about 30 ms of a worker's start-up (``python -X importtime``) that a worker without a proxy
never uses. :class:`HttpxHttp` speaks the same :class:`._http.HttpBackend` as the lean
client, and raises the package's :class:`~trio_worker.TransportError` for every failure
below HTTP, so callers never see ``httpx``.
"""

from __future__ import annotations

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

__all__ = ["HttpxHttp", "proxy_backend"]


def proxy_backend(
    headers: Mapping[str, str],
    connect_timeout: float,
    max_connections: int | None,
    keep_body: int | None,
) -> HttpxHttp:
    """The httpx client :func:`._http.make_backend` picks when a proxy is configured
    (httpx reads the ``*_PROXY`` variables itself)."""
    client = httpx.AsyncClient(
        headers=dict(headers),
        verify=trust_context(),  # the one trust store of every client
        # Every request is bounded by a cancel scope; httpx's per-read timeout would cut
        # a legitimate long-poll short.
        timeout=httpx.Timeout(connect=connect_timeout, read=None, write=10.0, pool=10.0),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=64),
    )
    return HttpxHttp(client, keep_body)


class HttpxHttp:
    """The backend over an ``httpx.AsyncClient``, for a configured proxy only."""

    def __init__(self, client: httpx.AsyncClient, keep_body: int | None = None) -> None:
        self._client = client
        self._keep_body = keep_body

    @own_request_async
    async def request(
        self, method: str, url: str, body: bytes = b"", *, max_body: int = MAX_ANSWER_BYTES
    ) -> HttpResponse:
        try:
            async with self._client.stream(method, url, content=body or None) as response:
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
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self._client.aclose()

"""The platform, as the fitness checks see it: can it be reached, and the unhealthy ping.

``_network_check`` dials what the worker will use, not the reference's ``8.8.8.8:53``
(docs/reference.md, "Fitness checks"), through the proxy rule every connection follows
(:func:`trio_worker._proxies.proxy_for`). The unhealthy ping (docs/protocol.md §7) goes
through the platform client's own request path, once, bounded, and never raises: the exit
that follows is the guarantee, not the report.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from urllib.parse import urlencode, urlsplit

import trio

from .._config import with_query
from .._exceptions import TransportError
from .._platform._client import PlatformClient
from .._platform._network import open_tls_stream, trust_context
from .._proxies import proxy_for
from .._version import __version__

if TYPE_CHECKING:
    from .._config import PlatformConfig, Timings
    from .._platform._http import StreamOpener

log = logging.getLogger("trio_worker")

# The reference's bound on the same report: it may delay the exit by this much at most.
UNHEALTHY_PING_BOUND = 2.0
REASON_LIMIT = 256


def dial_target(platform: PlatformConfig) -> tuple[str, int, bool]:
    """``(host, port, tls)`` that ``_network_check`` dials: the ping URL's (else the take
    URL's), or its proxy's."""
    url = platform.ping_url or platform.take_url
    if url is None:
        raise RuntimeError("no platform URL to dial (RUNPOD_WEBHOOK_GET_JOB is not set)")
    proxy = proxy_for(url, platform.proxies)
    if proxy is not None:
        host, port = proxy.address
        return host, port, proxy.scheme == "https"
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    if not parts.hostname:
        raise RuntimeError("the platform URL has no host")
    return parts.hostname, parts.port or (443 if tls else 80), tls


async def _open_network(host: str, port: int, tls: bool) -> trio.abc.Stream:
    if tls:
        return await open_tls_stream(host, port, trust_context())
    return await trio.open_tcp_stream(host, port)


async def check_platform_reachable(
    platform: PlatformConfig,
    timeout: float,
    *,
    open_stream: StreamOpener | None = None,
) -> None:
    """``_network_check``: one connection (and TLS handshake) within *timeout* seconds
    (``RUNPOD_NETWORK_CHECK_TIMEOUT``), closed at once."""
    host, port, tls = dial_target(platform)
    where = f"{host}:{port}{' (TLS)' if tls else ''}"
    opener = _open_network if open_stream is None else open_stream
    with trio.move_on_after(timeout) as scope:
        try:
            stream = await opener(host, port, tls)
        except (OSError, trio.BrokenResourceError, TransportError) as exc:
            raise RuntimeError(f"cannot reach the platform at {where}: {exc}") from None
        await trio.aclose_forcefully(stream)
    if scope.cancelled_caught:
        raise RuntimeError(
            f"cannot reach the platform at {where}: no connection within {timeout:g}s"
        )


def unhealthy_ping_url(ping_url: str, check: str, reason: str) -> str:
    """The ping URL with ``status=unhealthy&check=NAME&reason=TEXT`` (*reason* clipped to
    256 characters) and ``runpod_version``, the template's own query kept."""
    query = urlencode(
        {
            "status": "unhealthy",
            "check": check,
            "reason": reason[:REASON_LIMIT],
            "runpod_version": __version__,
        }
    )
    return with_query(ping_url, query)


async def send_unhealthy_ping(
    platform: PlatformConfig,
    timings: Timings,
    check: str,
    reason: str,
    *,
    open_stream: StreamOpener | None = None,
) -> bool:
    """One unhealthy ping; True when the platform answered 2xx. *reason* must be redacted.

    Nothing is sent without a ping URL or an API key, as in the reference.
    """
    if not platform.ping_url or not platform.api_key:
        log.debug("no unhealthy ping: RUNPOD_WEBHOOK_PING or RUNPOD_AI_API_KEY is not set")
        return False
    url = unhealthy_ping_url(platform.ping_url, check, reason)
    client = PlatformClient(platform, timings, open_stream=open_stream)
    status: int | None = None
    try:
        with trio.move_on_after(UNHEALTHY_PING_BOUND):
            try:
                [response] = await client.polls.exchange("GET", [(url, b"")])
                status = response.status
            except TransportError as exc:
                log.warning("unhealthy ping not sent: %s", exc)
                return False
    finally:
        # The client closes every connection even when cancelled, as the worker relies on.
        await client.aclose()
    if status is None:
        log.warning("unhealthy ping: no answer within %.0fs", UNHEALTHY_PING_BOUND)
    elif not 200 <= status < 300:
        log.warning("unhealthy ping answered HTTP %d", status)
    return status is not None and 200 <= status < 300

"""The platform protocol: take, stop, done, stream (docs/protocol.md §2).

Two HTTP clients, on purpose: long-polls (take, stop) use one, reports (done, stream,
progress) the other. Cancelling a long-poll can leak a pool slot under contention
(encode/httpcore#1093), and a report must never wait behind that.

Every request here is a single attempt except :meth:`PlatformClient.post_report`, which
retries connect errors, timeouts, 408, 429 and 5xx with exponential backoff and full jitter,
bounded in attempts. The caller bounds the total time with a shielded cancel scope, so the
deadline runs on trio's clock (MockClock-native) rather than on ``time.monotonic``.
"""

from __future__ import annotations

import functools
import logging
import platform
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from .._config import MAX_ANSWER_BYTES, MAX_TAKE_ANSWER_BYTES
from .._exceptions import PlatformError, RateLimited, TransportError
from .._version import __version__
from ._http import HttpResponse, make_backend
from ._wire import TakeResponse, parse_stop, parse_take

if TYPE_CHECKING:
    import httpx

    from .._config import PlatformConfig, Timings
    from ._http import BackendWrapper, StreamOpener

log = logging.getLogger("trio_worker")

USER_AGENT = f"trio_worker/{__version__} (Language/Python {platform.python_version()})"
# The reference sends JSON text under a form content type (docs/protocol.md §2.3); the platform
# parses the raw body. Sending the same keeps us byte-compatible with what it accepts.
REPORT_CONTENT_TYPE = "application/x-www-form-urlencoded"


def _retryable(status: int) -> bool:
    """408, 429 and every 5xx are worth another attempt (docs/design.md §5)."""
    return status >= 500 or status in (408, 429)


@dataclass(frozen=True)
class ReportOutcome:
    """How a report ended: acknowledged, or given up (with why)."""

    delivered: bool
    attempts: int
    last_error: str | None = None


def _retry_after(response: HttpResponse, default: float) -> float:
    raw = response.headers.get("retry-after")
    if raw is None:
        return default
    try:
        return max(0.0, min(float(raw), 60.0))
    except ValueError:
        return default


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2**attempt)]."""
    return random.uniform(0, min(cap, base * (2**attempt)))


class PlatformClient:
    """Speaks the worker routes for one worker.

    Production passes none of the keywords. *open_stream* replaces the TCP/TLS connect of
    the lean client (the virtual-time suite's in-memory streams to the fake platform);
    *transport* replaces the network with an httpx transport (then httpx carries the
    requests); *wrap_backend* wraps both HTTP clients (the suite records every request).
    """

    def __init__(
        self,
        config: PlatformConfig,
        timings: Timings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        open_stream: StreamOpener | None = None,
        wrap_backend: BackendWrapper | None = None,
    ) -> None:
        self.config = config
        self.timings = timings
        headers = {"Authorization": config.api_key, "User-Agent": USER_AGENT}
        backend = functools.partial(
            make_backend,
            transport=transport,
            open_stream=open_stream,
            connect_timeout=timings.connect_timeout,
        )
        self.polls = backend(headers, max_connections=4)
        self._reports = backend({**headers, "Content-Type": REPORT_CONTENT_TYPE})
        if wrap_backend is not None:
            self.polls, self._reports = wrap_backend(self.polls), wrap_backend(self._reports)

    async def aclose(self) -> None:
        # Each backend closes its own connections even when cancelled; this only makes
        # sure the second is closed when closing the first raised.
        try:
            await self.polls.aclose()
        finally:
            await self._reports.aclose()

    # -- take -----------------------------------------------------------------------------

    def take_url(self, count: int, *, in_progress: bool) -> str:
        # URLs are built in one place, PlatformConfig.
        return self.config.take_request_url(count, in_progress=in_progress)

    async def take(self, count: int, *, in_progress: bool) -> TakeResponse:
        """One take long-poll for up to *count* jobs.

        Raises:
            RateLimited: on 429.
            PlatformError: on any other status but 2xx, 204 and 400 (400 is how the
                platform says "no job" under FlashBoot).
            TransportError: when the platform cannot be reached.
        """
        route = "take" if count == 1 else "take_batch"
        url = self.take_url(count, in_progress=in_progress)
        # Generous: a batch of jobs with large inputs (docs/protocol.md §2.0).
        response = await self.polls.request("GET", url, max_body=MAX_TAKE_ANSWER_BYTES)
        status = response.status
        if status in (204, 400):
            return TakeResponse()
        if status == 429:
            raise RateLimited(route, _retry_after(response, self.timings.rate_limit_pause))
        if not 200 <= status < 300:
            raise PlatformError(route, status)
        return parse_take(status, response.headers.get("content-type", ""), response.body)

    # -- stop -----------------------------------------------------------------------------

    async def poll_stop(self) -> list[str]:
        """One stop long-poll: the ids the platform wants stopped.

        Raises:
            RateLimited, PlatformError, TransportError: as :meth:`take`.
        """
        assert self.config.stop_url is not None
        response = await self.polls.request("GET", self.config.stop_url, max_body=MAX_ANSWER_BYTES)
        status = response.status
        if status == 204:
            return []
        if status == 429:
            raise RateLimited("stop", _retry_after(response, self.timings.rate_limit_pause))
        if not 200 <= status < 300:
            raise PlatformError("stop", status)
        ids, warning = parse_stop(response.headers.get("content-type", ""), response.body)
        if warning:
            log.warning("job-stop answer partly unusable: %s", warning)
        return ids

    # -- reports --------------------------------------------------------------------------

    async def post_report(self, url: str, body: bytes, *, job_id: str) -> ReportOutcome:
        """POST one report with bounded retries. Never raises for platform trouble.

        The caller must run this under a shielded scope with a deadline: the retry loop
        counts attempts, the scope bounds time.
        """
        last_error = "no attempt made"
        attempts = self.timings.report_attempts
        for attempt in range(attempts):
            delay = backoff_delay(
                attempt, self.timings.error_backoff_min, self.timings.report_backoff_max
            )
            try:
                response = await self._reports.request("POST", url, body)
            except TransportError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            else:
                status = response.status
                if 200 <= status < 300:
                    return ReportOutcome(True, attempt + 1)
                last_error = f"HTTP {status}"
                if not _retryable(status):
                    return ReportOutcome(False, attempt + 1, last_error)
                if status == 429:
                    delay = _retry_after(response, delay)
            if attempt + 1 < attempts:
                log.warning(
                    "report for job %s failed (%s); retrying in %.2fs", job_id, last_error, delay
                )
                await trio.sleep(delay)
        return ReportOutcome(False, attempts, last_error)

"""The platform protocol: take, stop, done, stream (docs/protocol.md §2).

Two HTTP clients, on purpose: long-polls (take, stop) use one, reports (done, stream,
progress) the other. Cancelling a long-poll can leak a pool slot under contention
(encode/httpcore#1093), and a report must never wait behind that.

Every request here is a single attempt except :meth:`PlatformClient.post_report`, which
retries connect errors, timeouts, 408, 429 and 5xx with exponential backoff and full jitter
until the caller's deadline: the caller bounds the total time with a (shielded) cancel
scope, so the budget runs on trio's clock (MockClock-native) rather than on
``time.monotonic``, and can be shortened from outside (a shutdown) while it runs.
"""

from __future__ import annotations

import email.utils
import functools
import logging
import math
import platform
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from .._config import MAX_ANSWER_BYTES, MAX_TAKE_ANSWER_BYTES
from .._exceptions import AnswerTooLarge, PlatformError, RateLimited, TransportError
from .._version import __version__
from ._http import HttpResponse, PipeliningBackend, make_backend
from ._wire import TakeResponse, parse_oversized_take, parse_stop, parse_take

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._config import PlatformConfig, Timings
    from ._http import BackendWrapper, StreamOpener

log = logging.getLogger("trio_worker")

USER_AGENT = f"trio_worker/{__version__} (Language/Python {platform.python_version()})"
# The reference sends JSON text under a form content type (docs/protocol.md §2.3); the platform
# parses the raw body. Sending the same keeps us byte-compatible with what it accepts.
REPORT_CONTENT_TYPE = "application/x-www-form-urlencoded"
# Bytes of a report's (or a stream chunk's) answer body kept: enough for an error text in a
# log line, nothing a worker acts on.
REPORT_ANSWER_KEEP = 4096


def is_retryable(status: int) -> bool:
    """408, 429 and every 5xx are worth another attempt (docs/design.md §5)."""
    return status >= 500 or status in (408, 429)


# A take or stop paused by a 429 waits at most this long (a report's wait is bounded by
# its budget instead).
POLL_RETRY_AFTER_CAP = 60.0


def _poll_pause(response: HttpResponse, default: float) -> float:
    asked = retry_after(response)
    return default if asked is None else min(asked, POLL_RETRY_AFTER_CAP)


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2**attempt)]."""
    # The exponent is clamped: an outage of hours must not overflow a float.
    return random.uniform(0, min(cap, base * (2 ** min(max(attempt, 0), 64))))


class PlatformClient:
    """Speaks the worker routes for one worker.

    Production passes none of the keywords. *open_stream* replaces the TCP/TLS connect of
    the lean client (the in-memory network to the fake platform, in virtual time);
    *wrap_backend* wraps both HTTP clients (the property suite records every request).
    """

    def __init__(
        self,
        config: PlatformConfig,
        timings: Timings,
        *,
        open_stream: StreamOpener | None = None,
        wrap_backend: BackendWrapper | None = None,
    ) -> None:
        self.config = config
        self.timings = timings
        headers = {"Authorization": config.api_key, "User-Agent": USER_AGENT}
        backend = functools.partial(
            make_backend,
            open_stream=open_stream,
            connect_timeout=timings.connect_timeout,
        )
        self.polls = backend(headers, max_connections=4)
        # A report's answer matters by its status (and Retry-After) alone: of its body only
        # a little is kept, so a round of pipelined chunks holds little however large the
        # platform's answers (docs/protocol.md §2.4).
        self._reports = backend(
            {**headers, "Content-Type": REPORT_CONTENT_TYPE}, keep_body=REPORT_ANSWER_KEEP
        )
        if wrap_backend is not None:
            self.polls, self._reports = wrap_backend(self.polls), wrap_backend(self._reports)
        # Stream chunks are pipelined until the platform shows it cannot take that
        # (docs/protocol.md §2.4); httpx (behind a proxy) never pipelines.
        reports = self._reports
        self._pipelining = reports if isinstance(reports, PipeliningBackend) else None

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
        try:
            response = await self.polls.request("GET", url, max_body=MAX_TAKE_ANSWER_BYTES)
        except AnswerTooLarge as exc:
            if not 200 <= exc.status < 300:
                raise
            # The jobs it names are ours now (I8): failed as too large, or logged as lost.
            return parse_oversized_take(exc.size, MAX_TAKE_ANSWER_BYTES, exc.head)
        status = response.status
        if status in (204, 400):
            return TakeResponse()
        if status == 429:
            raise RateLimited(route, _poll_pause(response, self.timings.rate_limit_pause))
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
            raise RateLimited("stop", _poll_pause(response, self.timings.rate_limit_pause))
        if not 200 <= status < 300:
            raise PlatformError("stop", status)
        ids, warning = parse_stop(response.headers.get("content-type", ""), response.body)
        if warning:
            log.warning("job-stop answer partly unusable: %s", warning)
        return ids

    # -- reports --------------------------------------------------------------------------

    async def post_report(
        self,
        url: str,
        body: bytes,
        *,
        job_id: str,
        outcome: ReportOutcome | None = None,
        superseded: Callable[[], bool] | None = None,
    ) -> ReportOutcome:
        """POST one report until it is acknowledged, refused for good, or time runs out.

        Never raises for platform trouble. There is no attempt limit: the caller's cancel
        scope bounds the whole (the job's delivery budget, docs/design.md §5), and this
        loop reads that deadline to honour ``Retry-After`` within what is left. Each
        attempt has its own timeout, grown with the body's size, so one hung connection
        costs one attempt. *outcome*, when given, is filled in as attempts are made, so a
        caller whose scope ran out still knows how many were made and the last error.
        *superseded* is asked before each retry: when it says yes (a newer progress
        update is waiting), the report is abandoned.
        """
        outcome = ReportOutcome() if outcome is None else outcome
        bound = self.timings.report_attempt_bound(len(body))
        while True:
            status = await self._attempt(url, body, bound, outcome)
            if outcome.delivered or (status is not None and not is_retryable(status)):
                return outcome
            if superseded is not None and superseded():
                outcome.last_error = f"{outcome.last_error}; superseded by a newer update"
                return outcome
            delay = self._retry_delay(outcome, bound)
            if _worth_logging(outcome.attempts):
                log.warning(
                    "report for job %s failed (%s, attempt %d); retrying in %.2fs",
                    job_id,
                    outcome.last_error,
                    outcome.attempts,
                    delay,
                )
            await trio.sleep(delay)

    async def post_pipelined(self, requests: list[tuple[str, bytes]]) -> list[HttpResponse]:
        """One attempt at every ``(url, body)`` POST, pipelined on one connection: the
        answers, in order, for a prefix of *requests* (all of them when all went well; none
        when pipelining is off). Never raises for platform trouble: what was not answered
        is the caller's to send again.

        A platform that answers part of a batch and then nothing within the attempt's
        timeout does not take pipelined requests (a proxy in the way, say): pipelining is
        then turned off for good, with a warning, and chunks go one at a time.
        """
        backend = self._pipelining
        if backend is None:
            return []
        bound = self.timings.report_attempt_bound(sum(len(body) for _, body in requests))
        answers: list[HttpResponse] = []
        with trio.move_on_after(bound) as scope:
            try:
                await backend.pipeline("POST", requests, answers)
            except TransportError as exc:
                log.debug(
                    "%d of %d pipelined stream chunks answered: %s",
                    len(answers),
                    len(requests),
                    exc,
                )
        if scope.cancelled_caught and answers:
            self._pipelining = None
            log.warning(
                "the platform answered %d of %d pipelined stream chunks, then nothing for "
                "%.1fs: stream chunks now go one request at a time",
                len(answers),
                len(requests),
                bound,
            )
        return answers

    @property
    def pipelining(self) -> bool:
        """Whether stream chunks may still be pipelined (see :meth:`post_pipelined`)."""
        return self._pipelining is not None

    async def _attempt(
        self, url: str, body: bytes, bound: float, outcome: ReportOutcome
    ) -> int | None:
        """One POST under its own timeout; the status answered, or None for none."""
        outcome.attempts += 1
        outcome.retry_after = None
        with trio.move_on_after(bound) as scope:
            try:
                response = await self._reports.request("POST", url, body)
            except TransportError as exc:
                outcome.last_error = f"{type(exc).__name__}: {exc}"
                return None
        if scope.cancelled_caught:
            # The cancelled request closed its connection; the next attempt opens another.
            outcome.last_error = f"no answer within {bound:.1f}s"
            return None
        outcome.status = status = response.status
        if 200 <= status < 300:
            outcome.delivered, outcome.last_error = True, None
        else:
            outcome.last_error = f"HTTP {status}"
            if status == 429 or status == 503:
                outcome.retry_after = retry_after(response)
        return status

    def _retry_delay(self, outcome: ReportOutcome, bound: float) -> float:
        timings = self.timings
        delay = backoff_delay(
            outcome.attempts - 1, timings.error_backoff_min, timings.report_backoff_max
        )
        if outcome.retry_after is None:
            return delay
        # Wait as asked (never less than the backoff: "Retry-After: 0" must not make a hot
        # loop of a budget with no attempt limit), but leave time for one more attempt
        # before the budget ends.
        remaining = trio.current_effective_deadline() - trio.current_time()
        return max(0.0, min(max(outcome.retry_after, delay), remaining - bound))


@dataclass
class ReportOutcome:
    """How a report went: acknowledged or not, after how many attempts, and why not."""

    delivered: bool = False
    attempts: int = 0
    last_error: str | None = None
    status: int | None = None  # the last HTTP status answered, if any
    retry_after: float | None = field(default=None, repr=False)


def retry_after(response: HttpResponse) -> float | None:
    """The wait an answer's ``Retry-After`` asks for, in seconds: the one parser of that
    header for every route (what a route then does with it, floor or cap, is its own).

    Delta-seconds (a fraction is taken too) or an HTTP date (one already past asks for
    no wait). None when the header is absent or invalid: negative, not finite, garbage,
    a date without a zone.
    """
    raw = response.headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = max(0.0, when.timestamp() - time.time())
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds


#: The former name of :func:`retry_after`, kept for callers not moved yet.
report_retry_after = retry_after


def _worth_logging(attempt: int) -> bool:
    """Attempts 1, 2, 4, 8, ...: an outage of minutes is visible without a line a second."""
    return attempt & (attempt - 1) == 0

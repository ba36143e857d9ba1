"""The platform protocol: take, stop, done, stream (docs/protocol.md §2).

Two HTTP clients, on purpose: long-polls (take, stop) use one, reports (done, stream,
progress) the other. Cancelling a long-poll can leak a pool slot under contention
(encode/httpcore#1093), and a report must never wait behind that.

Every call here is a single attempt: what is worth another, and when, is decided
elsewhere, once (the reports' retries in :meth:`~trio_worker._delivery.Delivery.post`, the
long-polls' pauses in the supervisor's one poll loop, both waits paced by
:mod:`trio_worker._pacing`). A ``Retry-After`` is parsed here (:func:`retry_after`) and
handed on as asked, with no floor or cap of this module's.
"""

from __future__ import annotations

import email.utils
import functools
import logging
import math
import platform
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from .._config import MAX_TAKE_ANSWER_BYTES
from .._exceptions import AnswerTooLarge, PlatformError, RateLimited, TransportError
from .._version import __version__
from ._connection import HttpResponse, PipeliningUnsupported
from ._http import ServerKinds, make_backend
from ._wire import TakeResponse, parse_oversized_take, parse_stop, parse_take

if TYPE_CHECKING:
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


class PlatformClient:
    """Speaks the worker routes for one worker.

    Production passes none of the keywords. *open_stream* replaces the TCP/TLS connect of
    the pool (the in-memory network to the fake platform, in virtual time);
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
            environ=config.proxies,
            # The take's first answer shows what the platform is before a chunk goes.
            servers=ServerKinds(),
        )
        # A take and a stop poll at a time, and the fitness check's one request.
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
        # (docs/protocol.md §2.4).
        self._pipelining = True

    def __repr__(self) -> str:
        pipelining = "pipelining" if self._pipelining else "one request at a time"
        return f"<PlatformClient polls={self.polls!r} reports={self._reports!r}, {pipelining}>"

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
            [response] = await self.polls.exchange(
                "GET", [(url, b"")], max_body=MAX_TAKE_ANSWER_BYTES
            )
        except AnswerTooLarge as exc:
            if not 200 <= exc.status < 300:
                raise
            # The jobs it names are ours now (I8): failed as too large, or logged as lost.
            return parse_oversized_take(exc.size, MAX_TAKE_ANSWER_BYTES, exc.head)
        status = response.status
        if status in (204, 400):
            return TakeResponse()
        if status == 429:
            raise RateLimited(route, retry_after(response))
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
        [response] = await self.polls.exchange("GET", [(self.config.stop_url, b"")])
        status = response.status
        if status == 204:
            return []
        if status == 429:
            raise RateLimited("stop", retry_after(response))
        if not 200 <= status < 300:
            raise PlatformError("stop", status)
        ids, warning = parse_stop(response.headers.get("content-type", ""), response.body)
        if warning:
            log.warning("job-stop answer partly unusable: %s", warning)
        return ids

    # -- reports --------------------------------------------------------------------------

    async def post(
        self, requests: list[tuple[str, bytes]], outcome: ReportOutcome | None = None
    ) -> list[HttpResponse]:
        """One attempt at every ``(url, body)`` POST (a report; several are stream chunks,
        pipelined on one connection) within the attempt's bound, grown with the bodies'
        size: the answers, in order, to a prefix of *requests*. Never raises for platform
        trouble: what was not answered is the caller's to send again.

        *outcome* (of a single report) counts the attempt and records how it went:
        acknowledged (any 2xx), the status, the error (a transport error's text, or "no
        answer within" the bound: one hung connection costs one attempt), and, on a 429 or
        503, the ``Retry-After`` asked for, as parsed (None when absent or unreadable).

        Several go out together only while pipelining is on (else none is sent). A
        platform that answers part of a batch and then nothing within the bound does not
        take pipelined requests (a proxy in the way, say): pipelining is then turned off
        for good, with a warning, and chunks go one at a time. So it is, with one line,
        when the client finds the platform cannot take them (:class:`PipeliningUnsupported`:
        HTTP/1.0, answers delimited by the close, a proxy); then nothing behind the
        answered prefix was sent.
        """
        several = len(requests) > 1
        if several and not self._pipelining:
            return []
        bound = self.timings.report_attempt_bound(sum(len(body) for _, body in requests))
        answers: list[HttpResponse] = []
        error: str | None = None
        with trio.move_on_after(bound) as scope:
            try:
                await self._reports.exchange("POST", requests, answers)
            except PipeliningUnsupported as exc:
                self._pipelining = False
                log.info("stream chunks now go one request at a time: %s", exc)
                return answers
            except AnswerTooLarge as exc:
                # The answer's status is known; the exchange ends with it (the rest of its
                # body was not read, so the connection is gone).
                answers.append(answer_too_large(exc))
            except TransportError as exc:
                error = f"{type(exc).__name__}: {exc}"
                if several:
                    log.debug(
                        "%d of %d stream chunks answered: %s", len(answers), len(requests), exc
                    )
        if scope.cancelled_caught:
            # The cancelled exchange closed its connection; the next attempt opens another.
            error = f"no answer within {bound:.1f}s"
            if several and answers:
                self._pipelining = False
                log.warning(
                    "the platform answered %d of %d pipelined stream chunks, then nothing for "
                    "%.1fs: stream chunks now go one request at a time",
                    len(answers),
                    len(requests),
                    bound,
                )
        if outcome is not None:
            outcome.attempts += 1
            outcome.retry_after = None
            if not answers:
                outcome.last_error = error
            else:
                outcome.status = status = answers[0].status
                if 200 <= status < 300:
                    outcome.delivered, outcome.last_error = True, None
                else:
                    outcome.last_error = f"HTTP {status}"
                    outcome.retry_after = asked_pause(answers[0])
        return answers

    @property
    def pipelining(self) -> bool:
        """Whether stream chunks may still be pipelined (see :meth:`post`)."""
        return self._pipelining


@dataclass
class ReportOutcome:
    """How a report went: acknowledged or not, after how many attempts, and why not."""

    delivered: bool = False
    attempts: int = 0
    last_error: str | None = None
    status: int | None = None  # the last HTTP status answered, if any
    retry_after: float | None = field(default=None, repr=False)


def answer_too_large(exc: AnswerTooLarge) -> HttpResponse:
    """A report's answer whose body was over the bound, as what matters of it: its status,
    known from its head (a 413 is refused for good, a 2xx acknowledges the report) and
    its first bytes. Never its headers: a ``Retry-After`` on it is not waited for."""
    return HttpResponse(exc.status, {}, exc.head)


def asked_pause(response: HttpResponse) -> float | None:
    """The ``Retry-After`` of a report's (or a stream chunk's) 429 or 503, as parsed: the
    answers that ask a report to wait (docs/protocol.md §2.3). None for any other answer."""
    return retry_after(response) if response.status in (429, 503) else None


def retry_after(response: HttpResponse) -> float | None:
    """The wait an answer's ``Retry-After`` asks for, in seconds: the one parser of that
    header for every route. Its floor, cap and jitter are applied in one place,
    :func:`~trio_worker._pacing.rate_limit_wait`, for every route.

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

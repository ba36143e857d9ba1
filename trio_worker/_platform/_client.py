"""The worker routes: take, stop, done, stream (docs/protocol.md §2), and the take's
answer read into jobs.

Two clients, long-polls and reports, so a cancelled long-poll never holds up a report
(docs/protocol.md §2.0, encode/httpcore#1093). Every call is one attempt: the retries are
:meth:`~trio_worker._delivery.Delivery.post`'s and the poll loop's, their waits
:mod:`trio_worker._pacing`'s; a ``Retry-After`` is handed on as asked.
"""

from __future__ import annotations

import functools
import json
import logging
import platform
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import trio

from .._config import LIMITS, MAX_TAKE_ANSWER_BYTES, with_query
from .._exceptions import AnswerTooLarge, PlatformError, RateLimited, TransportError
from .._version import __version__
from . import _wire
from ._http import ServerKinds, make_backend
from ._request import PipeliningUnsupported

if TYPE_CHECKING:
    from .._config import PlatformConfig, Timings
    from ._connection import HttpResponse
    from ._http import BackendWrapper, StreamOpener

log = logging.getLogger("trio_worker")

USER_AGENT = f"trio_worker/{__version__} (Language/Python {platform.python_version()})"
# The reference's form content type over JSON text, which the platform accepts
# (docs/protocol.md §2.3).
REPORT_CONTENT_TYPE = "application/x-www-form-urlencoded"
# Of a report's answer body: enough for an error text in a log line.
REPORT_ANSWER_KEEP = 4096


def is_retryable(status: int) -> bool:
    """408, 429 and every 5xx are worth another attempt (docs/design.md §5)."""
    return status >= 500 or status in (408, 429)


def report_attempt_bound(timings: Timings, size: int) -> float:
    """One attempt's timeout for a report (or a round of stream chunks) of *size* bytes of
    body: a hung connection costs this much of the budget, and a large body on a slow link
    still gets through."""
    return timings.report_attempt_timeout + size / timings.report_min_rate


def job_path_segment(job_id: str) -> str:
    """*job_id* as one URL path segment: every byte but ``A-Z a-z 0-9 - . _ ~``
    percent-encoded (docs/protocol.md §2.3). Never raises: a lone surrogate is encoded as
    its bytes."""
    if _UNRESERVED.fullmatch(job_id):
        return job_id  # every id the platform issues: nothing to encode (and no quote())
    return quote(job_id, safe="", errors="surrogatepass")


_UNRESERVED = re.compile(r"[A-Za-z0-9._~-]+")


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
        # A take and a stop poll at a time, and the fitness check's request.
        self.polls = backend(headers, max_connections=4)
        # A report's answer matters by its status alone: little of its body is kept
        # (docs/protocol.md §2.0, "Bounds").
        self._reports = backend(
            {**headers, "Content-Type": REPORT_CONTENT_TYPE}, keep_body=REPORT_ANSWER_KEEP
        )
        if wrap_backend is not None:
            self.polls, self._reports = wrap_backend(self.polls), wrap_backend(self._reports)
        self._pipelining = True  # until the platform cannot take it (docs/protocol.md §2.4)
        # Each route's URL built once: a take fills in its count, a report its job's id.
        take, batch = config.take_url, config.batch_take_url
        self._take = (
            {} if take is None else {f: with_query(take, f"job_in_progress={f}") for f in "01"}
        )
        self._batch_take = None if batch is None else with_query(batch, "batch_size=")
        self._done = with_query(config.done_template, "isStream=").split("$ID")
        self._stream = with_query(config.stream_template, "isStream=false").split("$ID")

    def __repr__(self) -> str:
        pipelining = "pipelining" if self._pipelining else "one request at a time"
        return f"<PlatformClient polls={self.polls!r} reports={self._reports!r}, {pipelining}>"

    async def aclose(self) -> None:
        # Each backend closes its connections even when cancelled; the second is closed
        # even when closing the first raised.
        try:
            await self.polls.aclose()
        finally:
            await self._reports.aclose()

    # -- take -----------------------------------------------------------------------------

    def take_url(self, count: int, *, in_progress: bool) -> str:
        """The URL of one take for up to *count* jobs (docs/protocol.md §2.1)."""
        flag = "1" if in_progress else "0"
        if count == 1:
            return self._take[flag]
        assert self._batch_take is not None
        return f"{self._batch_take}{count}&job_in_progress={flag}"

    async def take(self, count: int, *, in_progress: bool) -> TakeResponse:
        """One take long-poll for up to *count* jobs (204 and 400 are "no job").

        Raises:
            RateLimited: on 429.
            PlatformError: on any other status but 2xx, 204 and 400.
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
            raise RateLimited(route, _wire.retry_after(response))
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
            raise RateLimited("stop", _wire.retry_after(response))
        if not 200 <= status < 300:
            raise PlatformError("stop", status)
        ids, warning = _wire.parse_stop(response.headers.get("content-type", ""), response.body)
        if warning:
            log.warning("job-stop answer partly unusable: %s", warning)
        return ids

    # -- reports --------------------------------------------------------------------------

    def done_url(self, job_id: str, *, is_stream: bool) -> str:
        """The job-done URL of *job_id*, the id one path segment (:func:`job_path_segment`)."""
        return job_path_segment(job_id).join(self._done) + ("true" if is_stream else "false")

    def stream_url(self, job_id: str) -> str:
        """The job-stream URL of *job_id*, the id one path segment."""
        return job_path_segment(job_id).join(self._stream)

    async def post(
        self, requests: list[tuple[str, bytes]], outcome: ReportOutcome | None = None
    ) -> list[HttpResponse]:
        """One attempt at every ``(url, body)`` POST (several: stream chunks, pipelined)
        within :func:`report_attempt_bound`: the answers, in order, to a prefix of
        *requests*. Never raises for platform trouble: what was not answered is the
        caller's to send again.

        *outcome* (of a single report) counts the attempt and records how it went: any 2xx
        acknowledges it; else the status or the error, and a 429's or 503's
        ``Retry-After`` as parsed (None when absent or unreadable).

        Several are sent only while pipelining is on (else none is). A platform found
        unable to take them turns it off for good (docs/protocol.md §2.4).
        """
        several = len(requests) > 1
        if several and not self._pipelining:
            return []
        bound = report_attempt_bound(self.timings, sum(len(body) for _, body in requests))
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
                # Its status is known; the rest of its body, and the connection, are gone.
                answers.append(_wire.answer_too_large(exc))
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
                    outcome.retry_after = _wire.asked_pause(answers[0])
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


# -- the take's answer (docs/protocol.md §2.1, §8 item 5) ---------------------------------

MAX_JOB_ID_LENGTH = LIMITS.job_id


@dataclass
class TakeResponse:
    """What one take answer delivered."""

    jobs: list[dict[str, Any]] = field(default_factory=list)
    # (job id, reason): owed an error report, the handler must not run.
    malformed: list[tuple[str, str]] = field(default_factory=list)
    # Items that carry no usable id: nothing can be reported, only logged.
    unaddressable: list[str] = field(default_factory=list)
    # The answer was not understood at all (not JSON, wrong content type).
    garbled: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.jobs or self.malformed)


def parse_take(status: int, content_type: str, body: bytes) -> TakeResponse:
    """A 2xx take answer read into jobs (docs/protocol.md §2.1); one that does not decode
    as a whole is read item by item, so one job's input never costs another."""
    if status == 204 or not body:
        return TakeResponse()
    if "json" not in content_type.lower():
        return TakeResponse(garbled=f"content type {content_type!r} is not JSON")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return _parse_items(body)
    out = TakeResponse()
    if isinstance(data, dict):
        _classify_item(data, out)
    elif isinstance(data, list):
        for item in data:
            _classify_item(item, out)
    elif data is not None:
        out.garbled = f"unexpected JSON {type(data).__name__}"
    return out


def id_problem(value: object) -> str | None:
    """Why *value* cannot address a job on the platform (docs/protocol.md §2.1, a usable
    id), or None when it can. ``MAX_JOB_ID_LENGTH`` keeps an encoded id within any
    server's request line."""
    if not isinstance(value, str):
        return f"the id is not a string but {type(value).__name__}"
    if not value:
        return "the id is empty"
    if len(value) > MAX_JOB_ID_LENGTH:
        return f"the id has {len(value)} characters, over {MAX_JOB_ID_LENGTH}"
    if not value.isprintable():
        return "the id holds a control or unprintable character"
    return None


def _classify_item(item: object, out: TakeResponse) -> None:
    if not isinstance(item, dict):
        out.unaddressable.append(f"job is not an object: {_preview(item)}")
        return
    job_id = item.get("id")
    problem = "the job has no 'id'" if "id" not in item else id_problem(job_id)
    if problem is not None:
        out.unaddressable.append(f"{problem}: {_preview(item)}")
        return
    assert isinstance(job_id, str)
    if "input" not in item:
        out.malformed.append((job_id, "the job has no 'input' field"))
        return
    out.jobs.append(item)


def _preview(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _parse_items(body: bytes) -> TakeResponse:
    """A take answer that did not decode as a whole, item by item: one that does not decode
    is malformed when it names a usable id (else lost, and said so); when the structure
    broke, every id read, before the break and after it, is failed."""
    found = _wire.split_items(body)
    out = TakeResponse()
    lost: list[str] = []
    for item in found.items:
        if isinstance(item, _wire.Unreadable):
            ids = _usable(item.ids)
            if ids:
                out.malformed.append((ids[0], f"the job cannot be decoded: {item.why}"))
            else:
                lost.append(item.why)
        else:
            _classify_item(item, out)
    if found.broken is not None:
        decoded = [job["id"] for job in out.jobs] + [job_id for job_id, _ in out.malformed]
        ids = list(dict.fromkeys([*decoded, *_usable(found.broken)]))
        out = TakeResponse(garbled=f"body is not JSON; {len(ids)} job id(s) recovered and failed")
        out.malformed = [(job_id, "the take answer carrying the job is not JSON") for job_id in ids]
    elif lost:
        out.garbled = f"body is not JSON: {len(lost)} item(s) without a readable id ({lost[0]})"
    return out


def _usable(ids: list[str]) -> list[str]:
    return [job_id for job_id in ids if id_problem(job_id) is None]


def parse_oversized_take(size: int, limit: int, head: bytes) -> TakeResponse:
    """A 2xx take answer of *size* bytes, over *limit*, of which *head* was read: the jobs
    named there are failed as too large, the loss of any other logged (docs/protocol.md
    §2.0, "Bounds")."""
    ids = _usable(_wire.id_strings(head.decode("utf-8", errors="replace")))
    reason = f"input too large: its take answer has {size} bytes, over the {limit}-byte bound"
    if ids:
        log.error(
            "job-take answer of %d bytes refused (over %d): %d job(s) named in its first "
            "%d bytes are failed as too large; any job past them is lost",
            size,
            limit,
            len(ids),
            len(head),
        )
    else:
        log.error(
            "JOBS LOST: a job-take answer of %d bytes was refused (over %d) and names no "
            "job id in its first %d bytes: whatever jobs it carried are lost",
            size,
            limit,
            len(head),
        )
    return TakeResponse(malformed=[(job_id, reason) for job_id in ids])

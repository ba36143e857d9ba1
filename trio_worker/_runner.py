"""Running one job: call the handler, stream its chunks, build the terminal report body.

Nothing here decides *whether* a job runs (the supervisor and the gate do); this module
turns a job that may run into the bytes of its job-done report, and never loses a result
on the way: an exception, a non-JSON value, an oversized result, a generator that fails
mid-stream all become a clear error on the job (docs/design.md §5).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import trio

from ._capture import JobOutput, OutputCapture, job_output, logs_for_job
from ._categories import classify
from ._errors import (
    MAX_ERROR_BODY_BYTES,
    WorkerIdentity,
    clip,
    encode_body,
    generator_error_body,
    handler_error_body,
    shutdown_error_body,
)
from ._handlers import (
    Handler,
    HandlerKind,
    Stream,
    ThreadWaits,
    call_handler,
    explain_backend,
    handler_kind,
    is_cancellation,
)
from ._platform._client import PlatformClient, ReportOutcome
from ._results import (
    ResultEncodingError,
    encode_result,
    output_error_body,
    result_body,
    stream_final_body,
    with_stop_pod,
)
from ._version import __version__

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._config import Settings
    from ._lifecycle import HeldJob
    from ._options import WorkerOptions

log = logging.getLogger("trio_worker")

# Chunks produced ahead of the one being posted; bounded so a fast generator cannot hold
# an unbounded backlog in memory.
STREAM_PIPELINE_DEPTH = 64
# A final report names at most this many undelivered chunks (and always their count).
MAX_LISTED_CHUNKS = 1000
# Room kept in an error body for "stopPod": true, added after the note on lost chunks.
_STOP_POD_ROOM = 32


@dataclass(frozen=True)
class JobSpec:
    """What the user asked for, resolved once at start."""

    handler: Handler
    kind: HandlerKind
    return_aggregate_stream: bool
    refresh_worker: bool

    @classmethod
    def from_options(cls, options: WorkerOptions) -> JobSpec:
        handler = options.handler
        return cls(
            handler, handler_kind(handler), options.return_aggregate_stream, options.refresh_worker
        )


@dataclass(frozen=True)
class ProgressTarget:
    """Where ``progress_update`` sends a body: *post* runs on the trio thread of *token*."""

    post: Callable[[str, bytes], None]
    token: trio.lowlevel.TrioToken


# Set in each job's task by JobRunner.run; a sync handler's thread sees it too, as
# trio.to_thread copies the context. Two workers in one process never cross this way.
current_progress: contextvars.ContextVar[ProgressTarget | None] = contextvars.ContextVar(
    "trio_worker_progress", default=None
)


class ChunkSink(Protocol):
    """Where a streaming job's chunks go, in order: the platform, or stdout in local mode.

    ``send_chunk`` tries until *retry_until* (trio time; at least one attempt) and says
    whether the chunk was delivered."""

    async def send_chunk(self, job_id: str, body: bytes, *, retry_until: float) -> bool: ...


class PlatformChunks:
    """Posts each chunk to the job-stream route, retried until *retry_until*."""

    def __init__(self, client: PlatformClient, settings: Settings) -> None:
        self.client = client
        self.settings = settings

    async def send_chunk(self, job_id: str, body: bytes, *, retry_until: float) -> bool:
        url = self.settings.platform.stream_url(job_id)
        # A stream whose budget is spent still gives each chunk one attempt's timeout: the
        # platform may be back.
        once = trio.current_time() + self.settings.timings.report_attempt_bound(len(body))
        outcome = ReportOutcome()
        with trio.move_on_at(max(retry_until, once)):
            await self.client.post_report(url, body, job_id=job_id, outcome=outcome)
        if not outcome.delivered:
            log.error(
                "stream chunk for job %s not delivered after %d attempt(s): %s",
                job_id,
                outcome.attempts,
                outcome.last_error or "no attempt made",
            )
        return outcome.delivered


@dataclass(frozen=True)
class Report:
    """A terminal job-done body, ready to post."""

    body: bytes
    is_stream: bool


class JobRunner:
    def __init__(
        self,
        spec: JobSpec,
        settings: Settings,
        chunks: ChunkSink,
        capture: OutputCapture | None,
        limiter: trio.CapacityLimiter,
        waits: ThreadWaits,
        shared_process: Callable[[], bool],
        progress: ProgressTarget | None = None,
    ) -> None:
        self.waits = waits
        self.spec = spec
        self.settings = settings
        self.chunks = chunks
        self.progress = progress
        self.capture = capture
        self.limiter = limiter
        self.shared_process = shared_process
        self.identity = worker_identity(settings)

    async def run(self, job: HeldJob) -> Report:
        """Run the handler on *job*; trio.Cancelled (a stop, shutdown) propagates."""
        # No flush on the hot path: the flush happens when (and if) the logs are read.
        mark = self.capture.mark_nowait() if self.capture is not None else 0
        reset = current_progress.set(self.progress)
        try:
            return await self._run(job, mark)
        finally:
            current_progress.reset(reset)

    async def _run(self, job: HeldJob, mark: int) -> Report:
        with job_output(job.id) as output:
            try:
                result = await call_handler(
                    self.spec.handler,
                    self.spec.kind,
                    job.payload,
                    self.limiter,
                    self.waits,
                    close_bound=self.settings.timings.sync_close_bound,
                )
                if isinstance(result, Stream):
                    return await self._stream(job, result, output, mark)
            except BaseException as exc:
                if is_cancellation(exc):
                    raise
                return self._handler_error(exc, output, mark)
        return self._result(result)

    def malformed_report(self, job_id: str, reason: str) -> Report:
        """The error reported on a job that could not be run as delivered."""
        exc = MalformedJob(f"job {job_id} was not run: {reason}")
        body = handler_error_body(
            exc,
            logs="",
            category="unknown",
            identity=self.identity,
            redactor=self.settings.redactor,
        )
        return Report(encode_body(self._with_refresh(body)), is_stream=False)

    def shutdown_report(self, job_id: str, grace: float) -> Report:
        """The error reported on a job still running when the shutdown grace ran out."""
        body = shutdown_error_body(
            job_id=job_id, grace_s=grace, identity=self.identity, redactor=self.settings.redactor
        )
        return Report(encode_body(self._with_refresh(body)), is_stream=False)

    def _logs(self, output: JobOutput | None, mark: int) -> str:
        return logs_for_job(
            self.capture,
            output,
            mark,
            shared_process=self.shared_process(),
            limit=self.settings.logs_tail_chars,
        )

    def _handler_error(self, exc: BaseException, output: JobOutput, mark: int) -> Report:
        exc = explain_backend(exc)
        logs = self._logs(output, mark)
        body = handler_error_body(
            exc,
            logs=logs,
            category=classify(exc, logs),
            identity=self.identity,
            redactor=self.settings.redactor,
        )
        return Report(encode_body(self._with_refresh(body)), is_stream=False)

    def _with_refresh(self, body: dict[str, Any]) -> dict[str, Any]:
        return with_stop_pod(body) if self.spec.refresh_worker else body

    def _result(self, value: object) -> Report:
        return Report(self._encode(result_body(value)), is_stream=False)

    def _encode(self, body: dict[str, Any]) -> bytes:
        try:
            return encode_result(self._with_refresh(body))
        except ResultEncodingError as err:
            log.error("result not deliverable as is: %s", err)
            return encode_body(self._with_refresh(self._chunk_error(err)))

    async def _stream(self, job: HeldJob, stream: Stream, output: JobOutput, mark: int) -> Report:
        aggregate: list[object] | None = [] if self.spec.return_aggregate_stream else None
        final: dict[str, Any] | None = None
        send, receive = trio.open_memory_channel[bytes](STREAM_PIPELINE_DEPTH)
        undelivered: list[int] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._send_chunks, job.id, receive, undelivered)
            # aclosing: a stream left early (error chunk, non-JSON chunk) runs the user's
            # cleanup now, not whenever the generator is garbage collected.
            chunks = aiter(stream)
            async with send, contextlib.aclosing(chunks):
                try:
                    async for chunk in chunks:
                        if isinstance(chunk, dict) and chunk.get("error"):
                            # The reference's rule: an error chunk ends the stream, unstreamed.
                            final = {"error": self._error_chunk_text(chunk["error"])}
                            break
                        try:
                            encoded = encode_result({"output": chunk})
                        except ResultEncodingError as err:
                            final = self._chunk_error(err)
                            break
                        await send.send(encoded)
                        if aggregate is not None:
                            aggregate.append(chunk)
                except BaseException as exc:
                    if is_cancellation(exc):
                        raise
                    logs = self._logs(output, mark)
                    final = generator_error_body(
                        explain_backend(exc), logs=logs, redactor=self.settings.redactor
                    )
        if final is None:
            body = stream_final_body(aggregate, aggregate=aggregate is not None)
            return Report(self._encode(note_undelivered(body, undelivered)), is_stream=True)
        final = note_undelivered(final, undelivered, limit=MAX_ERROR_BODY_BYTES - _STOP_POD_ROOM)
        return Report(encode_body(self._with_refresh(final)), is_stream=True)

    def _error_chunk_text(self, error: object) -> str:
        # The user's own error text still leaves the process: redact and bound it (I6).
        return clip(self.settings.redactor.redact(str(error)))

    def _chunk_error(self, err: ResultEncodingError) -> dict[str, Any]:
        return output_error_body(
            err, category="unknown", identity=self.identity, redactor=self.settings.redactor
        )

    async def _send_chunks(
        self, job_id: str, receive: trio.MemoryReceiveChannel[bytes], undelivered: list[int]
    ) -> None:
        """Post the chunks in order; the indexes of those finally lost go to *undelivered*.

        The stream's budget is counted from its last sign of life (its start, or the last
        chunk acknowledged): an outage shorter than ``report_budget`` loses no chunk, and a
        dead platform costs the budget once, not once per chunk.
        """
        budget = self.settings.timings.report_budget
        alive = trio.current_time()
        async with receive:
            index = 0
            async for body in receive:
                # Chunks go out in order; the generator runs ahead meanwhile (the reference
                # waits for every POST before advancing: docs/protocol.md §8 item 15).
                if await self.chunks.send_chunk(job_id, body, retry_until=alive + budget):
                    alive = trio.current_time()
                else:
                    undelivered.append(index)
                index += 1


def note_undelivered(
    body: dict[str, Any], undelivered: list[int], *, limit: int | None = None
) -> dict[str, Any]:
    """*body* naming the stream chunks that were never delivered (docs/protocol.md §3.4).

    ``undelivered_chunk_count`` is always exact; ``undelivered_chunks`` lists their
    indexes (from 0, in order), at most :data:`MAX_LISTED_CHUNKS`, and fewer when the
    encoded body would exceed *limit* bytes (an error body keeps its bound, I6).
    """
    if not undelivered:
        return body
    listed = undelivered[:MAX_LISTED_CHUNKS]
    while True:
        noted = {
            **body,
            "undelivered_chunk_count": len(undelivered),
            "undelivered_chunks": listed,
        }
        if limit is None or not listed or len(encode_body(noted)) <= limit:
            return noted
        listed = listed[: len(listed) // 2]


class MalformedJob(ValueError):
    """The platform delivered a job the handler cannot be given (e.g. no ``input``)."""


def worker_identity(settings: Settings) -> WorkerIdentity:
    """Who is reporting: the identity every error payload carries."""
    platform = settings.platform
    return WorkerIdentity(platform.worker_id, platform.hostname, __version__)

"""Running one job: call the handler, stream its chunks, build the terminal report body.
Whether a job runs is decided elsewhere; here no result is lost on the way: every failure
becomes a clear error on the job (docs/design.md §5)."""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from ._backends._handler_calls import (
    Handler,
    HandlerKind,
    Stream,
    call_handler,
    handler_kind,
    is_cancellation,
)
from ._capture import JobOutput, OutputCapture, job_output, logs_for_job
from ._categories import classify
from ._chunk_posts import ChunkPoster, ChunkSink
from ._compat import DEBUGGER_MODULE, clear_reference_debugger
from ._exceptions import MalformedJob, exception_leaves
from ._exit import exit_status
from ._fitting import clip
from ._payloads import JobError, ResultEncodingError, chunk_body, encode_body, notice
from ._progress_calls import ProgressTarget, current_progress
from ._tracebacks import error_type_name, format_traceback, one_line, safe_str

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._backends import Backend
    from ._config import Settings
    from ._options import WorkerOptions
    from ._payloads import Payloads
    from ._scopes import Scopes
    from ._state import HeldJob

log = logging.getLogger("trio_worker")


@dataclass(frozen=True)
class JobSpec:
    """What the user asked for, resolved once at start."""

    handler: Handler
    kind: HandlerKind
    return_aggregate_stream: bool
    backend: Backend  # where the handler's coroutines and async generators run

    @classmethod
    def from_options(cls, options: WorkerOptions) -> JobSpec:
        handler = options.handler
        return cls(
            handler,
            handler_kind(handler),
            options.return_aggregate_stream,
            options.backend,
        )


@dataclass(frozen=True)
class Report:
    """A terminal job-done body, ready to post.

    *exit* is set when the handler raised ``SystemExit`` or ``KeyboardInterrupt``: what
    ``serve()`` raises once the worker has delivered this report and shut down, and
    ``start()`` turns into the process's exit status (docs/design.md §9).
    """

    body: bytes
    is_stream: bool
    exit: SystemExit | KeyboardInterrupt | None = None

    @property
    def exit_status(self) -> int | None:
        return None if self.exit is None else exit_status(self.exit)


class JobRunner:
    def __init__(
        self,
        spec: JobSpec,
        settings: Settings,
        payloads: Payloads,
        chunks: ChunkSink,
        capture: OutputCapture | None,
        waits: Scopes,
        shared_process: Callable[[], bool],
        progress: ProgressTarget | None = None,
    ) -> None:
        self.waits = waits
        self.spec = spec
        self.settings = settings
        self.payloads = payloads
        self.chunks = chunks
        self.progress = progress
        self.capture = capture
        self.shared_process = shared_process

    async def run(self, job: HeldJob) -> Report:
        """Run the handler on *job*; trio.Cancelled (a stop, shutdown) propagates."""
        # No flush on the hot path: the flush happens when (and if) the logs are read.
        mark = self.capture.mark_nowait() if self.capture is not None else 0
        reset = current_progress.set(self.progress)
        try:
            return await self._run(job, mark)
        finally:
            current_progress.reset(reset)
            # As the reference's loop does after each job; only users of runpod's
            # rp_debugger have anything to clear.
            if DEBUGGER_MODULE in sys.modules:
                clear_reference_debugger()

    async def _run(self, job: HeldJob, mark: int) -> Report:
        with job_output(job.id) as output:
            try:
                result = await call_handler(
                    self.spec.handler,
                    self.spec.kind,
                    job.payload,
                    self.waits,
                    backend=self.spec.backend,
                    close_bound=self.settings.timings.sync_close_bound,
                )
                if isinstance(result, Stream):
                    return await self._stream(job, result, output, mark)
            except BaseException as exc:
                if is_cancellation(exc):
                    raise
                return self._handler_error(job.id, exc, output, mark)
        return self._result(job.id, result)

    def malformed_report(self, job_id: str, reason: str) -> Report:
        """The error reported on a job that could not be run as delivered."""
        exc = MalformedJob(f"job {job_id} was not run: {reason}")
        log_failed_job(job_id, "MalformedJob", str(exc), "unknown", self.settings)
        return Report(self.payloads.error(JobError.raised(exc)), is_stream=False)

    def shutdown_report(self, job_id: str, grace: float) -> Report:
        """The error reported on a job still running when the shutdown grace ran out."""
        error = notice("WorkerShutdown", job_id=job_id, grace_s=grace)
        message = f"still running when the shutdown grace of {grace:g} s ran out"
        log_failed_job(job_id, "WorkerShutdown", message, "worker_shutdown", self.settings)
        return Report(self.payloads.error(error), is_stream=False)

    def _logs(self, output: JobOutput | None, mark: int) -> str:
        return logs_for_job(
            self.capture,
            output,
            mark,
            shared_process=self.shared_process(),
            limit=self.settings.logs_tail_chars,
        )

    def _handler_error(
        self, job_id: str, exc: BaseException, output: JobOutput, mark: int
    ) -> Report:
        exc, status = process_exit(exc)
        exc = self.spec.backend.explain(exc)
        # Formatted before the logs are read: the output the job wrote last is on its
        # way to the capture meanwhile (through the crash watchdog, when watched).
        traceback = format_traceback(exc)
        logs = self._logs(output, mark)
        category = classify(exc, logs)
        log_failed_job(job_id, error_type_name(exc), safe_str(exc), category, self.settings)
        error = JobError.raised(exc, logs=logs, category=category, traceback=traceback)
        return Report(self.payloads.error(error), is_stream=False, exit=status)

    def _result(self, job_id: str, value: object) -> Report:
        return Report(self._encode(job_id, self.payloads.result(value)), is_stream=False)

    def _encode(self, job_id: str, body: dict[str, Any]) -> bytes:
        if "error" in body:
            # The handler returned {"error": ...}: the platform fails the job.
            error = str(body["error"])
            log_failed_job(job_id, "returned error", error, "unknown", self.settings)
        try:
            return encode_body(body)
        except ResultEncodingError as err:
            log_failed_job(job_id, error_type_name(err), str(err), "unknown", self.settings)
            return self.payloads.error(JobError.output(err))

    async def _stream(self, job: HeldJob, stream: Stream, output: JobOutput, mark: int) -> Report:
        aggregate: list[object] | None = [] if self.spec.return_aggregate_stream else None
        final: JobError | None = None
        status: SystemExit | KeyboardInterrupt | None = None
        async with trio.open_nursery() as nursery:
            poster = ChunkPoster(
                self.chunks, job.id, nursery, budget=self.settings.timings.report_budget
            )
            try:
                # Paced chunks of an async generator on the asyncio host come straight to
                # the poster, without waking this task; the rest come through this loop.
                stream.hand_off(calm_chunk_taker(poster, aggregate))
                # aclosing: a stream left early (error chunk, non-JSON chunk) runs the
                # user's cleanup now, not whenever the generator is garbage collected.
                chunks = aiter(stream)
                async with contextlib.aclosing(chunks):
                    try:
                        async for chunk in chunks:
                            if is_error_chunk(chunk):
                                final = JobError("error chunk", str(chunk["error"]), shape="chunk")
                                log_failed_job(
                                    job.id, "error chunk", final.message, "unknown", self.settings
                                )
                                break
                            try:
                                encoded = chunk_body(chunk)
                            except ResultEncodingError as err:
                                final = JobError.output(err)
                                log_failed_job(
                                    job.id, error_type_name(err), str(err), "unknown", self.settings
                                )
                                break
                            await poster.put(encoded)
                            if aggregate is not None:
                                aggregate.append(chunk)
                    except BaseException as exc:
                        if is_cancellation(exc):
                            raise
                        exc, status = process_exit(exc)
                        exc = self.spec.backend.explain(exc)
                        logs = self._logs(output, mark)
                        final = JobError.raised(
                            exc, logs=logs, category=classify(exc, logs), shape="stream"
                        )
                        log_failed_job(
                            job.id, final.error_type, final.message, final.category, self.settings
                        )
                # The report goes once every chunk is settled: delivered, or counted lost.
                await poster.settle()
            finally:
                poster.abandon()
        if final is None:
            body = self.payloads.stream_final(aggregate, poster.undelivered)
            return Report(self._encode(job.id, body), is_stream=True)
        error = self.payloads.error(final, undelivered=poster.undelivered)
        return Report(error, is_stream=True, exit=status)


def calm_chunk_taker(
    poster: ChunkPoster, aggregate: list[object] | None
) -> Callable[[object], bool]:
    """The runner's calm path, for a stream's source to hand chunks to where they are
    yielded (:meth:`Stream.hand_off`; docs/how-it-works.md, the asyncio backend). It
    refuses (False) anything else, which the loop then reads in order."""

    def take(chunk: object) -> bool:
        if not poster.accepts_now() or is_error_chunk(chunk):
            return False
        try:
            encoded = chunk_body(chunk)
        except ResultEncodingError:
            return False
        poster.put_now(encoded)
        if aggregate is not None:
            aggregate.append(chunk)
        return True

    return take


def is_error_chunk(chunk: object) -> bool:
    """The reference's rule: a chunk ``{"error": ...}`` (truthy) ends the stream, unstreamed."""
    return isinstance(chunk, dict) and bool(chunk.get("error"))


# How much of a failed job's message its ERROR log line carries: the report has the rest.
LOG_MESSAGE_CHARS = 1000


def log_failed_job(
    job_id: str, error_type: str, message: str, category: str, settings: Settings
) -> None:
    """The one ERROR line the worker's own log gets per failed job (never its input): the
    message redacted, clipped, on one line."""
    text = one_line(clip(settings.redactor.redact(message), LOG_MESSAGE_CHARS))
    log.error("job %s failed: %s: %s (category %s)", job_id, error_type, text, category)


def process_exit(exc: BaseException) -> tuple[BaseException, SystemExit | KeyboardInterrupt | None]:
    """For ``SystemExit``/``KeyboardInterrupt`` raised by a handler (alone or in a group):
    the exception to report, worded with the exit status, and a fresh one for ``serve()``
    to raise at the end. Anything else: *exc* and None.
    """
    leaves = exception_leaves(exc)
    leaf = next((e for e in leaves if isinstance(e, SystemExit | KeyboardInterrupt)), None)
    fresh: SystemExit | KeyboardInterrupt
    if isinstance(leaf, KeyboardInterrupt):
        fresh = KeyboardInterrupt()
        told: BaseException = KeyboardInterrupt(
            "handler raised KeyboardInterrupt: the worker exits with status 130 once this"
            " report is delivered"
        )
    elif isinstance(leaf, SystemExit):
        code = leaf.code
        fresh = SystemExit(exit_status(leaf))
        told = SystemExit(
            f"handler called sys.exit({'' if code is None else repr(code)}): the worker"
            f" exits with status {exit_status(leaf)} once this report is delivered"
        )
    else:
        return exc, None
    told.__traceback__ = leaf.__traceback__
    told.__cause__ = leaf.__cause__
    told.__context__ = leaf.__context__
    told.__suppress_context__ = leaf.__suppress_context__
    return told, fresh

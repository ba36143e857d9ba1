"""Per-job attribution of Python-level output, job logs, edge-safe redaction (docs/design.md §8).

The fd-level capture in ``_capture`` cannot tell jobs apart: every task writes to the
same fds 1 and 2. Python-level writes can be attributed, because they happen in the
job's own trio task, or in a thread that task started with ``trio.to_thread``, which runs
in a copy of the task's context. So ``install_python_stream_attribution`` wraps
``sys.stdout`` and ``sys.stderr`` once, with a wrapper that passes every write through
untouched and, when ``job_output`` has put a `JobOutput` in the current context, also
appends a copy of the text to it.

``logs_for_job`` puts a failed job's ``logs`` together from this and the fd-level capture.

Redaction happens when text is read out, never on single writes, because a secret can be
split over two writes. Reading out means cutting a window out of a longer text, and a cut
through the middle of a secret would leave its tail unrecognisable: ``redact_from``
redacts the window together with some text before it (``EDGE_CONTEXT``), then cuts.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TextIO, cast

from ._redact import EDGE_CONTEXT, redact_from

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from ._fd import OutputCapture
    from ._redact import Redactor

DEFAULT_JOB_CHARS = 1 << 16
SHARED_OUTPUT_HEADER = "--- process output (shared by all jobs) ---"

_current_job: ContextVar[JobOutput | None] = ContextVar("trio_worker_job_output", default=None)


class JobOutput:
    """The Python-level output of one job, bounded to its last ``max_chars`` characters."""

    def __init__(self, job_id: str, *, max_chars: int = DEFAULT_JOB_CHARS) -> None:
        self.job_id = job_id
        self._max_chars = max_chars
        self._chunks: list[str] = []
        self._size = 0
        # Writes can come from several threads of one job (trio.to_thread).
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<JobOutput {self.job_id!r} {self._size} chars>"

    def append(self, text: str) -> None:
        with self._lock:
            self._chunks.append(text)
            self._size += len(text)
            keep = self._max_chars + EDGE_CONTEXT
            # Trimming only once the buffer doubles keeps appends amortised O(1) whatever
            # the sizes of the writes; the EDGE_CONTEXT kept beyond the window lets
            # redacted_text() see a secret that straddles the window's start.
            if self._size > 2 * keep:
                self._chunks = ["".join(self._chunks)[-keep:]]
                self._size = keep

    def text(self, limit: int = 16384) -> str:
        """The job's own Python-level output, its last *limit* characters, not redacted."""
        if limit <= 0:
            return ""
        return self._joined()[-min(limit, self._max_chars) :]

    def redacted_text(self, redactor: Redactor, limit: int = 16384) -> str:
        """Like `text`, redacted, with a secret cut by the window's start still hidden."""
        if limit <= 0:
            return ""
        joined = self._joined()
        start = max(len(joined) - min(limit, self._max_chars), 0)
        context = max(start - EDGE_CONTEXT, 0)
        return redact_from(redactor, joined[context:], start - context)[-limit:]

    def _joined(self) -> str:
        with self._lock:
            joined = "".join(self._chunks)
            self._chunks = [joined]
            return joined


@contextlib.contextmanager
def job_output(job_id: str) -> Iterator[JobOutput]:
    """Attribute Python-level writes made in this context (and its copies) to a new JobOutput.

    The attribution follows trio tasks started from inside the block and threads started
    with ``trio.to_thread``, since both run in a copy of the current context. It only sees
    writes through ``sys.stdout``/``sys.stderr`` once `install_python_stream_attribution`
    has run.
    """
    job = JobOutput(job_id)
    token = _current_job.set(job)
    try:
        yield job
    finally:
        _current_job.reset(token)


class _AttributingStream:
    """A transparent stand-in for a text stream that copies writes to the current job."""

    __slots__ = ("_wrapped",)

    def __init__(self, wrapped: TextIO) -> None:
        self._wrapped = wrapped

    def __repr__(self) -> str:
        return f"<job-attributing {self._wrapped!r}>"

    def write(self, text: str) -> int:
        written = self._wrapped.write(text)
        # Copied only after the real write succeeded, so a job never "said" what failed.
        job = _current_job.get()
        if job is not None:
            job.append(text)
        return written

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        # fileno(), encoding, isatty(), flush(), buffer, reconfigure()... all belong to the
        # real stream, so C-level users and subprocess keep seeing the real fd.
        if name == "_wrapped":  # not set yet (copy, pickle): don't recurse
            raise AttributeError(name)
        return getattr(self._wrapped, name)


def install_python_stream_attribution() -> None:
    """Wrap sys.stdout and sys.stderr so writes inside `job_output` are attributed.

    Idempotent. Writes pass through unchanged. Code that took a reference to the old
    stream before this call (a ``logging.StreamHandler`` made earlier) bypasses the wrapper.
    """
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _AttributingStream):
            setattr(sys, name, cast("TextIO", _AttributingStream(stream)))


def logs_for_job(
    capture: OutputCapture | None,
    job: JobOutput | None,
    mark: int,
    *,
    shared_process: bool,
    limit: int = 16384,
) -> str:
    """The ``logs`` text for a failed job, redacted and at most *limit* characters.

    - *capture* None (``capture_logs="off"``): "".
    - *shared_process* False (concurrency 1): the fd-level output since *mark*, which
      includes C-level and child-process output.
    - *shared_process* True: the job's own Python-level output, then the line
      ``SHARED_OUTPUT_HEADER`` and the fd-level output since *mark*; the job's part gets
      up to half of *limit*, the shared part the rest, each keeping its tail.
    """
    if capture is None or limit <= 0:
        return ""
    if not shared_process:
        return capture.text_since(mark, limit)
    header = SHARED_OUTPUT_HEADER + "\n"
    budget = max(limit - len(header) - 1, 0)  # 1: the newline that may end the job's part
    own = job.redacted_text(capture.redactor, budget // 2) if job is not None else ""
    shared = capture.text_since(mark, budget - len(own))
    if own and not own.endswith("\n"):
        own += "\n"
    # Only a limit shorter than the header itself needs this last cut.
    return (own + header + shared)[-limit:]

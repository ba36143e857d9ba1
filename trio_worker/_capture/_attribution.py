"""Python-level writes attributed to the job that made them, and a failed job's ``logs``
(docs/how-it-works.md, "Output capture": per-job attribution)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO, cast

from ._fd import current_job

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._fd import JobOutput, OutputCapture

SHARED_OUTPUT_HEADER = "--- process output (shared by all jobs) ---"


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
        job = current_job.get()
        if job is not None:
            job.append(text)
        return written

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        # fileno(), encoding, flush()...: the real stream's, so C-level users and
        # subprocess keep seeing the real fd.
        if name == "_wrapped":  # not set yet (copy, pickle): don't recurse
            raise AttributeError(name)
        return getattr(self._wrapped, name)


def install_python_stream_attribution() -> None:
    """Wrap sys.stdout and sys.stderr so writes inside `job_output` are attributed.

    Idempotent. A reference to the old stream taken before this call bypasses the wrapper.
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

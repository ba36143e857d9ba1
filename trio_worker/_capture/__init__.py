"""What the process prints, captured for error reports, attributed, and redacted.

* ``_fd``: `OutputCapture`, the fd-level capture of fds 1 and 2 (what C extensions, CUDA
  and child processes write), passed through to the real stdout/stderr in order.
* ``_attribution``: per-job attribution of Python-level writes, and ``logs_for_job``,
  which puts a failed job's ``logs`` together from both.
* ``_feed``: the crash watchdog's tee of fds 1 and 2, and the `Feed` a watched worker's
  capture reads instead of redirecting them itself (docs/design.md §13.3).
* ``_pipes``: fd plumbing, and the pages of memory shared across fork and exec.
* ``_redact``: `Redactor`, which removes the worker's secrets from any text before it
  leaves the process, including across the edge of a cut window; ``_forms`` builds the
  pattern that finds a secret in every escaped form.

Data flows one way: ``_forms`` <- ``_redact`` <- ``_fd`` and ``_attribution``;
``_pipes`` <- ``_fd`` and ``_feed``; nothing here imports the rest of the package.
"""

from __future__ import annotations

from ._attribution import (
    SHARED_OUTPUT_HEADER,
    JobOutput,
    install_python_stream_attribution,
    job_output,
    logs_for_job,
)
from ._fd import OutputCapture
from ._pipes import flush_stdio
from ._redact import REDACTED, Redactor

__all__ = [
    "REDACTED",
    "SHARED_OUTPUT_HEADER",
    "JobOutput",
    "OutputCapture",
    "Redactor",
    "flush_stdio",
    "install_python_stream_attribution",
    "job_output",
    "logs_for_job",
]

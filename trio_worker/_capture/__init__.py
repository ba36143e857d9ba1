"""What the process prints, captured for error reports, attributed, and redacted.

* ``_fd``: `OutputCapture`, the fd-level capture of fds 1 and 2 (what C extensions, CUDA
  and child processes write), passed through to the real stdout/stderr in order; and each
  job's part of it, the one capture module a job enters: the mark it takes as it starts,
  and ``job_output``, the `JobOutput` that collects its own Python-level writes.
* ``_attribution``: the ``sys.stdout``/``sys.stderr`` wrapper that copies Python-level
  writes to the job that made them, and ``logs_for_job``, which puts a failed job's
  ``logs`` together from both.
* ``_feed``: the crash watchdog's tee of fds 1 and 2, and the `Feed` a watched worker's
  capture reads instead of redirecting them itself (docs/design.md §13.3).
* ``_pipes``: fd plumbing (an fd pointed at a pipe, a chunk written in full), and the pages
  of memory shared across fork and exec.
* ``_redact``: `Redactor`, which removes the worker's secrets from any text before it
  leaves the process, including across the edge of a cut window; ``_forms`` builds the
  pattern that finds a secret in every escaped form.

Data flows one way: ``_forms`` <- ``_redact`` <- ``_fd`` <- ``_attribution``; ``_pipes`` <-
``_fd`` and ``_feed``; nothing here imports the rest of the package.
"""

from __future__ import annotations

from ._attribution import SHARED_OUTPUT_HEADER, install_python_stream_attribution, logs_for_job
from ._fd import JobOutput, OutputCapture, job_output
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

"""What the process prints, captured for error reports, attributed, and redacted
(docs/how-it-works.md, "Output capture"; each module's job is in its module map).

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

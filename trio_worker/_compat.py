"""Living beside the reference SDK: what its utilities need from the worker loop.

``rp_debugger`` keeps process-wide per-job state that the reference's loop clears after
every job (docs/migration.md, the utilities table). The SDK never imports ``runpod``
(importing it configures the root logger and costs seconds): it only looks in
``sys.modules`` for the debugger module the user already loaded.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("trio_worker")

DEBUGGER_MODULE = "runpod.serverless.utils.rp_debugger"

_warned = False


def clear_reference_debugger() -> None:
    """Clear ``rp_debugger``'s checkpoints if the user's code has loaded it; else nothing.

    Called after each job, as the reference does. A failure (a future ``runpod`` that
    renamed the function, a broken install) is logged once and never fails a job.
    """
    module = sys.modules.get(DEBUGGER_MODULE)
    if module is None:
        return
    try:
        module.clear_debugger_output()
    except Exception as exc:
        _warn_once(exc)


def _warn_once(exc: Exception) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "could not clear runpod's rp_debugger checkpoints after a job (%s: %s); "
            "@rp_debugger.FunctionTimer may fail on later jobs",
            type(exc).__name__,
            exc,
        )

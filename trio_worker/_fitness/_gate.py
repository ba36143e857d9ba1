"""The fitness gate: every check before the first take, and what a failure does.

On the first failing check: one log line, one unhealthy ping, then
:class:`FitnessCheckFailed`, which ``start()`` turns into exit status 1; no job was taken
(docs/reference.md, "Fitness checks").
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from .._exceptions import TrioWorkerError
from .._tracebacks import one_line
from ._builtin import FitnessConfig, builtin_checks
from ._reach import send_unhealthy_ping
from ._registry import registered_checks, run_checks, warn_about_runpod_checks

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from .._backends import Backend
    from .._config import Settings
    from .._platform._http import StreamOpener

log = logging.getLogger("trio_worker")


class FitnessCheckFailed(TrioWorkerError):
    """A fitness check failed; it has been logged and reported, and no job was taken."""

    def __init__(self, check: str, reason: str) -> None:
        super().__init__(f"fitness check {check} failed: {reason}")
        self.check = check
        self.reason = reason


def note_local_mode(mode: str) -> None:
    """The one line saying the checks do not run in *mode* (as in the reference)."""
    warn_about_runpod_checks()
    log.info("fitness checks are not run in %s", mode)


async def check_fitness(
    settings: Settings,
    backend: Backend,
    environ: Mapping[str, str],
    *,
    open_stream: StreamOpener | None = None,
) -> None:
    """Run the registered checks, then the built-in ones, in order.

    Raises:
        ConfigurationError: a ``RUNPOD_*`` fitness variable is invalid (nothing ran).
        FitnessCheckFailed: a check failed, after the unhealthy ping was sent (or not,
            within its bound).
    """
    warn_about_runpod_checks()
    config = FitnessConfig.from_environ(environ)
    started = time.perf_counter()
    async with builtin_checks(
        config, settings.platform, environ, open_stream=open_stream
    ) as builtins:
        checks = [*registered_checks(), *builtins]
        if not checks:
            return
        log.debug("running %d fitness check(s)", len(checks))
        bound = settings.timings.fitness_check_timeout
        failure = await run_checks(checks, bound=bound, backend=backend)
    if failure is None:
        elapsed = (time.perf_counter() - started) * 1000
        names = ", ".join(check.name for check in checks)
        log.info("fitness checks passed in %.1f ms: %s", elapsed, one_line(names))
        return
    reason = settings.redactor.redact(failure.reason)
    # The check's own text: one line, whatever it holds (a newline would forge another).
    log.error("fitness check %s failed: %s", one_line(failure.check), one_line(reason))
    await send_unhealthy_ping(
        settings.platform,
        settings.timings,
        failure.check,
        reason,
        open_stream=open_stream,
    )
    log.error("the worker is unhealthy: exiting without taking a job")
    raise FitnessCheckFailed(failure.check, reason)


async def check_then_serve(
    settings: Settings,
    backend: Backend,
    environ: Mapping[str, str],
    serve: Callable[[], Awaitable[None]],
) -> None:
    """``start()``'s queue mode: :func:`check_fitness`, then *serve*."""
    await check_fitness(settings, backend, environ)
    await serve()

"""``start_app()``: a load-balancing worker process, as ``start()`` is a queue worker's.

The same process rules as ``start()`` (docs/design.md §9, §13, §14): flags, the crash
watchdog, capture, signals and the exit watchdog, and an exit through ``exit_process``.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import TYPE_CHECKING, NoReturn, Unpack, cast

from .._exit import exit_process, watched_process
from .._options import AppOptions, check_keywords, spelled_out, worker_options
from ._serve import Ports, bind_ports, check_app, serve_in_process

if TYPE_CHECKING:
    from collections.abc import Callable
    from socket import socket

    from .._backends._handler_calls import Handler
    from .._capture import OutputCapture
    from .._options import WorkerOptions
    from ._gate import ASGIApp

log = logging.getLogger("trio_worker")


@spelled_out("start_app")
def start_app(app: ASGIApp, **given: Unpack[AppOptions]) -> NoReturn:
    """Serve *app* as a Runpod load-balancing worker; never returns.

    The app (any ASGI 3 app: FastAPI, Starlette, ...) is served on ``PORT`` (default 80)
    and ``GET /ping`` on ``PORT_HEALTH`` (default: ``PORT``): 204 while the fitness checks,
    *initializer* and the app's lifespan startup run, 200 once they returned. Until then
    every app route answers 503 with ``Retry-After``, and the app never runs. Without an
    initializer, the app's lifespan startup is the load; the app takes the handler's place
    in choosing the backend. With the crash watchdog, a death is logged with its cause and
    the process exits with the worker's status. Full reference: docs/load-balancing.md.

    Args:
        app: the ASGI application.
        **given: the keyword arguments below.

    Returns:
        Never. Exit status 0 after a SIGTERM's shutdown; 1 when the load failed or timed
        out (after ``/ping`` answered 503 with the reason for ``Timings.failure_hold``
        seconds), or for a bad configuration; 2 for a bad flag or a port that cannot be
        bound; 128 + N after a second signal N.

    Raises:
        TypeError: for a keyword it does not take.
    """
    check_keywords("start_app", given)
    capture: OutputCapture | None = None
    leave: Callable[[int, OutputCapture | None], NoReturn] = exit_process
    try:
        options, sockets = _prepare(app, given)
        leave = functools.partial(
            exit_process, watchdog_seconds=options.timings.exit_flush_watchdog
        )
        settings = options.settings()
        capture, guard = watched_process(settings, options)
        status = serve_in_process(app, options, settings, sockets, capture, guard)
    except BaseException as exc:
        from .._start import _exit_status_for

        leave(_exit_status_for(exc), capture)
    leave(status, capture)


def _prepare(app: ASGIApp, given: AppOptions) -> tuple[WorkerOptions, list[socket]]:
    from .._flags import UsageError
    from .._start import command_line

    command_line(given.pop("argv", None))
    check_app(app)
    # The app takes the handler's place: the same checks, and the same backend rule.
    options = worker_options(cast("Handler", app), "start_app", **given)
    ports = Ports.from_environ(os.environ)
    try:
        # Bound here, in the process the user started: a port in use is one line and
        # status 2, before the watchdog forks.
        return options, bind_ports(ports)
    except OSError as exc:
        where = ports.app if ports.health is None else f"{ports.app} and {ports.health}"
        raise UsageError(f"cannot serve on port {where}: {exc}") from None

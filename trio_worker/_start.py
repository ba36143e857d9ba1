"""``start()``: the whole worker process, as ``runpod.serverless.start`` is.

See docs/design.md §2, §9 and §10.

It picks the mode the way the reference does: ``--rp_serve_api`` runs the local endpoint;
``--test_input`` (or no ``RUNPOD_WEBHOOK_GET_JOB`` at all) runs the handler once locally;
otherwise the queue worker runs until it is told to stop. It never returns: the process
exits through :func:`exit_process` with status 0 (shutdown, local success) or 1 (init
failure, local failure, bad configuration).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from . import _worker
from ._asyncio_host import run_for
from ._capture import OutputCapture, install_python_stream_attribution
from ._config import (
    CaptureMode,
    LocalArgs,
    Settings,
    Timings,
    log_level_from,
    parse_cli,
    read_test_input_file,
)
from ._exceptions import ConfigurationError, InitializationError
from ._exit import ExitGuard, exit_process
from ._options import worker_options

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ._handlers import Handler
    from ._initializer import Initializer
    from ._options import AsyncBackend, Concurrency, WorkerOptions

log = logging.getLogger("trio_worker")


class _JsonLines(logging.Formatter):
    """The reference's log shape when ``RUNPOD_ENDPOINT_ID`` is set."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {"requestId": None, "message": record.getMessage(), "level": record.levelname}
        )


def configure_logging(level: int, environ: Mapping[str, str]) -> None:
    """Give the ``trio_worker`` logger a handler unless the application already did."""
    logger = logging.getLogger("trio_worker")
    logger.setLevel(level)
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    if environ.get("RUNPOD_ENDPOINT_ID"):
        handler.setFormatter(_JsonLines())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False


def start(
    handler: Handler | Mapping[str, Any],
    *,
    initializer: Initializer | None = None,
    init_timeout: float | None = None,
    concurrency: Concurrency = 1,
    return_aggregate_stream: bool = False,
    refresh_worker: bool = False,
    async_backend: AsyncBackend | None = None,
    capture_logs: CaptureMode = "on",
    timings: Timings | None = None,
    argv: Sequence[str] | None = None,
) -> NoReturn:
    """Run this process as a worker; never returns (see the module docstring for statuses).

    *handler* may also be the reference's one dict,
    ``{"handler": h, "concurrency_modifier": f, ...}``; that form runs async handlers on
    asyncio unless *async_backend* says otherwise, the keyword form on trio.
    """
    capture: OutputCapture | None = None
    leave: Callable[[int, OutputCapture | None], NoReturn] = exit_process
    try:
        args = parse_cli(sys.argv[1:] if argv is None else argv)
        configure_logging(log_level_from(os.environ, args.log_level), os.environ)
        options = worker_options(
            handler,
            initializer=initializer,
            init_timeout=init_timeout,
            concurrency=concurrency,
            return_aggregate_stream=return_aggregate_stream,
            refresh_worker=refresh_worker,
            async_backend=async_backend,
            capture_logs=capture_logs,
            timings=timings,
        )
        leave = functools.partial(
            exit_process, watchdog_seconds=options.timings.exit_flush_watchdog
        )
        if args.serve_api:
            from ._local import run_dev_server

            leave(run_dev_server(options, args), None)
        if args.test_input is not None or not os.environ.get("RUNPOD_WEBHOOK_GET_JOB"):
            leave(_run_local(options, args), None)
        settings = Settings.from_environ(
            os.environ, timings=options.timings, capture_logs=options.capture_logs
        )
        if options.capture_logs == "on":
            capture = OutputCapture.install(redactor=settings.redactor)
            install_python_stream_attribution()
        guard = ExitGuard(options.timings, capture)
        guard.install()
        log.info("worker starting: %s", _worker.describe_settings(settings))
        seams = _worker.Seams(capture=capture, exit_guard=guard)
        run_for(
            options.async_backend,
            functools.partial(_worker.run_worker, options, seams=seams, handle_signals=False),
        )
    except ConfigurationError as exc:
        log.error("configuration error: %s", exc)
        leave(1, capture)
    except InitializationError:
        leave(1, capture)
    except BaseException:
        log.exception("worker crashed")
        leave(1, capture)
    leave(0, capture)


def _run_local(options: WorkerOptions, args: LocalArgs) -> int:
    from ._local import run_test_input

    test_input = args.test_input
    if test_input is None:
        test_input = read_test_input_file(Path.cwd())
    if test_input is None:
        log.error(
            "local mode: no --test_input and no test_input.json here; set RUNPOD_WEBHOOK_GET_JOB "
            "to run as a queue worker"
        )
        return 1
    return run_for(options.async_backend, run_test_input, options, test_input)

"""``start()``: the whole worker process, as ``runpod.serverless.start`` is.

See docs/design.md §2, §9 and §10.

It picks the mode the way the reference does: ``--rp_serve_api`` runs the local endpoint;
``--test_input`` (or no ``RUNPOD_WEBHOOK_GET_JOB`` at all) runs the handler once locally;
otherwise the queue worker runs until it is told to stop. It never returns: the process
exits through :func:`exit_process` with status 0 (shutdown, local success) or 1 (init
failure, local failure, bad configuration).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import trio

from . import _worker
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
from ._exit import exit_process

if TYPE_CHECKING:
    from ._handlers import Handler
    from ._initializer import Initializer
    from ._supervisor import Concurrency
    from ._worker import AsyncBackend

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


def _from_config_dict(config: Mapping[str, Any]) -> dict[str, Any]:
    """The reference's one-dict form: ``start({"handler": h, "concurrency_modifier": f})``."""
    if "handler" not in config:
        raise ConfigurationError("start({...}) needs a 'handler' key")
    known = {
        "handler",
        "concurrency_modifier",
        "return_aggregate_stream",
        "refresh_worker",
        "initializer",
        "init_timeout",
        "concurrency",
    }
    for key in config:
        if key not in known:
            log.warning("start(): ignoring unknown config key %r", key)
    kwargs = {k: v for k, v in config.items() if k in known and k != "concurrency_modifier"}
    if "concurrency_modifier" in config:
        kwargs["concurrency"] = config["concurrency_modifier"]
    return kwargs


def start(
    handler: Handler | Mapping[str, Any],
    *,
    initializer: Initializer | None = None,
    init_timeout: float | None = None,
    concurrency: Concurrency = 1,
    return_aggregate_stream: bool = False,
    refresh_worker: bool = False,
    async_backend: AsyncBackend = "trio",
    capture_logs: CaptureMode = "on",
    timings: Timings | None = None,
    argv: Sequence[str] | None = None,
) -> NoReturn:
    """Run this process as a worker; never returns (see the module docstring for statuses)."""
    kwargs: dict[str, Any] = {
        "handler": handler,
        "initializer": initializer,
        "init_timeout": init_timeout,
        "concurrency": concurrency,
        "return_aggregate_stream": return_aggregate_stream,
        "refresh_worker": refresh_worker,
    }
    capture: OutputCapture | None = None
    try:
        if isinstance(handler, Mapping):
            kwargs.update(_from_config_dict(handler))
        args = parse_cli(sys.argv[1:] if argv is None else argv)
        configure_logging(log_level_from(os.environ, args.log_level), os.environ)
        _worker.validate_backend(async_backend)
        if args.serve_api:
            from ._local import run_dev_server

            exit_process(run_dev_server(kwargs, args, timings=timings, capture_logs=capture_logs))
        if args.test_input is not None or not os.environ.get("RUNPOD_WEBHOOK_GET_JOB"):
            exit_process(_run_local(kwargs, args, capture_logs))
        settings = Settings.from_environ(os.environ, timings=timings, capture_logs=capture_logs)
        if capture_logs == "on":
            capture = OutputCapture.install(redactor=settings.redactor)
            install_python_stream_attribution()
        _worker.on_second_interrupt = lambda: exit_process(130, capture)
        log.info("worker starting: %s", _worker.describe_settings(settings))
        trio.run(
            lambda: _worker.serve(
                **kwargs,
                async_backend=async_backend,
                capture_logs=capture_logs,
                timings=timings,
                capture=capture,
            )
        )
    except ConfigurationError as exc:
        log.error("configuration error: %s", exc)
        exit_process(1, capture)
    except InitializationError:
        exit_process(1, capture)
    except BaseException:
        log.exception("worker crashed")
        exit_process(1, capture)
    exit_process(0, capture)


def _run_local(kwargs: dict[str, Any], args: LocalArgs, capture_logs: CaptureMode) -> int:
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
    return trio.run(run_test_input, kwargs, test_input, capture_logs)

"""``start()``: the whole worker process, as ``runpod.serverless.start`` is.

It picks the mode as the reference does and never returns (docs/design.md §2, §9, §10).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Unpack

import trio

from . import _worker
from ._exceptions import ConfigurationError, InitializationError, exception_leaves
from ._exit import exit_process, exit_status, watched_process
from ._fitness import FitnessCheckFailed, check_then_serve, note_local_mode
from ._flags import (
    LocalArgs,
    UsageError,
    configure_logging,
    log_level_from,
    parse_cli,
    program_name,
    read_test_input_file,
    reference_flags,
)
from ._options import StartOptions, check_keywords, spelled_out, worker_options

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ._backends._handler_calls import Handler
    from ._capture import OutputCapture
    from ._options import WorkerOptions

log = logging.getLogger("trio_worker")


@spelled_out("start")
def start(handler: Handler | Mapping[str, Any], **given: Unpack[StartOptions]) -> NoReturn:
    """Run this process as a Runpod Serverless worker; never returns.

    The drop-in for ``runpod.serverless.start``. The mode comes from the command line and
    the environment, as in the reference: ``--rp_serve_api`` serves the endpoint API on
    localhost; ``--test_input JSON`` (or no ``RUNPOD_WEBHOOK_GET_JOB``, then
    ``test_input.json`` in the current directory) runs the handler once; otherwise the
    queue worker takes jobs until SIGTERM/SIGINT. Full reference: docs/reference.md.

    Args:
        handler (callable or Mapping): called with each job dict (``{"id", "input", ...}``).
            A sync function (runs in a thread), an async function, a sync or async
            generator (streams its chunks), or a function returning one of those. May
            instead be the reference's one dict, ``{"handler": h, "concurrency_modifier":
            f, "return_aggregate_stream": b, "refresh_worker": b, "initializer": i,
            "init_timeout": t}``: its values win over the keywords.
        **given: the keyword arguments below.

    Returns:
        Never. The process ends through ``os._exit`` after flushing logs and streams, so
        a thread left behind cannot keep it alive.

    Raises:
        TypeError: for a keyword it does not take; otherwise nothing: every outcome is an
            exit status. 0: the queue worker shut down (signal, ``refresh_worker``), or a
            local run succeeded. 1: init failure (after every held job was failed), a
            failed local run, a ``ConfigurationError`` (logged as one ``configuration
            error:`` line), or a crash (logged with its traceback). 130: a second SIGINT
            during a shutdown. docs/reference.md lists every status.

    Examples:
        A worker file, run as ``python handler.py`` in the container::

            import trio_worker

            MODEL = None

            def load_model():
                global MODEL
                MODEL = ...  # slow, once per worker

            def handler(job):
                return {"text": MODEL.generate(job["input"]["prompt"])}

            trio_worker.start(handler, initializer=load_model, init_timeout=600)

        The reference's form, unchanged::

            trio_worker.start({"handler": handler, "concurrency_modifier": lambda n: 4})

        Locally: ``python handler.py --test_input '{"input": {"prompt": "hi"}}'``, or
        ``python handler.py --rp_serve_api --rp_api_port 8000`` for the endpoint API.
    """
    check_keywords("start", given)
    argv = given.pop("argv", None)
    capture: OutputCapture | None = None
    leave: Callable[[int, OutputCapture | None], NoReturn] = exit_process
    try:
        args = command_line(argv)
        options = worker_options(handler, "start", **given)
        leave = functools.partial(
            exit_process, watchdog_seconds=options.timings.exit_flush_watchdog
        )
        # Read (and checked) before the mode is picked: what would crash-loop once deployed
        # fails the local run the same way.
        settings = options.settings()
        if args.serve_api:
            note_local_mode("the local endpoint")
            leave(_serve_api(options, args), None)
        realtime = _realtime_port()
        if realtime is not None:
            # runpod's realtime mode: the handler behind an HTTP route (docs/load-balancing.md).
            from ._app._realtime import serve_realtime

            leave(serve_realtime(options, realtime), None)
        if args.test_input is not None or not settings.platform.queue_mode:
            note_local_mode("local mode")
            leave(_run_local(options, args), None)
        capture, guard = watched_process(settings, options)
        guard.install()
        log.info("worker starting: %s", _worker.describe_settings(settings))
        seams = _worker.Seams(capture=capture, exit_guard=guard)
        serve = functools.partial(_worker.run_worker, options, seams=seams, handle_signals=False)
        options.backend.run(
            functools.partial(check_then_serve, settings, options.backend, os.environ, serve)
        )
    except BaseException as exc:
        leave(_exit_status_for(exc), capture)
    leave(0, capture)


def command_line(argv: Sequence[str] | None) -> LocalArgs:
    """The reference's flags (*argv*, else ``sys.argv[1:]``), the logging they set up;
    ``--help`` prints them and exits 0.

    Raises:
        UsageError: a malformed flag.
        ConfigurationError: a log level that is not one.
    """
    args = parse_cli(sys.argv[1:] if argv is None else argv)
    if args.help:
        sys.stdout.write(reference_flags().format_help())
        exit_process(0)
    configure_logging(log_level_from(os.environ, args.log_level), os.environ)
    return args


def _realtime_port() -> int | None:
    from ._app._realtime import realtime_port

    return realtime_port(os.environ) if os.environ.get("RUNPOD_REALTIME_PORT") else None


def _exit_status_for(exc: BaseException) -> int:
    """The process's exit status for what ended :func:`start`, explained in one line.

    A group (the local endpoint's nursery) is looked through when it holds one error.
    """
    leaf = _sole_leaf(exc)
    if isinstance(leaf, UsageError):
        sys.stderr.write(f"{program_name()}: error: {leaf}\n")
        return 2
    if isinstance(leaf, ConfigurationError):
        log.error("configuration error: %s", leaf)
        return 1
    if isinstance(leaf, InitializationError | FitnessCheckFailed):
        return 1  # already logged and reported
    if isinstance(leaf, SystemExit | KeyboardInterrupt):
        # A handler raised it; its job has been reported failed (docs/design.md §9).
        status = exit_status(leaf)
        log.warning("exiting with status %d (%s)", status, type(leaf).__name__)
        return status
    log.error("worker crashed", exc_info=exc)
    return 1


def _sole_leaf(exc: BaseException) -> BaseException:
    """The one exception inside *exc* (Cancelled aside), or *exc* itself."""
    leaves = exception_leaves(exc, ignore=trio.Cancelled)
    return leaves[0] if len(leaves) == 1 else exc


# Binding the local endpoint failed for a reason the user fixes with another host or port.
_BIND_ERRORS = (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES)


def _serve_api(options: WorkerOptions, args: LocalArgs) -> int:
    from ._local import run_dev_server

    try:
        return run_dev_server(options, args)
    except BaseException as exc:
        leaf = _sole_leaf(exc)
        if isinstance(leaf, socket.gaierror) or (
            isinstance(leaf, OSError) and leaf.errno in _BIND_ERRORS
        ):
            where = f"{args.api_host}:{args.api_port}"
            reason = leaf.strerror or str(leaf)
            raise UsageError(f"cannot serve on {where}: {reason}") from None
        raise


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
    return options.backend.run(run_test_input, options, test_input)

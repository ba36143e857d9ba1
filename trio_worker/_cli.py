"""The ``trio-worker`` command: ``run`` (and ``python -m trio_worker``) and ``dev``.

What each does, and its usage errors (one line on stderr, status 2): docs/reference.md,
"The ``trio-worker`` command".
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from ._flags import DEFAULT_API_HOST, DEFAULT_API_PORT
from ._version import __version__

if TYPE_CHECKING:
    from collections.abc import Sequence

PROG = "trio-worker"
USAGE_ERROR = 2


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Tools for trio_worker, the Runpod Serverless worker SDK on trio.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="run a handler file as a worker, with the crash watchdog in front of it",
        description=RUN_DESCRIPTION,
    )
    _add_run_arguments(run)
    dev = commands.add_parser(
        "dev",
        help="serve the endpoint API locally with a real worker",
        description=(
            "Run HANDLER_FILE as `python HANDLER_FILE --rp_serve_api` would: its trio_worker."
            "start() call serves the Runpod endpoint API (/run, /runsync, /status, /stream,"
            " /cancel, /health) on HOST:PORT, with a real worker taking the jobs over"
            " loopback HTTP. Arguments after the flags below are passed to the file."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    dev.add_argument(
        "handler_file", nargs="?", help="the Python file that calls trio_worker.start()"
    )
    dev.add_argument(
        "--app",
        metavar="MODULE:APP",
        help="serve this ASGI app (a load-balancing worker) as start_app() does, /ping"
        " included, instead of a handler file; PORT is --port",
    )
    dev.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests whose Host is NAME (a docker-compose service, a proxy)",
    )
    dev.add_argument(
        "--host",
        default=DEFAULT_API_HOST,
        help=(
            "address to listen on; requests must name it, localhost, 127.0.0.1 or [::1]"
            " in their Host header"
        ),
    )
    dev.add_argument("--port", type=int, default=DEFAULT_API_PORT, help="port to listen on")
    return parser


RUN_DESCRIPTION = (
    "Run HANDLER_FILE as `python HANDLER_FILE ARGS` would, as the child of the crash"
    " watchdog, which starts first: if the worker process dies (a segfault, the OOM"
    " killer), every job it held is reported failed with WorkerCrashed. Signals are"
    " forwarded, the output passed through, the worker's exit status is this command's."
    " Safe as PID 1 of a container. Without RUNPOD_WEBHOOK_GET_JOB, with --test_input or"
    " --rp_serve_api, or with TRIO_WORKER_CRASH_WATCH=0, the file runs in its place."
)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "handler_file",
        metavar="HANDLER_FILE",
        help="the Python file that calls trio_worker.start()",
    )
    rest = parser.add_argument(
        "args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to the file as they are"
    )
    rest.required = False  # argparse makes a REMAINDER required, and would name it missing


def launch_main(argv: Sequence[str] | None = None, prog: str = "python -m trio_worker") -> int:
    """``python -m trio_worker HANDLER_FILE [ARGS]``: ``trio-worker run`` by another name."""
    parser = _Parser(prog=prog, description=RUN_DESCRIPTION)
    _add_run_arguments(parser)
    try:
        args = parser.parse_args(argv)
        _check_file(args.handler_file)
    except _UsageError as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return USAGE_ERROR
    return _launch(prog, args.handler_file, args.args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; its exit status (a file that calls ``start()`` exits through it)."""
    try:
        args, rest = _parser().parse_known_args(argv)
        if args.command == "dev" and args.app is not None:
            return _serve_app(args.app, args.port, rest)
        if args.handler_file is None:
            raise _UsageError("give a HANDLER_FILE, or --app MODULE:APP")
        _check_file(args.handler_file)
    except _UsageError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return USAGE_ERROR
    if args.command == "run":
        return _launch(PROG, args.handler_file, [*args.args, *rest])
    path = Path(args.handler_file)
    sys.argv = [
        args.handler_file,
        "--rp_serve_api",
        "--rp_api_host",
        args.host,
        "--rp_api_port",
        str(args.port),
        *(f"--rp_api_allow_host={name}" for name in args.allow_host),
        *rest,
    ]
    # As `python FILE`: the file's own directory (symlinks resolved) is sys.path[0], in
    # place of the directory of whatever launched this command.
    sys.path[0] = str(path.resolve().parent)
    runpy.run_path(str(path), run_name="__main__")
    sys.stderr.write(
        f"{PROG}: error: {args.handler_file} ran to its end without calling trio_worker.start()\n"
    )
    return USAGE_ERROR


def _check_file(handler_file: str) -> None:
    path = Path(handler_file)
    if not path.is_file():
        why = "is a directory" if path.is_dir() else "no such file"
        raise _UsageError(f"{handler_file}: {why}")


def _launch(prog: str, handler_file: str, args: list[str]) -> int:
    from ._watch._launch import launch

    try:
        launch(handler_file, args)
    except OSError as exc:
        sys.stderr.write(f"{prog}: error: cannot start {sys.executable}: {exc}\n")
        return 1


def _serve_app(spec: str, port: int, rest: list[str]) -> int:
    """``--app module:app``: import it from the current directory and serve it."""
    import importlib
    import os

    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise _UsageError(f"--app must be MODULE:APP, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        app = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise _UsageError(f"--app {spec}: {exc}") from None
    os.environ["PORT"] = str(port)
    from ._app import start_app

    start_app(app, argv=rest)


if __name__ == "__main__":
    raise SystemExit(main())

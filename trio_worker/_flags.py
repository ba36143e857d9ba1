"""The reference SDK's command line and log level: its ``--rp_*`` and ``--test_input`` flags
(docs/protocol.md §1), ``test_input.json``, and ``RUNPOD_LOG_LEVEL`` / ``RUNPOD_DEBUG_LEVEL``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, NoReturn

from ._exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

DEFAULT_API_HOST = "localhost"
DEFAULT_API_PORT = 8000
LOG_LEVELS = {
    "NOTSET": logging.NOTSET,
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}
# The reference also accepts an index 0-5 into its own list of names.
_LEVEL_BY_INDEX = ["NOTSET", "TRACE", "DEBUG", "INFO", "WARN", "ERROR"]


@dataclasses.dataclass(frozen=True)
class LocalArgs:
    """The reference's CLI flags (``--rp_*``, ``--test_input``)."""

    test_input: object | None = None
    log_level: str | None = None
    serve_api: bool = False
    api_host: str = DEFAULT_API_HOST
    api_port: int = DEFAULT_API_PORT
    # Host names the local endpoint answers besides this machine's (a compose service,
    # a proxy's name): our flag, not the reference's.
    allow_hosts: tuple[str, ...] = ()
    debugger: bool = False
    help: bool = False  # --help: start() prints the flags and exits 0


def log_level_from(environ: Mapping[str, str], cli_value: str | None) -> int:
    """The log level: ``--rp_log_level``, else ``RUNPOD_LOG_LEVEL``, else ``RUNPOD_DEBUG_LEVEL``.

    The default is INFO, not the reference's DEBUG (docs/protocol.md §8 item 39).
    """
    if cli_value is not None:
        source, raw = "--rp_log_level", cli_value
    elif environ.get("RUNPOD_LOG_LEVEL"):
        source, raw = "RUNPOD_LOG_LEVEL", environ["RUNPOD_LOG_LEVEL"]
    elif environ.get("RUNPOD_DEBUG_LEVEL"):
        source, raw = "RUNPOD_DEBUG_LEVEL", environ["RUNPOD_DEBUG_LEVEL"]
    else:
        return logging.INFO
    name = raw.strip().upper()
    if name.isdigit() and int(name) < len(_LEVEL_BY_INDEX):
        name = _LEVEL_BY_INDEX[int(name)]
    if name not in LOG_LEVELS:
        choices = ", ".join(LOG_LEVELS)
        raise ConfigurationError(f"{source} must be one of {choices} (or 0-5), got {raw!r}")
    return LOG_LEVELS[name]


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


class UsageError(ConfigurationError):
    """A mistake on the command line: one line on stderr and exit status 2, as argparse."""


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


_FLAGS_DESCRIPTION = """\
Runs this file as a Runpod Serverless worker (trio_worker.start). With RUNPOD_WEBHOOK_GET_JOB
set, as on the platform, it takes jobs from the queue until SIGTERM; without it, it runs
the handler once on --test_input (or ./test_input.json), or serves the endpoint API on
localhost with --rp_serve_api. Flags it does not know are left to the program."""


def program_name() -> str:
    """How ``--help`` and usage errors name the program: argparse's own rule, except that an
    embedding interpreter's empty ``sys.argv`` gives "worker", not an ``IndexError``."""
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "worker"


def reference_flags() -> argparse.ArgumentParser:
    """The reference SDK's flags, as ``start()`` reads them (``python worker.py --help``)."""
    # No abbreviations: an unrelated --test flag must not be taken for --test_input.
    parser = _RaisingParser(
        prog=program_name(),
        description=_FLAGS_DESCRIPTION,
        add_help=False,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("-h", "--help", action="store_true", help="show this help and exit")
    add(
        "--test_input",
        metavar="JSON",
        help="run the handler once on this job, e.g. "
        """'{"input": {"prompt": "hi"}}', print the result and exit""",
    )
    add(
        "--rp_log_level",
        metavar="LEVEL",
        help="ERROR, WARN, INFO, DEBUG or 0-5 (default: "
        "RUNPOD_LOG_LEVEL, else RUNPOD_DEBUG_LEVEL, else INFO)",
    )
    add(
        "--rp_serve_api",
        action="store_true",
        help="serve the endpoint API (/run, /runsync, "
        "/status, /stream, ...) on localhost with a real worker behind it",
    )
    add(
        "--rp_api_host",
        default=DEFAULT_API_HOST,
        metavar="HOST",
        help=f"--rp_serve_api's address (default: {DEFAULT_API_HOST})",
    )
    add(
        "--rp_api_port",
        default=str(DEFAULT_API_PORT),
        metavar="PORT",
        help=f"--rp_serve_api's port (default: {DEFAULT_API_PORT})",
    )
    add(
        "--rp_api_allow_host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests whose Host is NAME (a docker-compose service, a proxy's"
        " host name); repeat it, or give several names separated by commas",
    )
    add("--rp_debugger", action="store_true", help="accepted for compatibility and ignored")
    return parser


def parse_cli(argv: Sequence[str]) -> LocalArgs:
    """Parse the reference's flags from *argv*, ignoring flags that are not ours.

    Raises:
        UsageError: when ``--test_input`` has no value or is not JSON, or a port is not a
            number.
    """
    try:
        known, _unknown = reference_flags().parse_known_args(list(argv))
    except UsageError as exc:
        if "--test_input" in str(exc):
            raise UsageError(
                """--test_input needs a value: the job as JSON, e.g. --test_input '{"input": {}}'"""
            ) from None
        raise
    test_input: object | None = None
    if known.test_input is not None:
        try:
            test_input = json.loads(known.test_input)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--test_input must be JSON: {exc}") from None
    try:
        port = int(known.rp_api_port)
    except ValueError:
        raise UsageError(f"--rp_api_port must be an integer, got {known.rp_api_port!r}") from None
    return LocalArgs(
        test_input=test_input,
        log_level=known.rp_log_level,
        serve_api=known.rp_serve_api,
        api_host=known.rp_api_host,
        api_port=port,
        allow_hosts=tuple(
            name.strip()
            for given in known.rp_api_allow_host
            for name in given.split(",")
            if name.strip()
        ),
        debugger=known.rp_debugger,
        help=known.help,
    )


def read_test_input_file(cwd: Path) -> object | None:
    """The contents of ``test_input.json`` in *cwd*, or None when there is none.

    Raises:
        ConfigurationError: when the file exists but is not JSON.
    """
    path = cwd / "test_input.json"
    if not path.is_file():
        return None
    try:
        data: object = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{path} is not valid JSON: {exc}") from None
    return data

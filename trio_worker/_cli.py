"""The ``trio-worker`` command: ``trio-worker dev handler.py`` runs the local endpoint.

The handler file is run as ``__main__`` with ``--rp_serve_api`` added to its arguments, so
its own ``trio_worker.start(...)`` call picks the local endpoint mode, exactly as
``python handler.py --rp_serve_api`` would.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trio-worker")
    commands = parser.add_subparsers(dest="command", required=True)
    dev = commands.add_parser("dev", help="serve the endpoint API locally with a real worker")
    dev.add_argument("handler_file", help="the Python file that calls trio_worker.start()")
    dev.add_argument("--host", default="localhost")
    dev.add_argument("--port", type=int, default=8000)
    args, rest = parser.parse_known_args(argv)
    sys.argv = [
        args.handler_file,
        "--rp_serve_api",
        "--rp_api_host",
        args.host,
        "--rp_api_port",
        str(args.port),
        *rest,
    ]
    runpy.run_path(args.handler_file, run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m trio_worker.testing``: the fake platform as its own process."""

from __future__ import annotations

import sys

from ._server import main

if __name__ == "__main__":
    sys.exit(main())

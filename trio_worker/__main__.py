"""``python -m trio_worker handler.py [args]``: the launcher, as ``trio-worker run``.

The crash watchdog starts first and runs the handler file as its child
(docs/design.md §13.1).
"""

from __future__ import annotations

import sys

from ._cli import launch_main

if __name__ == "__main__":
    sys.exit(launch_main())

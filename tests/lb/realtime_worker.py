"""A queue-style handler that ``start()`` serves on runpod's realtime route when
``RUNPOD_REALTIME_PORT`` is set (tests/lb/test_realtime.py)."""

from __future__ import annotations

import sys
import time
from typing import Any

import trio_worker

RUNNING = {"now": 0}


def load() -> None:
    print("model loaded", flush=True)


def handler(job: dict[str, Any]) -> dict[str, Any]:
    if job["input"].get("fail"):
        raise ValueError("bad prompt")
    if "exit" in job["input"]:
        sys.exit(job["input"]["exit"])
    RUNNING["now"] += 1
    seen = RUNNING["now"]
    time.sleep(job["input"].get("hold", 0))
    RUNNING["now"] -= 1
    return {"echo": job["input"], "running": seen}


if __name__ == "__main__":
    trio_worker.start(handler, initializer=load)

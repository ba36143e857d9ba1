"""The compatibility suite: real handlers that keep the reference SDK (``runpod``) beside
trio_worker, and the reference's endpoint client against the local endpoint.

It needs ``runpod`` installed, which trio_worker never depends on: ``tox -e compat``
installs it. Elsewhere these tests are skipped, unless ``TRIO_WORKER_COMPAT=1`` says they
must run (the tox env sets it, so a broken install fails instead of skipping).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

import pytest
import trio

from ..conftest import Platform
from ..integration.conftest import REPO, WorkerProcess, kill_all, open_worker

__all__ = ["HANDLERS", "REPO", "Platform", "Spawn", "WorkerProcess"]

HANDLERS = Path(__file__).with_name("handlers")

if importlib.util.find_spec("runpod") is None:
    if os.environ.get("TRIO_WORKER_COMPAT") == "1":
        raise RuntimeError("TRIO_WORKER_COMPAT=1 but runpod is not installed")
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture
def ping_interval_ms() -> int:
    """The compatibility tests ask the worker for a 100 ms heartbeat (the default is 200)."""
    return 100


class Spawn(Protocol):
    async def __call__(
        self, handler: str, env: dict[str, str], *args: str, cwd: Path | None = None
    ) -> WorkerProcess: ...


@pytest.fixture
async def spawn(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Spawn]:
    """``await spawn("file.py", env, *args)``: ``python handlers/file.py`` in *tmp_path*."""
    started: list[WorkerProcess] = []

    async def start(
        handler: str, env: dict[str, str], *args: str, cwd: Path | None = None
    ) -> WorkerProcess:
        argv = [sys.executable, str(HANDLERS / handler), *args]
        worker = await open_worker(nursery, argv, env, cwd or tmp_path)
        started.append(worker)
        return worker

    yield start
    await kill_all(started)

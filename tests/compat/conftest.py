"""The compatibility suite: real handlers that keep the reference SDK (``runpod``) beside
trio_worker, and the reference's endpoint client against the local endpoint.

It needs ``runpod`` installed, which trio_worker never depends on: ``tox -e compat``
installs it. Elsewhere these tests are skipped, unless ``TRIO_WORKER_COMPAT=1`` says they
must run (the tox env sets it, so a broken install fails instead of skipping).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pytest
import trio

from trio_worker.testing import FakePlatform, run_platform_server

HANDLERS = Path(__file__).with_name("handlers")
REPO = Path(__file__).resolve().parents[2]

if importlib.util.find_spec("runpod") is None:
    if os.environ.get("TRIO_WORKER_COMPAT") == "1":
        raise RuntimeError("TRIO_WORKER_COMPAT=1 but runpod is not installed")
    collect_ignore_glob = ["test_*.py"]


@dataclass
class Platform:
    fake: FakePlatform
    url: str

    def env(self, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "TW_"))}
        env.update(self.fake.worker_env(self.url, ping_interval_ms=100))
        env["PYTHONPATH"] = str(REPO)
        env.update(overrides)
        return env


@dataclass
class WorkerProcess:
    process: trio.Process
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)

    @property
    def output(self) -> str:
        return (self.stdout + self.stderr).decode(errors="replace")

    async def stop(self, timeout: float = 30.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        with trio.fail_after(timeout):
            return await self.process.wait()


async def _pump(stream: trio.abc.ReceiveStream, into: bytearray) -> None:
    async for chunk in stream:
        into.extend(chunk)


@pytest.fixture
async def platform() -> AsyncIterator[Platform]:
    fake = FakePlatform(take_hold=1.0, stop_hold=1.0)
    async with run_platform_server(fake) as url:
        yield Platform(fake, url)


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
        process = await trio.lowlevel.open_process(
            [sys.executable, str(HANDLERS / handler), *args],
            env=env,
            cwd=str(cwd or tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        worker = WorkerProcess(process)
        assert process.stdout is not None and process.stderr is not None
        nursery.start_soon(_pump, process.stdout, worker.stdout)
        nursery.start_soon(_pump, process.stderr, worker.stderr)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.process.returncode is None:
            os.killpg(worker.process.pid, signal.SIGKILL)
            await worker.process.wait()

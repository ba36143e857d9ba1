"""Fixtures for end-to-end tests: worker processes (the fake platform over loopback is the
``platform`` fixture of tests/conftest.py)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pytest
import trio

WORKER_APP = Path(__file__).with_name("worker_app.py")
REPO = Path(__file__).resolve().parents[2]


@dataclass
class WorkerProcess:
    process: trio.Process
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    pumped: list[trio.Event] = field(default_factory=list)
    # Set (and replaced) each time output arrives: what `until_output` waits on.
    grew: trio.Event = field(default_factory=trio.Event)

    @property
    def output(self) -> str:
        return (self.stdout + self.stderr).decode(errors="replace")

    def note_output(self) -> None:
        self.grew.set()
        self.grew = trio.Event()

    async def until_output(self, text: str, timeout: float = 20.0) -> None:
        """Wait until *text* appears in the output (or the pipes close without it)."""
        await self.until_match(re.escape(text), timeout)

    async def until_match(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        """Wait until *pattern* matches the output; the match. A pattern that ends with a
        newline waits for the whole line: a read may end mid-line (the child's output
        reaches the test through the capture's pipes in pieces)."""
        with trio.fail_after(timeout):
            while (match := re.search(pattern, self.output)) is None:
                if all(done.is_set() for done in self.pumped):
                    raise AssertionError(f"{pattern!r} never printed:\n{self.output}")
                await self.grew.wait()
        return match

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    async def wait(self, timeout: float = 30.0) -> int:
        with trio.fail_after(timeout):
            status = await self.process.wait()
        # The process is gone, but its last lines may still sit in the pipes.
        with trio.move_on_after(5.0):
            for done in self.pumped:
                await done.wait()
        return status

    async def stop(self, timeout: float = 30.0) -> int:
        self.signal(signal.SIGTERM)
        return await self.wait(timeout)


async def open_worker(
    nursery: trio.Nursery, argv: list[str], env: dict[str, str], cwd: Path | None = None
) -> WorkerProcess:
    """Start *argv* in a session of its own, its output pumped until the pipes close."""
    process = await trio.lowlevel.open_process(
        argv,
        env=env,
        cwd=None if cwd is None else str(cwd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    worker = WorkerProcess(process)
    assert process.stdout is not None and process.stderr is not None
    worker.pumped = [trio.Event(), trio.Event()]
    nursery.start_soon(_pump, process.stdout, worker, worker.stdout, worker.pumped[0])
    nursery.start_soon(_pump, process.stderr, worker, worker.stderr, worker.pumped[1])
    return worker


async def kill_all(workers: list[WorkerProcess]) -> None:
    """Teardown: whatever is still alive is killed with its whole session."""
    for worker in workers:
        if worker.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # its session already gone
                os.killpg(worker.process.pid, signal.SIGKILL)
            await worker.process.wait()


async def _pump(
    stream: trio.abc.ReceiveStream, worker: WorkerProcess, into: bytearray, done: trio.Event
) -> None:
    try:
        async for chunk in stream:
            into.extend(chunk)
            worker.note_output()
    except trio.Cancelled:
        # The test's nursery ends (it failed, or never waited for the worker): the process
        # must not outlive it, or it runs on into the tests after it.
        with trio.CancelScope(shield=True):
            await kill_all([worker])
        raise
    finally:
        done.set()
        worker.note_output()


class Spawn(Protocol):
    async def __call__(self, env: dict[str, str], *args: str) -> WorkerProcess: ...


@pytest.fixture
async def spawn(nursery: trio.Nursery) -> AsyncIterator[Spawn]:
    """``await spawn(env, *args)`` starts worker_app.py; killed at teardown if still alive."""
    started: list[WorkerProcess] = []

    async def start(env: dict[str, str], *args: str) -> WorkerProcess:
        worker = await open_worker(nursery, [sys.executable, str(WORKER_APP), *args], env)
        started.append(worker)
        return worker

    yield start
    await kill_all(started)

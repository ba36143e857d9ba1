"""Fitness checks that misbehave: they swallow their cancellation, raise a BaseException of
their own, leave processes running, or write lines into the worker's log.

Each still ends in one of the two outcomes a check has: it passed, or the worker sends one
unhealthy ping naming it and exits having taken no job (docs/reference.md, "Fitness
checks").
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio

import trio_worker
from trio_worker._fitness import FitnessCheckFailed
from trio_worker._fitness._children import descendants
from trio_worker.testing import FakePlatform

from .backends import BOTH_BACKENDS
from .fitness_gate import (
    empty_registry_fixture,  # noqa: F401 (a fixture)
    gate,
    memory_platform_fixture,  # noqa: F401 (a fixture)
    unhealthy,
)

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture
def released() -> Iterator[threading.Event]:
    """Set when the test is over: what a misbehaving check waits for, so that none of
    them outlives its test."""
    release = threading.Event()
    try:
        yield release
    finally:
        release.set()


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# -- a check that swallows its cancellation ----------------------------------------------


@BOTH_BACKENDS
async def test_an_async_check_that_swallows_cancellation_is_left_a_second_after_its_bound(
    backend: str,
    memory_platform: tuple[FakePlatform, Any],
    virtual_clock: trio.abc.Clock,
    released: threading.Event,
) -> None:
    # On trio it held the worker for ever: no take, no ping, and SIGTERM unanswered.
    sleep: Callable[[float], Any] = asyncio.sleep if backend == "asyncio" else trio.sleep

    @trio_worker.register_fitness_check
    async def stubborn() -> None:
        while not released.is_set():
            try:
                await sleep(0.01)
            except BaseException:  # the user's bare except, swallowing it all
                pass

    begun = trio.current_time()
    with trio.fail_after(60), pytest.raises(FitnessCheckFailed) as failed:
        await gate(memory_platform, backend=backend, fitness_check_timeout=4.5)
    assert trio.current_time() - begun == pytest.approx(5.5, abs=0.1)  # bound + 1 s
    assert failed.value.reason == "FitnessCheckTimeout: did not finish within 4.5s"
    (query,) = unhealthy(memory_platform[0])
    assert query["check"] == "stubborn"
    released.set()  # before the test's loop closes, which would wait for it a while


async def test_on_trio_an_async_check_still_sees_trio(
    memory_platform: tuple[FakePlatform, Any],
) -> None:
    # Its run is its own, but trio's: trio code, threads and timeouts work as in a task.
    seen: list[object] = []

    @trio_worker.register_fitness_check
    async def uses_trio() -> None:
        seen.append(await trio.to_thread.run_sync(lambda: "thread ok"))
        with trio.move_on_after(0.001):
            await trio.sleep_forever()
        seen.append(trio.lowlevel.current_trio_token())

    await gate(memory_platform)
    assert seen[0] == "thread ok"
    assert isinstance(seen[1], trio.lowlevel.TrioToken)
    assert unhealthy(memory_platform[0]) == []


# -- whatever a check raises -------------------------------------------------------------


class HostIsBroken(BaseException):
    """A BaseException of the user's own."""


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize(
    ("raised", "reason"),
    [
        (HostIsBroken("the NFS mount is gone"), "HostIsBroken: the NFS mount is gone"),
        (SystemExit(3), "SystemExit: 3"),
        (GeneratorExit(), "GeneratorExit: "),
    ],
    ids=["custom", "SystemExit", "GeneratorExit"],
)
async def test_a_base_exception_of_a_check_is_its_failure_with_the_unhealthy_ping(
    kind: str, raised: BaseException, reason: str, memory_platform: tuple[FakePlatform, Any]
) -> None:
    # It crashed the worker with no unhealthy ping.
    def sync_check() -> None:
        raise raised

    async def async_check() -> None:
        raise raised

    check = sync_check if kind == "sync" else async_check
    check.__name__ = "host_check"
    trio_worker.register_fitness_check(check)
    with pytest.raises(FitnessCheckFailed) as failed:
        await gate(memory_platform)
    assert failed.value.reason == reason
    (query,) = unhealthy(memory_platform[0])
    assert (query["check"], query["reason"]) == ("host_check", reason)


# -- the processes a check leaves running ------------------------------------------------


@pytest.mark.parametrize("outcome", ["passes", "fails"])
async def test_a_process_a_check_started_and_left_is_ended_with_the_check(
    outcome: str,
    memory_platform: tuple[FakePlatform, Any],
    started: list[subprocess.Popen[bytes]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Real time: the check's thread starts a real process.
    caplog.set_level(logging.WARNING, logger="trio_worker")

    @trio_worker.register_fitness_check
    def starts_a_sidecar() -> None:
        started.append(subprocess.Popen(SLEEPER))
        if outcome == "fails":
            raise RuntimeError("no GPU after all")

    if outcome == "fails":
        with pytest.raises(FitnessCheckFailed):
            await gate(memory_platform)
    else:
        await gate(memory_platform)
    [process] = started
    assert not alive(process.pid)
    assert process.pid not in descendants()
    assert f"(pid {process.pid}): ended" in caplog.text


async def test_a_check_cancelled_from_outside_still_has_its_processes_ended(
    memory_platform: tuple[FakePlatform, Any],
    started: list[subprocess.Popen[bytes]],
    released: threading.Event,
) -> None:
    # A SIGTERM during the checks cancels them: what the check left must still be ended,
    # shielded from that cancellation. Real time: the check's thread starts a real process.
    sidecar_up = threading.Event()

    @trio_worker.register_fitness_check
    def starts_a_sidecar_and_hangs() -> None:
        started.append(subprocess.Popen(SLEEPER))
        sidecar_up.set()
        released.wait()

    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(gate, memory_platform)
            await trio.to_thread.run_sync(sidecar_up.wait, abandon_on_cancel=True)
            scope.cancel()
    assert scope.cancelled_caught
    [process] = started
    assert not alive(process.pid)


async def test_processes_that_were_there_before_the_check_are_left_alone(
    memory_platform: tuple[FakePlatform, Any], started: list[subprocess.Popen[bytes]]
) -> None:
    # The application's own, started at import.
    started.append(subprocess.Popen(SLEEPER))  # noqa: ASYNC220 - before the run matters

    @trio_worker.register_fitness_check
    def passes() -> None:
        pass

    await gate(memory_platform)
    assert alive(started[0].pid)


async def test_the_descendants_of_a_checks_process_are_ended_too(
    memory_platform: tuple[FakePlatform, Any], started: list[subprocess.Popen[bytes]], tmp_path: Any
) -> None:
    pid_file = tmp_path / "grandchild"
    script = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen({SLEEPER!r})\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )

    @trio_worker.register_fitness_check
    def starts_a_tree() -> None:
        started.append(subprocess.Popen([sys.executable, "-c", script]))
        while not pid_file.exists() or not pid_file.read_text():
            threading.Event().wait(0.005)

    await gate(memory_platform)
    grandchild = int(pid_file.read_text())
    try:
        assert not alive(started[0].pid)
        assert not alive(grandchild)
    finally:
        if alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


# -- what a check says reaches the log as one line --------------------------------------


async def test_a_checks_message_cannot_write_lines_of_its_own_into_the_log(
    memory_platform: tuple[FakePlatform, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trio_worker")
    forged = "2026-01-01 00:00:00,000 INFO trio_worker: fitness checks passed in 1.0 ms: all"

    def check() -> None:
        raise RuntimeError(f"disk ok\n{forged}\r\x1b[2K\u2028done")

    check.__name__ = "disk\nprobe"
    trio_worker.register_fitness_check(check)
    with pytest.raises(FitnessCheckFailed):
        await gate(memory_platform)
    [line] = [r.getMessage() for r in caplog.records if "failed:" in r.getMessage()]
    assert line == (
        f"fitness check disk\\nprobe failed: RuntimeError: disk ok\\n{forged}\\r\\x1b[2K\\u2028done"
    )
    assert all("\n" not in r.getMessage() and "\x1b" not in r.getMessage() for r in caplog.records)

"""The asyncio host (``trio_worker.run_asyncio_host``, trio_worker/_backends/_host.py): the
loop that runs the worker's trio run as its guest, what it does without one, how it ends,
and that every kind of wake-up reaches the guest run."""

from __future__ import annotations

import asyncio

import pytest
import trio

import trio_worker
from trio_worker.testing import FakePlatform

WAIT = 30.0  # a safety bound on each wait; never reached when the code is right


@pytest.mark.parametrize("backend", ["trio"])  # trio.run: no asyncio host
async def test_serve_on_the_asyncio_backend_without_a_host_loop_says_how_to_get_one(
    backend: str,
) -> None:
    platform = FakePlatform()
    with pytest.raises(trio_worker.ConfigurationError, match="run_asyncio_host"):
        await trio_worker.serve(
            lambda job: None,
            async_backend="asyncio",
            environ=platform.worker_env("http://platform"),
            capture_logs="off",
        )


def test_the_host_loop_ends_even_when_a_task_ignores_its_cancellation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # asyncio.run() would wait for such a task forever: the worker process could never exit.
    from trio_worker._backends import _host

    monkeypatch.setattr(_host, "LEFTOVER_BOUND", 0.01)
    cancellations: list[int] = []

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(0.001)
            except asyncio.CancelledError:
                cancellations.append(1)

    async def main() -> str:
        asyncio.get_running_loop().create_task(stubborn())
        await trio.lowlevel.checkpoint()
        return "returned"

    assert trio_worker.run_asyncio_host(main) == "returned"
    assert cancellations  # it was asked to stop, and the host moved on anyway


# --- the guest run on the host loop (trio_worker/_backends/_host.py) ---------------------------


def test_every_kind_of_wake_up_reaches_the_guest_run() -> None:
    """trio as asyncio's guest still wakes for each kind of event: its I/O, its deadline,
    a call from another thread, a thread's result, and a trio.Event set by an asyncio
    callback while trio waits."""
    import threading
    import time

    woken: list[str] = []

    async def main() -> None:
        started = time.monotonic()
        await trio.sleep(0.002)  # a deadline
        assert time.monotonic() - started >= 0.002
        woken.append("deadline")
        ours, theirs = trio.socket.socketpair()
        with ours, theirs:

            async def send_later() -> None:
                await trio.sleep(0.001)
                await theirs.send(b"x")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_later)
                assert await ours.recv(1) == b"x"  # I/O
                woken.append("io")
        token = trio.lowlevel.current_trio_token()
        called = trio.Event()
        threading.Timer(0.001, lambda: token.run_sync_soon(called.set)).start()
        await called.wait()
        woken.append("another thread")
        assert await trio.to_thread.run_sync(lambda: "done") == "done"
        woken.append("thread result")
        loop = asyncio.get_running_loop()
        for _ in range(20):
            event = trio.Event()
            loop.call_later(0.0005, event.set)  # set from asyncio, while trio waits
            with trio.fail_after(WAIT):
                await event.wait()
        woken.append("asyncio callbacks")

    trio_worker.run_asyncio_host(main)
    assert woken == ["deadline", "io", "another thread", "thread result", "asyncio callbacks"]


def test_a_cancelled_host_task_cancels_the_guest_run_and_ends_cancelled() -> None:
    """asyncio code that cancels every task of the loop cancels the worker's trio run
    too; the host waits for that run to end, then ends as a cancelled asyncio task does."""
    ended: list[str] = []

    async def main() -> None:
        try:
            for task in asyncio.all_tasks():
                task.cancel()
            await trio.sleep_forever()
        finally:
            ended.append("trio run ended")

    with pytest.raises(asyncio.CancelledError):
        trio_worker.run_asyncio_host(main)
    assert ended == ["trio run ended"]

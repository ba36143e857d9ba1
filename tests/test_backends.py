"""The test clock shared by trio and the asyncio host loop (tests/backends.py)."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
import trio
import trio.testing

from tests.backends import (
    ASYNCIO_ONLY,
    BOTH_BACKENDS,
    HostLoopClock,
    run_on_asyncio_host,
    sleep_for,
)
from trio_worker import Timings as _Timings
from trio_worker._backends._asyncio import await_on_asyncio
from trio_worker._scopes import Scopes


@BOTH_BACKENDS
async def test_a_long_sleep_takes_virtual_time_only(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    started, wall = trio.current_time(), time.monotonic()
    if backend == "asyncio":
        await await_on_asyncio(asyncio.sleep(3600), waits=Scopes(_Timings()))
    else:
        await trio.sleep(3600)
    assert trio.current_time() - started == pytest.approx(3600)
    assert time.monotonic() - wall < 30  # a hang guard, not a timing claim


@ASYNCIO_ONLY
async def test_trio_and_asyncio_timers_fire_in_virtual_order(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    fired: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()

    async def asyncio_side() -> None:
        for _ in range(3):
            await asyncio.sleep(3)
            fired.append(("asyncio", loop.time()))

    async def trio_side() -> None:
        for _ in range(2):
            await trio.sleep(4)
            fired.append(("trio", trio.current_time()))

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio_side)
        await await_on_asyncio(asyncio_side(), waits=Scopes(_Timings()))
    assert [(side, round(at - start, 6)) for side, at in fired] == [
        ("asyncio", 3.0),
        ("trio", 4.0),
        ("asyncio", 6.0),
        ("trio", 8.0),
        ("asyncio", 9.0),
    ]


@ASYNCIO_ONLY
async def test_no_jump_while_asyncio_has_work_queued(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    # 2,000 steps of asyncio work and no timer: trio's pending deadline must not fire in
    # between (a plain MockClock autojump would leap to it at the first idle trio tick).
    async def busy() -> int:
        for _ in range(2_000):
            await asyncio.sleep(0)
        return 2_000

    with trio.move_on_after(1) as scope:
        assert await await_on_asyncio(busy(), waits=Scopes(_Timings())) == 2_000
    assert not scope.cancelled_caught
    assert trio.current_time() == 0


@ASYNCIO_ONLY
async def test_asyncio_timeouts_run_on_the_virtual_clock(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    started = trio.current_time()
    with pytest.raises(TimeoutError):
        await await_on_asyncio(asyncio.wait_for(asyncio.sleep(100), 7), waits=Scopes(_Timings()))
    assert trio.current_time() - started == pytest.approx(7)


@BOTH_BACKENDS
async def test_sleep_for_picks_the_backends_own_sleep(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    sleep = sleep_for(backend)
    coroutine = sleep(1)
    if backend == "asyncio":
        await await_on_asyncio(coroutine, waits=Scopes(_Timings()))
    else:
        await coroutine
    assert trio.current_time() == pytest.approx(1)


async def test_sharing_ends_with_the_block() -> None:
    clock = HostLoopClock()
    loop = asyncio.new_event_loop()
    try:
        real = loop.time()
        with clock.sharing(loop):
            assert loop.time() == clock.current_time()
        assert "time" not in vars(loop)
        assert loop.time() >= real
    finally:
        loop.close()


@pytest.mark.parametrize("autojump", [True, False], ids=["autojump", "manual"])
def test_trio_counts_as_idle_only_once_the_host_loop_is(autojump: bool) -> None:
    # The property suite's Baton resumes threads and jumps the clock when
    # wait_all_tasks_blocked returns: asyncio work still queued must come first.
    steps: list[int] = []

    async def busy() -> None:
        for n in range(2_000):
            await asyncio.sleep(0)
            steps.append(n)

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(busy())
        await trio.testing.wait_all_tasks_blocked()
        assert len(steps) == 2_000
        assert task.done()

    run_on_asyncio_host(main, clock=HostLoopClock(autojump=autojump))


def test_without_autojump_time_moves_only_by_jump() -> None:
    clock = HostLoopClock(autojump=False)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        woke: list[float] = []

        async def nap() -> None:
            await asyncio.sleep(5)
            woke.append(loop.time())

        task = loop.create_task(nap())
        await trio.testing.wait_all_tasks_blocked()
        # Idle on both sides, and still no jump: time belongs to whoever calls jump().
        assert trio.current_time() == 0
        assert clock.next_host_timer() == pytest.approx(5)
        clock.jump(5)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == [pytest.approx(5)]
        assert task.done()
        assert clock.next_host_timer() == math.inf
        with trio.move_on_after(100) as scope:
            await trio.testing.wait_all_tasks_blocked()
            assert trio.current_time() == pytest.approx(5)  # a trio deadline: no jump either
            clock.jump(100)
            await trio.lowlevel.checkpoint()
        assert scope.cancelled_caught
        # A thread at work: autojump would leap to the pending deadline (it is blind to
        # threads); without it the clock waits for whoever drives it.
        with trio.move_on_after(1):
            await trio.to_thread.run_sync(time.sleep, 0.02)
        assert trio.current_time() == pytest.approx(105)

    wall = time.monotonic()
    run_on_asyncio_host(main, clock=clock)
    assert time.monotonic() - wall < 30  # a hang guard, not a timing claim


def test_next_host_timer_outside_sharing_is_infinite() -> None:
    clock = HostLoopClock(autojump=False)
    assert clock.next_host_timer() == math.inf
    assert not clock.host_busy()

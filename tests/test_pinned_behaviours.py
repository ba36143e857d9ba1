"""Behaviours the docs promise that no other test pinned: each test here fails when its
behaviour is broken, through the public API and the fake platform (docs/protocol.md §2.1,
docs/design.md §2 and §5)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from typing import Any

import pytest
import trio

import trio_worker
import trio_worker.testing
from trio_worker.testing import FakePlatform, Fault


def _serve_a_no_op(platform: FakePlatform, **options: Any) -> functools.partial[Any]:
    # Not conftest's serve_in_process: a child process imports this module (ModelHandler).
    return functools.partial(
        trio_worker.testing.serve,
        lambda job: None,
        environ=platform.worker_env("http://platform"),
        app=platform,
        heartbeat="off",
        handle_signals=False,
        capture_logs="off",
        **options,
    )


EMPTY_TAKES = [
    pytest.param(None, id="204 at once"),
    pytest.param(Fault("take", status=400, times=10**9), id="400 (FlashBoot)"),
]


@pytest.mark.parametrize("fault", EMPTY_TAKES)
async def test_a_take_answered_no_job_at_once_pauses_instead_of_spinning(
    fault: Fault | None, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    """A platform that answers "no job" without holding the poll (an immediate 204, or the
    400 it gives under FlashBoot) is asked again only after a pause: over 10 s the worker
    makes about one take per ``empty_poll_floor`` (0.1 s), not one per loop turn."""
    platform = FakePlatform(take_hold=0.0)
    if fault is not None:
        platform.inject(fault)
    await nursery.start(_serve_a_no_op(platform))
    ceiling = 150  # 10 s / 0.1 s, with room; a spinning loop passes it at once
    with trio.move_on_after(10.0):
        await platform.wait_for_requests("take", ceiling)
        pytest.fail(f"{ceiling} takes in less than 10 s: the take loop spins")
    takes = sum(1 for r in platform.requests if r.route == "take")
    assert takes >= 20, takes  # it did keep asking
    nursery.cancel_scope.cancel()


@pytest.mark.parametrize("route", ["take", "stop"])
async def test_both_long_polls_answered_empty_at_once_wait_out_the_one_floor(
    route: str, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    """Take and stop have one floor, ``Timings.empty_poll_floor``: a route answered empty
    at once is asked again no sooner than the floor after it was last asked. The backoff
    base after an error (``error_backoff_min``, here far smaller) has no part in it."""
    platform = FakePlatform(take_hold=0.0, stop_hold=0.0)
    timings = trio_worker.Timings(empty_poll_floor=0.5, error_backoff_min=0.001)
    await nursery.start(_serve_a_no_op(platform, timings=timings))
    await trio.sleep(10.0)
    polls = sum(1 for r in platform.requests if r.route == route)
    # 10 s / 0.5 s is 20 polls, 21 with the first; a floor of 0.1 s would make about 100.
    assert 15 <= polls <= 21, polls
    nursery.cancel_scope.cancel()


class ModelHandler:
    """A class-based handler holding its model in ``self``, called through ``async def
    __call__``: the reference's users write these for vLLM-style engines."""

    async def __call__(self, job: dict[str, Any]) -> dict[str, str]:
        import sniffio

        return {"loop": sniffio.current_async_library()}


HANDLER_FILE = """
import sys
sys.path.insert(0, {tests!r})
import trio_worker
from test_pinned_behaviours import ModelHandler

trio_worker.start(ModelHandler())
"""


def test_an_object_with_async_call_defaults_to_the_asyncio_backend_like_an_async_def(
    tmp_path: os.PathLike[str],
) -> None:
    """docs/design.md §2: async user code, however it is spelled, runs on asyncio unless the
    caller names ``async_backend``."""
    handler_file = os.path.join(tmp_path, "handler.py")
    with open(handler_file, "w") as f:
        f.write(HANDLER_FILE.format(tests=os.path.dirname(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "PYTHONPATH"))}
    done = subprocess.run(
        [sys.executable, handler_file, "--test_input", '{"input": {}}'],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"output": {"loop": "asyncio"}}, done.stdout


async def test_a_stream_past_its_budget_still_gives_each_later_chunk_one_attempt(
    nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    """docs/design.md §5: a dead platform costs a stream its budget once; after that each
    chunk still gets one attempt, so tokens reach a platform that has come back."""

    async def tokens(job: dict[str, Any]) -> Any:
        yield {"i": 0}
        await trio.sleep(1)
        yield {"i": 1}  # during the outage: retried until the budget is spent, then lost
        await trio.sleep(60)
        yield {"i": 2}  # the platform is back; the budget is long spent

    platform = FakePlatform(take_hold=5.0)
    await nursery.start(
        functools.partial(
            trio_worker.testing.serve,
            tokens,
            environ=platform.worker_env("http://platform"),
            app=platform,
            heartbeat="off",
            handle_signals=False,
            capture_logs="off",
            timings=trio_worker.Timings(report_budget=20.0, report_attempt_timeout=1.0),
        )
    )
    job_id = platform.enqueue({})
    with trio.fail_after(60):
        await platform.wait_for_requests("stream", 1)
    await trio.sleep(0.5)
    assert platform.job(job_id).stream == [{"i": 0}]
    now = trio.current_time()
    platform.inject(Fault("stream", status=503, times=10**9, until=now + 40.0))
    with trio.fail_after(120):
        record = await platform.wait_for_status(job_id, "COMPLETED")
    assert record.stream == [{"i": 0}, {"i": 2}]
    nursery.cancel_scope.cancel()


AWAITABLE_CHECK_FILE = """
import functools
import trio_worker

async def _weights_present():
    raise RuntimeError("model file /models/model.safetensors not found")

def traced(fn):  # a decorator that hides the coroutine function behind a plain one
    @functools.wraps(fn)
    def wrapper():
        return fn()
    return wrapper

@trio_worker.register_fitness_check
@traced
def weights_present():
    return _weights_present()

trio_worker.start(lambda job: {"ok": True})
"""


async def test_a_sync_fitness_check_that_returns_an_awaitable_is_awaited_and_counts(
    tmp_path: os.PathLike[str],
) -> None:
    """A decorated async check looks sync; what it returns is awaited, and its failure is
    the worker's: one unhealthy ping naming it, exit 1, no job taken."""
    handler_file = trio.Path(tmp_path, "handler.py")
    await handler_file.write_text(AWAITABLE_CHECK_FILE)
    platform = FakePlatform(take_hold=1.0)
    async with trio_worker.testing.run_platform_server(platform) as url:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "PYTHONPATH"))}
        env.update(platform.worker_env(url), RUNPOD_SKIP_AUTO_SYSTEM_CHECKS="true")
        with trio.fail_after(30):  # a check not awaited passes: the worker would run on
            done = await trio.run_process(
                [sys.executable, str(handler_file)],
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert done.returncode == 1, done.stderr
    unhealthy = [p for p in platform.pings if p.query.get("status") == "unhealthy"]
    assert [p.query.get("check") for p in unhealthy] == ["weights_present"], done.stderr
    assert "model.safetensors not found" in unhealthy[0].query.get("reason", "")
    assert not any(r.route.startswith("take") for r in platform.requests)

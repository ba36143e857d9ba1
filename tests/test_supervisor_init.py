"""The supervisor in virtual time around the initializer: a take in flight the moment init
fails, the claim grace, a stop for a job held at the gate, sync initializers in a thread."""

from __future__ import annotations

import threading

import pytest
import trio

import trio_worker
import trio_worker.testing
from tests.backends import BOTH_BACKENDS, sleep_for
from tests.supervisor_harness import Harness, echo_on, error_of


@BOTH_BACKENDS
async def test_take_in_flight_at_init_failure_gets_claim_grace_and_its_job_is_failed(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    async def init() -> None:
        await sleep_for(backend)(1.0)
        raise RuntimeError("engine crashed")

    await harness.start(nursery, echo_on(backend), initializer=init, concurrency=2)
    # The first (batch) take gets one job; the single take for the free slot long-polls
    # across the failure at t=1.
    first = harness.platform.enqueue({})
    await harness.platform.wait_for_requests("take", 1)
    await trio.sleep(1.5)  # the failure happened at t=1; the take is still in flight
    late = harness.platform.enqueue({})
    await harness.finished.wait()
    assert harness.error is not None
    for job_id in (first, late):
        assert error_of(harness.platform, job_id)["event"] == "init_failed"
    assert harness.platform.job(late).take_time is not None


@BOTH_BACKENDS
async def test_take_in_flight_is_cut_at_claim_grace(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    async def init() -> None:
        raise RuntimeError("bad config")

    harness.platform.take_hold = 60.0
    started = trio.current_time()
    await harness.start(nursery, echo_on(backend), initializer=init)
    await harness.finished.wait()
    # claim_grace=3: the worker does not wait out the 60 s long-poll.
    assert trio.current_time() - started == pytest.approx(3.0, abs=0.01)


@BOTH_BACKENDS
async def test_stop_of_a_job_waiting_at_the_gate(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    async def init() -> None:
        await sleep_for(backend)(100)

    handle = await harness.start(nursery, echo_on(backend), initializer=init)
    job_id = harness.platform.enqueue({})
    await harness.wait_until(lambda: bool(handle.held_ids))
    assert handle.held_ids == (job_id,)
    harness.platform.request_stop(job_id)
    await harness.wait_until(lambda: not handle.held_ids)
    assert harness.platform.job(job_id).done_reports == []


@BOTH_BACKENDS
async def test_a_sync_initializer_runs_in_a_thread_and_holds_the_gate_until_it_returns(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    release = threading.Event()
    ran_in: list[threading.Thread] = []
    names: list[str] = []

    def init() -> None:
        ran_in.append(threading.current_thread())
        names.append(threading.current_thread().name)
        release.wait(30)  # a hang guard; the test sets it

    try:
        handle = await harness.start(nursery, echo_on(backend), initializer=init)
        job_id = harness.platform.enqueue({"n": 1})
        await harness.wait_until(lambda: job_id in handle.held_ids)
        assert harness.platform.job(job_id).status == "IN_PROGRESS"
        assert harness.platform.job(job_id).done_reports == []  # held at the gate
    finally:
        release.set()
    record = await harness.platform.wait_for_status(job_id, "COMPLETED")
    assert record.output == {"n": 1}
    [thread] = ran_in
    assert thread is not threading.main_thread()  # not the loop's thread
    assert names == ["trio_worker initializer"]  # named so a thread dump shows what hangs


@BOTH_BACKENDS
async def test_a_failing_sync_initializer_fails_the_queued_job_with_init_failed(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    def init() -> None:
        raise RuntimeError("weights missing")

    job_id = harness.platform.enqueue({})
    await harness.start(nursery, echo_on(backend), initializer=init)
    await harness.finished.wait()
    assert isinstance(harness.error, trio_worker.InitializationError)
    error = error_of(harness.platform, job_id)
    assert error["event"] == "init_failed"
    assert "weights missing" in error["error_message"]

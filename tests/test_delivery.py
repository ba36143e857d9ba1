"""Delivery that outlasts outages (docs/design.md §5), in virtual time.

The whole worker (trio_worker.testing.serve) runs its own HTTP client over
``memory_network`` against the fake platform, under ``MockClock(autojump_threshold=0)``:
minutes of outage cost no wall time. The platform's misbehaviour is either a ``Fault`` or a
stream opener that refuses, throttles or drips, as a real network would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
import trio.testing

import trio_worker
import trio_worker.testing
from trio_worker import Timings
from trio_worker.testing import FakePlatform, Fault, JobRecord
from trio_worker.testing._memory import memory_network

from .backends import BOTH_BACKENDS, sleep_for
from .conftest import serve_in_process

pytestmark = pytest.mark.timeout(60)

Opener = Callable[[str, int, bool], Any]


async def echo(job: dict[str, Any]) -> Any:
    return {"echo": job["input"]}


def echo_on(backend: str) -> Callable[[dict[str, Any]], Any]:
    """:func:`echo` with a checkpoint of *backend*'s own, as its async code would have."""
    sleep = sleep_for(backend)

    async def echo(job: dict[str, Any]) -> Any:
        await sleep(0)
        return {"echo": job["input"]}

    return echo


@contextlib.asynccontextmanager
async def running(
    platform: FakePlatform,
    handler: Any = None,
    *,
    timings: Timings | None = None,
    network: Callable[[Opener], Opener] | None = None,
    backend: str = "trio",
    **options: Any,
) -> AsyncIterator[trio_worker.WorkerHandle]:
    """A worker on *backend* serving *platform* over memory streams (the handler: an echo
    in *backend*'s code); shut down when the block ends."""
    async with memory_network(platform) as opener, trio.open_nursery() as nursery:
        serve = serve_in_process(
            platform,
            echo_on(backend) if handler is None else handler,
            backend=backend,
            open_stream=opener if network is None else network(opener),
            timings=timings or Timings(),
            **options,
        )
        handle: trio_worker.WorkerHandle = await nursery.start(serve)
        yield handle
        handle.shutdown("test over")


async def finished(platform: FakePlatform, job_id: str, status: str) -> JobRecord:
    """The job once it has *status*; a TooSlowError after an hour of virtual time (a test
    of a broken worker fails instead of spinning the virtual clock for ever)."""
    with trio.fail_after(3600):
        return await platform.wait_for_status(job_id, status)


def done_requests(platform: FakePlatform, job_id: str) -> list[Any]:
    return [r for r in platform.requests if r.route == "done" and r.path.endswith("/" + job_id)]


def clock_for(backend: str) -> Callable[[], float]:
    """What an async handler on *backend* reads the time with."""
    if backend == "asyncio":
        return lambda: asyncio.get_running_loop().time()
    return trio.current_time


def lost_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "RESULT LOST" in r.getMessage()]


# -- outages shorter than the budget lose nothing ------------------------------------------


@pytest.mark.parametrize("outage", [1.0, 3.0, 60.0])
async def test_a_503_outage_shorter_than_the_budget_loses_nothing(
    outage: float, autojump_clock: trio.testing.MockClock
) -> None:
    platform = FakePlatform()
    async with running(platform):
        start = trio.current_time()
        platform.inject(Fault("done", status=503, times=10**9, until=start + outage))
        job_id = platform.enqueue({"n": 1})
        job = await finished(platform, job_id, "COMPLETED")
    assert job.output == {"echo": {"n": 1}}
    assert job.done_time is not None
    assert job.done_time >= start + outage
    attempts = done_requests(platform, job_id)
    assert len(attempts) >= 2
    assert [r.status for r in attempts[:-1]] == [503] * (len(attempts) - 1)


class Refusing:
    """A network where every connect fails until ``until`` (trio time)."""

    def __init__(self, opener: Opener) -> None:
        self.opener = opener
        self.until = -math.inf
        self.refused = 0

    async def __call__(self, host: str, port: int, tls: bool) -> trio.abc.Stream:
        if trio.current_time() < self.until:
            self.refused += 1
            await trio.lowlevel.checkpoint()
            raise OSError(111, "Connection refused")
        stream: trio.abc.Stream = await self.opener(host, port, tls)
        return stream


async def test_connection_refused_for_3s_loses_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    platform = FakePlatform()
    networks: list[Refusing] = []

    def refusing(opener: Opener) -> Opener:
        networks.append(Refusing(opener))
        return networks[-1]

    async def handler(job: dict[str, Any]) -> Any:
        # The platform goes away as the job ends: its report is the first to find out.
        networks[0].until = trio.current_time() + 3.0
        return "made it"

    async with running(platform, handler, network=refusing):
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "COMPLETED")
    assert job.output == "made it"
    assert networks[0].refused >= 2
    [delivered] = done_requests(platform, job_id)
    assert delivered.time >= networks[0].until


async def test_a_job_done_that_never_answers_costs_one_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    platform = FakePlatform()
    timings = Timings(report_attempt_timeout=10.0)
    async with running(platform, timings=timings):
        platform.inject(Fault("done", delay=math.inf))
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "COMPLETED")
    hung, answered = done_requests(platform, job_id)
    assert hung.status is None  # never answered: the worker gave up on that connection
    assert answered.status == 200
    assert answered.time - hung.time >= 10.0
    assert job.output == {"echo": {}}


class Dripping(trio.abc.Stream):
    """A connection whose answers arrive one byte a second once it carried a job-done."""

    def __init__(self, inner: trio.abc.Stream, drip: list[bool]) -> None:
        self.inner = inner
        self.drip = drip
        self.dripping = False
        self.buffer = b""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if not self.dripping and self.drip and b"/job-done/" in bytes(data)[:200]:
            self.dripping = self.drip.pop()
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if not self.dripping:
            return bytes(await self.inner.receive_some(max_bytes))
        if not self.buffer:
            self.buffer = bytes(await self.inner.receive_some())
        await trio.sleep(1.0)
        byte, self.buffer = self.buffer[:1], self.buffer[1:]
        return byte

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_job_done_answer_dripping_a_byte_a_second_costs_one_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    platform = FakePlatform()
    drip = [True]  # the first job-done connection drips

    def dripping(opener: Opener) -> Opener:
        async def open_stream(host: str, port: int, tls: bool) -> trio.abc.Stream:
            return Dripping(await opener(host, port, tls), drip)

        return open_stream

    timings = Timings(report_attempt_timeout=10.0)
    async with running(platform, timings=timings, network=dripping):
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "COMPLETED")
    # The platform answered both (it recorded the result twice); the first answer was
    # still dripping in when its attempt's timeout cut it.
    first, second = done_requests(platform, job_id)
    assert second.time - first.time >= 10.0
    assert job.output == {"echo": {}}
    assert drip == []


class Throttled(trio.abc.Stream):
    """A link that carries what the worker sends at *rate* bytes per second."""

    def __init__(self, inner: trio.abc.Stream, rate: float) -> None:
        self.inner = inner
        self.rate = rate

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.sleep(len(data) / self.rate)
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return bytes(await self.inner.receive_some(max_bytes))

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_15_mb_result_over_a_1_5_mib_per_s_link_is_delivered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    platform = FakePlatform()
    size = 15 * 1000 * 1000

    def slow(opener: Opener) -> Opener:
        async def open_stream(host: str, port: int, tls: bool) -> trio.abc.Stream:
            return Throttled(await opener(host, port, tls), 1.5 * 1024 * 1024)

        return open_stream

    async def big(job: dict[str, Any]) -> Any:
        return "x" * size

    # 10 s would cut the 9.5 s transfer short on a busy link; the body's size adds 14 s.
    timings = Timings(report_attempt_timeout=5.0)
    async with running(platform, big, timings=timings, network=slow):
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "COMPLETED")
    assert job.output == "x" * size
    [delivered] = done_requests(platform, job_id)
    assert delivered.status == 200


@pytest.mark.parametrize(
    ("asked", "low", "high"),
    [
        (12.0, 12.0, 12.0 * 1.2),  # as asked, stretched by up to 20% jitter
        (120.0, 60.0, 60.0),  # the cap every route has (rate_limit_cap)
        (0.0, 1.0, 1.2),  # the floor (rate_limit_floor): no hot loop
    ],
)
async def test_retry_after_is_waited_then_the_result_delivered(
    asked: float, low: float, high: float, autojump_clock: trio.testing.MockClock
) -> None:
    platform = FakePlatform()
    async with running(platform):
        platform.inject(Fault("done", status=429, retry_after=asked))
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "COMPLETED")
    limited, delivered = done_requests(platform, job_id)
    assert limited.status == 429
    assert low - 1e-6 <= delivered.time - limited.time <= high + 1e-6
    assert job.output == {"echo": {}}


# -- the job stays held while its result waits ---------------------------------------------


@BOTH_BACKENDS
async def test_a_waiting_result_keeps_its_slot_and_its_place_in_every_ping(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    platform = FakePlatform(take_hold=1.0)
    async with running(platform, backend=backend, concurrency=1):
        start = trio.current_time()
        platform.inject(Fault("done", status=503, times=10**9, until=start + 30.0))
        first = platform.enqueue({"n": 1})
        second = platform.enqueue({"n": 2})
        await finished(platform, second, "COMPLETED")
    one, two = platform.job(first), platform.job(second)
    assert one.done_time is not None
    assert one.done_time >= start + 30.0
    # Capacity 1 stayed taken while the first result waited: the second came after.
    assert two.take_time is not None
    assert two.take_time >= one.done_time
    window = [p for p in platform.pings if start + 2.0 <= p.time <= start + 29.0]
    assert len(window) >= 20
    assert all(p.job_ids == (first,) for p in window)


@BOTH_BACKENDS
async def test_an_exhausted_budget_is_logged_with_the_job_id_and_frees_the_slot(
    backend: str, virtual_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    platform = FakePlatform(take_hold=1.0)
    timings = Timings(report_budget=30.0)
    async with running(platform, timings=timings, backend=backend, concurrency=1) as handle:
        start = trio.current_time()
        platform.inject(Fault("done", status=503, times=10**9, until=start + 45.0))
        lost = platform.enqueue({"n": 1})
        after = platform.enqueue({"n": 2})
        await finished(platform, after, "COMPLETED")
        assert lost not in handle.held_ids
    attempts = done_requests(platform, lost)
    assert attempts[-1].time - attempts[0].time <= 30.0
    assert platform.job(lost).status == "IN_PROGRESS"  # never learned: the loss is logged
    [line] = lost_lines(caplog)
    assert f"RESULT LOST for job {lost} after {len(attempts)} attempt(s)" in line
    assert "HTTP 503" in line


# -- progress updates never hold the final report up ---------------------------------------


@BOTH_BACKENDS
async def test_a_hung_progress_post_holds_the_result_at_most_progress_bound(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    platform = FakePlatform()
    ended: list[float] = []
    sleep, now = sleep_for(backend), clock_for(backend)

    async def handler(job: dict[str, Any]) -> Any:
        trio_worker.progress_update(job, "halfway")
        await sleep(0.5)
        ended.append(now())
        return "done"

    async with running(platform, handler, timings=Timings(progress_bound=2.0), backend=backend):
        platform.inject(Fault("done", delay=math.inf))  # the progress post hangs
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "COMPLETED")
    assert job.output == "done"
    assert job.done_time is not None
    assert job.done_time - ended[0] == pytest.approx(2.0, abs=0.01)
    assert job.late_progress == []


@BOTH_BACKENDS
async def test_progress_updates_one_at_a_time_the_newest_winning(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    platform = FakePlatform()
    sleep = sleep_for(backend)

    async def handler(job: dict[str, Any]) -> Any:
        for step in range(1, 6):
            trio_worker.progress_update(job, step)
            await sleep(0.1)
        await sleep(2.0)
        return "done"

    async with running(platform, handler, backend=backend):
        platform.inject(Fault("done", delay=1.0))  # the first update takes 1 s
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "COMPLETED")
    # 2, 3 and 4 were superseded while 1 was in flight; updates arrive in order.
    assert job.progress == [1, 5]
    assert job.late_progress == []


@BOTH_BACKENDS
async def test_updates_made_just_before_the_result_still_go_out_first(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    platform = FakePlatform()

    async def handler(job: dict[str, Any]) -> Any:
        trio_worker.progress_update(job, 1)
        trio_worker.progress_update(job, 2)
        return "done"

    async with running(platform, handler, backend=backend):
        platform.inject(Fault("done", delay=0.5))  # the first update is still in flight
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "COMPLETED")
    assert job.progress == [1, 2]
    assert job.late_progress == []


# -- results the platform refuses for good -------------------------------------------------


@pytest.mark.parametrize("status", [400, 413])
async def test_a_refused_result_is_answered_by_a_small_error_report(
    status: int, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="trio_worker")
    platform = FakePlatform()

    async def handler(job: dict[str, Any]) -> Any:
        return "y" * 100_000

    async with running(platform, handler):
        platform.inject(Fault("done", status=status))
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "FAILED")
    refused, notice = done_requests(platform, job_id)
    assert refused.status == status
    assert len(notice.body) < 4096
    assert isinstance(job.error, str)
    error = json.loads(job.error)
    assert error["error_type"] == "ResultRefused"
    assert f"HTTP {status}" in error["error_message"]
    assert str(len(refused.body)) in error["error_message"]
    assert any(f"RESULT REFUSED for job {job_id}" in r.getMessage() for r in caplog.records)
    assert lost_lines(caplog) == []


@BOTH_BACKENDS
async def test_a_refused_result_keeps_stop_pod(backend: str, virtual_clock: trio.abc.Clock) -> None:
    platform = FakePlatform()
    async with running(platform, backend=backend, refresh_worker=True):
        platform.inject(Fault("done", status=413))
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "FAILED")
    assert job.stop_pod
    assert isinstance(job.error, str)
    assert json.loads(job.error)["error_type"] == "ResultRefused"


# -- streams -------------------------------------------------------------------------------


def stream_of_four(backend: str) -> Callable[[dict[str, Any]], Any]:
    """Four chunks, each after a checkpoint of *backend*'s own."""
    sleep = sleep_for(backend)

    async def stream(job: dict[str, Any]) -> Any:
        for n in range(4):
            await sleep(0)
            yield n

    return stream


@BOTH_BACKENDS
@pytest.mark.parametrize("aggregate", [False, True])
async def test_a_chunk_refused_for_good_is_named_in_the_final_report(
    backend: str, aggregate: bool, virtual_clock: trio.abc.Clock
) -> None:
    platform = FakePlatform()
    async with running(
        platform, stream_of_four(backend), backend=backend, return_aggregate_stream=aggregate
    ):
        platform.inject(Fault("stream", status=400))
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "COMPLETED")
    assert job.stream == [1, 2, 3]
    [final] = job.done_reports
    assert final == {
        "output": [0, 1, 2, 3] if aggregate else [],
        "undelivered_chunk_count": 1,
        "undelivered_chunks": [0],
    }


@BOTH_BACKENDS
async def test_chunks_lost_to_an_outage_longer_than_the_budget_are_named(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    platform = FakePlatform()
    async with running(
        platform, stream_of_four(backend), timings=Timings(report_budget=20.0), backend=backend
    ):
        start = trio.current_time()
        platform.inject(Fault("stream", status=503, times=10**9, until=start + 60.0))
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "COMPLETED")
    # The stream's budget is spent once (20 s on chunk 0); each later chunk gets one
    # attempt's timeout (10 s), not a budget of its own.
    assert job.done_time is not None
    assert job.done_time - start < 20.0 + 3 * 10.0 + 5.0
    assert job.stream == []
    assert job.done_reports == [
        {"output": [], "undelivered_chunk_count": 4, "undelivered_chunks": [0, 1, 2, 3]}
    ]


@BOTH_BACKENDS
async def test_a_short_outage_loses_no_chunk(backend: str, virtual_clock: trio.abc.Clock) -> None:
    platform = FakePlatform()
    async with running(platform, stream_of_four(backend), backend=backend):
        start = trio.current_time()
        platform.inject(Fault("stream", status=503, times=10**9, until=start + 30.0))
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "COMPLETED")
    assert job.stream == [0, 1, 2, 3]
    assert job.done_reports == [{"output": []}]


# -- stopping ------------------------------------------------------------------------------


async def test_at_shutdown_a_pending_result_goes_on_until_the_grace_ends(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="trio_worker")
    platform = FakePlatform()
    platform.inject(Fault("done", status=503, times=10**9))
    timings = Timings(shutdown_grace=20.0, report_deadline=5.0)
    async with running(platform, echo, timings=timings) as handle:
        job_id = platform.enqueue({})
        with trio.fail_after(3600):
            await platform.wait_for_requests("done", 3)
        shutdown = trio.current_time()
        handle.shutdown("SIGTERM")
    ended = trio.current_time()
    attempts = done_requests(platform, job_id)
    assert attempts[-1].time <= shutdown + 20.0
    assert attempts[-1].time >= shutdown + 20.0 - 2.0 - 10.0  # retried on into the grace
    assert ended == pytest.approx(shutdown + 20.0, abs=0.01)
    [line] = lost_lines(caplog)
    assert f"RESULT LOST for job {job_id}" in line


async def test_cancelling_serve_cuts_a_pending_result_to_report_deadline(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="trio_worker")
    platform = FakePlatform()
    platform.inject(Fault("done", status=503, times=10**9))
    with trio.CancelScope() as scope:
        async with running(platform, echo, timings=Timings(report_deadline=5.0)):
            job_id = platform.enqueue({})
            with trio.fail_after(3600):
                await platform.wait_for_requests("done", 1)
            reported = done_requests(platform, job_id)[0].time
            await trio.sleep(1.0)
            cancelled = trio.current_time()
            scope.cancel()
    ended = trio.current_time()
    # Not the 300 s budget: at most report_deadline from the report's start.
    assert cancelled < ended <= reported + 5.0 + 0.01
    assert len(lost_lines(caplog)) == 1


async def test_a_retry_after_longer_than_the_grace_is_cut_to_one_last_attempt(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # Measured on the worker before the shutdown plan: the 30 s wait was slept through the
    # 20 s grace, with no last attempt, and RESULT LOST was logged.
    caplog.set_level(logging.ERROR, logger="trio_worker")
    platform = FakePlatform()
    platform.inject(Fault("done", status=503, retry_after=30.0))
    timings = Timings(shutdown_grace=20.0)
    async with running(platform, echo, timings=timings) as handle:
        job_id = platform.enqueue({})
        with trio.fail_after(3600):
            await platform.wait_for_requests("done", 1)
        await trio.sleep(1.0)
        shutdown = trio.current_time()
        handle.shutdown("SIGTERM")
    refused, delivered = done_requests(platform, job_id)
    assert refused.status == 503
    assert delivered.status == 200
    assert shutdown < delivered.time <= shutdown + 20.0
    assert platform.job(job_id).status == "COMPLETED"
    assert lost_lines(caplog) == []

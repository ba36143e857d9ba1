"""Stream chunks waiting behind a POST go out pipelined (docs/protocol.md §2.4), in virtual time,
those of several jobs together.

The whole worker runs over ``memory_network`` against the fake platform, whose h11 server
takes pipelined requests as any HTTP/1.1 server must. A wrapper around each connection
counts the requests every write carries, so a test sees whether chunks were pipelined, and
can play a server (or a proxy) that drops what follows the first request of a write.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from trio_worker import Timings
from trio_worker.testing import FakePlatform, Fault, JobRecord

from .backends import ASYNCIO_ONLY, BOTH_BACKENDS, sleep_for
from .test_delivery import Opener, finished, running

pytestmark = pytest.mark.timeout(60)

CHUNKS = 12


def burst(backend: str, count: int = CHUNKS) -> Callable[[dict[str, Any]], Any]:
    """Chunk 0, then, half a second later (while chunk 0's POST is held by
    :func:`slow_first_chunk`), the other *count* - 1 with no wait between them: they
    are all waiting when the sender comes back, whichever task the scheduler runs first."""
    sleep = sleep_for(backend)

    async def stream(job: dict[str, Any]) -> Any:
        yield 0
        await sleep(0.5)
        for n in range(1, count):
            yield n

    return stream


class Writes:
    """The network, counting the stream-chunk requests each write carries.

    With *forward_only_first*, a write holding several requests reaches the server cut
    after its first request: a server (or a proxy) that does not take pipelined requests
    and waits for more instead.
    """

    def __init__(self, *, forward_only_first: bool = False) -> None:
        self.per_write: list[int] = []
        self.jobs_per_write: list[list[str]] = []  # the job of each chunk, in order
        self.forward_only_first = forward_only_first
        self._written = trio.Event()

    def chunks_sent(self, job_id: str) -> int:
        return sum(write.count(job_id) for write in self.jobs_per_write)

    async def until(self, seen: Callable[[], bool]) -> None:
        """Wait until *seen* says yes, asking again after each write of stream chunks."""
        while not seen():
            await self._written.wait()

    def note(self, jobs: list[str]) -> None:
        self.per_write.append(len(jobs))
        self.jobs_per_write.append(jobs)
        self._written.set()
        self._written = trio.Event()

    def network(self, opener: Opener) -> Opener:
        async def open_stream(host: str, port: int, tls: bool) -> trio.abc.Stream:
            return _Counted(await opener(host, port, tls), self)

        return open_stream


class _Counted(trio.abc.Stream):
    def __init__(self, inner: trio.abc.Stream, writes: Writes) -> None:
        self._inner = inner
        self._writes = writes

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        data = bytes(data)
        jobs = [match.decode() for match in _STREAM_JOB.findall(data)]
        count = len(jobs)
        if count:
            self._writes.note(jobs)
        if count > 1 and self._writes.forward_only_first:
            data = data[: _first_request_end(data)]
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self._inner.receive_some(max_bytes)

    async def send_eof(self) -> None:  # pragma: no cover - the worker never half-closes
        raise NotImplementedError

    async def aclose(self) -> None:
        await self._inner.aclose()


_STREAM_JOB = re.compile(rb"/job-stream/[^/ ]+/([^/? ]+)")


def _first_request_end(data: bytes) -> int:
    head_end = data.index(b"\r\n\r\n") + 4
    length = next(
        int(line.split(b":", 1)[1])
        for line in data[:head_end].split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head_end + length


def slow_first_chunk() -> Fault:
    """The first chunk's answer takes a second, so the chunks behind it wait together."""
    return Fault("stream", delay=1.0)


async def one_streamed_job(
    platform: FakePlatform,
    handler: Callable[[dict[str, Any]], Any],
    backend: str,
    *faults: Fault,
    writes: Writes | None = None,
    **options: Any,
) -> JobRecord:
    """One job through a worker running *handler*, with *faults* armed in order on the
    platform before it is enqueued; the job once COMPLETED."""
    network = None if writes is None else writes.network
    async with running(platform, handler, backend=backend, network=network, **options):
        for fault in faults:
            platform.inject(fault)
        return await finished(platform, platform.enqueue({}), "COMPLETED")


@BOTH_BACKENDS
async def test_chunks_waiting_behind_a_post_go_out_together_in_order(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    writes = Writes()
    job = await one_streamed_job(
        FakePlatform(), burst(backend), backend, slow_first_chunk(), writes=writes
    )
    assert job.stream == list(range(CHUNKS))
    assert job.done_reports == [{"output": []}]
    # The first chunk alone, then the eleven that waited for it in one write.
    assert writes.per_write == [1, CHUNKS - 1]


@BOTH_BACKENDS
async def test_a_chunk_refused_for_now_in_a_batch_is_sent_again_after_it(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    writes = Writes()
    job = await one_streamed_job(
        FakePlatform(),
        burst(backend),
        backend,
        slow_first_chunk(),
        Fault("stream", status=503),  # chunk 1, the batch's first
        writes=writes,
    )
    # The platform took chunks 2-11 from the wire before chunk 1 could go again: reordered,
    # not lost, and not sent twice.
    assert job.stream == [0, *range(2, CHUNKS), 1]
    assert job.done_reports == [{"output": []}]
    assert writes.per_write == [1, CHUNKS - 1, 1]


@BOTH_BACKENDS
@pytest.mark.parametrize(
    ("asked", "low", "high"),
    [
        (3.0, 3.0, 3.0 * 1.2),  # as asked, up to 20% longer (rate_limit_wait's jitter)
        (0.0, 1.0, 1.2),  # the floor every route has: no hot loop
        (120.0, 60.0, 60.0),  # the cap every route has
    ],
)
async def test_a_chunk_refused_with_retry_after_in_a_batch_waits_as_asked(
    asked: float, low: float, high: float, backend: str, virtual_clock: trio.abc.Clock
) -> None:
    # Before the one rule, a batch's Retry-After had neither floor nor cap: 0 s sent the
    # chunk again at once, 120 s waited 120 s.
    platform = FakePlatform()
    job = await one_streamed_job(
        platform,
        burst(backend, 4),
        backend,
        slow_first_chunk(),
        Fault("stream", status=429, retry_after=asked),  # chunk 1
    )
    assert job.stream == [0, 2, 3, 1]
    times = [r.time for r in platform.requests if r.route == "stream"]
    # 0 at 0, the batch 1-3 when 0 was answered (1 s), 1 again after its 429, paced as a
    # report's Retry-After is.
    assert len(times) == 5
    assert low - 0.01 <= times[4] - times[1] <= high + 0.01


@BOTH_BACKENDS
async def test_after_trouble_the_next_batch_goes_one_chunk_at_a_time(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    platform = FakePlatform()
    writes = Writes()
    sleep = sleep_for(backend)

    async def three_bursts(job: dict[str, Any]) -> Any:
        yield 0
        await sleep(0.5)
        for n in range(1, 4):
            yield n
        await sleep(1.0)  # while chunk 1 goes again, slowly
        for n in range(4, 8):
            yield n
        await sleep(5.0)  # everything settled
        yield 8
        await sleep(0.5)
        for n in range(9, 12):
            yield n

    job = await one_streamed_job(
        platform,
        three_bursts,
        backend,
        slow_first_chunk(),  # 0
        Fault("stream", status=503),  # 1, first of the batch 1-3
        Fault("stream", times=2),  # 2, 3
        Fault("stream", delay=1.0),  # 1 again: 4-7 wait behind it
        Fault("stream", times=4),  # 4-7, one at a time
        Fault("stream", delay=1.0),  # 8: 9-11 wait behind it
        writes=writes,
    )
    assert job.stream == [0, 2, 3, 1, *range(4, 12)]
    # The batch after the troubled one went one chunk at a time; once it was all
    # delivered, the next batch was pipelined again.
    assert writes.per_write == [1, 3, 1, 1, 1, 1, 1, 1, 3]


@BOTH_BACKENDS
@pytest.mark.parametrize("aggregate", [False, True])
async def test_a_chunk_refused_for_good_in_a_batch_is_named(
    backend: str, aggregate: bool, virtual_clock: trio.abc.Clock
) -> None:
    job = await one_streamed_job(
        FakePlatform(),
        burst(backend, 4),
        backend,
        slow_first_chunk(),
        Fault("stream"),  # chunk 1 answered normally, after no delay
        Fault("stream", status=400),  # chunk 2, in the middle of the batch
        return_aggregate_stream=aggregate,
    )
    assert job.stream == [0, 1, 3]
    assert job.done_reports == [
        {
            "output": [0, 1, 2, 3] if aggregate else [],
            "undelivered_chunk_count": 1,
            "undelivered_chunks": [2],
        }
    ]


@BOTH_BACKENDS
async def test_chunks_behind_a_dropped_connection_are_sent_again_in_order(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    job = await one_streamed_job(
        FakePlatform(),
        burst(backend),
        backend,
        slow_first_chunk(),
        Fault("stream"),
        # Chunk 2: closed before it is recorded; chunks 3-11 were on the wire behind it,
        # unanswered: sent again one at a time.
        Fault("stream", drop=True),
    )
    assert job.stream == list(range(CHUNKS))
    assert job.done_reports == [{"output": []}]


@BOTH_BACKENDS
async def test_a_server_that_ignores_pipelined_requests_turns_pipelining_off(
    backend: str, virtual_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    platform = FakePlatform()
    writes = Writes(forward_only_first=True)
    timings = Timings(report_attempt_timeout=5.0)
    caplog.set_level(logging.WARNING, "trio_worker")
    async with running(
        platform, burst(backend), backend=backend, timings=timings, network=writes.network
    ):
        platform.inject(slow_first_chunk())
        first = await finished(platform, platform.enqueue({}), "COMPLETED")
        second = await finished(platform, platform.enqueue({}), "COMPLETED")
    assert first.stream == list(range(CHUNKS))
    assert second.stream == list(range(CHUNKS))
    [warning] = [r.getMessage() for r in caplog.records if "pipelined" in r.getMessage()]
    assert "answered 1 of 11 pipelined stream chunks" in warning
    # The one batch that was cut, then every request on its own, the second job's too.
    assert writes.per_write == [1, CHUNKS - 1, *[1] * (CHUNKS - 2), *[1] * CHUNKS]
    assert len([r for r in platform.requests if r.route == "stream"]) == 2 * CHUNKS


# -- the chunks of several streams share a write ---------------------------------------------


@BOTH_BACKENDS
async def test_chunks_of_several_streams_waiting_together_share_one_write(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    platform = FakePlatform()
    writes = Writes()
    sleep = sleep_for(backend)

    async def stream(job: dict[str, Any]) -> Any:
        await sleep(0.1)  # every job has started: their first chunks come together
        yield 0
        await sleep(0.5)
        for n in range(1, CHUNKS):
            yield n

    async with running(platform, stream, backend=backend, network=writes.network, concurrency=4):
        platform.inject(slow_first_chunk())
        ids = [platform.enqueue({}) for _ in range(4)]
        jobs = [await finished(platform, job_id, "COMPLETED") for job_id in ids]
    for job in jobs:
        assert job.stream == list(range(CHUNKS))
    # One write carried the first chunk of every job; then, the bursts that waited behind
    # its slow answer went out together too: fewer writes than streams, each chunk once.
    assert sorted(writes.jobs_per_write[0]) == ids
    assert len(writes.jobs_per_write) < 1 + 4
    assert [writes.chunks_sent(job_id) for job_id in ids] == [CHUNKS] * 4


@BOTH_BACKENDS
async def test_chunks_of_streams_a_moment_apart_wait_for_each_other_and_share_one_write(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    """A round waits up to ``round_linger`` (1 ms on trio, 3 ms on asyncio) for the other
    open streams' chunks: chunks a fraction of that apart go out in one write, not one
    each."""
    platform = FakePlatform()
    writes = Writes()
    sleep = sleep_for(backend)

    async def stream(job: dict[str, Any]) -> Any:
        await sleep(0.1 + 0.0003 * job["input"]["n"])  # both open; chunks 0.3 ms apart
        yield job["input"]["n"]

    async with running(platform, stream, backend=backend, network=writes.network, concurrency=3):
        ids = [platform.enqueue({"n": n}) for n in range(3)]
        jobs = [await finished(platform, job_id, "COMPLETED") for job_id in ids]
    assert [job.stream for job in jobs] == [[0], [1], [2]]
    assert sorted(writes.jobs_per_write[0]) == sorted(ids)
    assert writes.per_write == [3]


@BOTH_BACKENDS
@pytest.mark.parametrize("stopped_job", [0, 1])
async def test_a_job_stopped_while_its_chunks_share_a_write_cuts_no_other_stream_short(
    backend: str, stopped_job: int, virtual_clock: trio.abc.Clock
) -> None:
    platform = FakePlatform()
    writes = Writes()
    sleep = sleep_for(backend)
    stopped: list[str] = []

    async def stream(job: dict[str, Any]) -> Any:
        yield 0
        await sleep(0.5)
        for n in range(1, CHUNKS):
            yield n
        if job["input"].get("linger"):
            try:
                await sleep(3600)
            finally:
                stopped.append(job["id"])

    async with running(platform, stream, backend=backend, network=writes.network, concurrency=2):
        # Either job's chunks may be the first of the shared write: each is stopped.
        ids = [platform.enqueue({"linger": n == stopped_job}) for n in range(2)]
        lingering, other = ids[stopped_job], ids[1 - stopped_job]
        with trio.fail_after(60):
            await writes.until(lambda: all(writes.chunks_sent(job_id) for job_id in ids))
            # The next write (the bursts of both) is answered after 5 s.
            platform.inject(Fault("stream", delay=5.0))
            before = len(writes.jobs_per_write)
            await writes.until(lambda: len(writes.jobs_per_write) > before)
            assert set(writes.jobs_per_write[before]) == {lingering, other}
            platform.request_stop(lingering)
            await trio.sleep(1.0)
            assert stopped == [lingering]  # while the write it shares is held
        job = await finished(platform, other, "COMPLETED")
    assert job.stream == list(range(CHUNKS))
    assert job.done_reports == [{"output": []}]
    # Nothing of the other stream was sent twice: the stopped job's task did not own the
    # write it shared.
    assert writes.chunks_sent(other) == CHUNKS


class JobTaskSteps(trio.abc.Instrument):
    """How many times the worker's job tasks ran (trio instrument)."""

    def __init__(self) -> None:
        self.count = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith(".job_task"):
            self.count += 1


@ASYNCIO_ONLY
async def test_on_asyncio_paced_chunks_reach_their_round_without_waking_the_jobs_task(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    """A chunk yielded while the job's trio task waits for one, with none buffered, is
    queued for the convoy by the asyncio pump itself: a token every few milliseconds wakes
    no trio task of its own. 90 more tokens add no step per token to the job's task (it
    ran 18 times for 10 tokens and 109 for 100; now about 10 for either, give or take the
    few steps a take or a report's answer may need on a busy machine)."""
    platform = FakePlatform()
    steps = JobTaskSteps()

    async def stream(job: dict[str, Any]) -> Any:
        for n in range(job["input"]["tokens"]):
            await asyncio.sleep(0.005)
            yield {"n": n}

    runs: list[int] = []
    trio.lowlevel.add_instrument(steps)
    try:
        async with running(platform, stream, backend=backend):
            for tokens in (10, 100):
                before = steps.count
                job = await finished(platform, platform.enqueue({"tokens": tokens}), "COMPLETED")
                assert job.stream == [{"n": n} for n in range(tokens)]
                runs.append(steps.count - before)
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert 0 < runs[1] < runs[0] + 20, runs


class Booby(dict[str, Any]):
    """A chunk whose every look raises, as a hostile or broken object would."""

    def get(self, *args: Any) -> Any:
        raise RuntimeError("a chunk that cannot be read")


@BOTH_BACKENDS
@pytest.mark.parametrize(
    "ending", ["error chunk", "not JSON", "generator error", "unreadable chunk", "none"]
)
async def test_chunks_paced_then_in_bursts_then_paced_keep_their_order_to_the_end(
    backend: str, ending: str, virtual_clock: trio.abc.Clock
) -> None:
    """On asyncio the pump hands a chunk over itself while the stream is calm, and the
    job's task reads it otherwise (the stream in trouble, its backlog full, an error
    chunk): every switch between the two keeps every chunk, in order, in the stream and
    in the aggregate, and how the stream ends comes after its last chunk."""
    platform = FakePlatform()
    sleep = sleep_for(backend)
    expected = list(range(30))

    async def stream(job: dict[str, Any]) -> Any:
        for n in expected:
            if n == 12:  # the platform turns the next two chunks away: the stream's own
                platform.inject(Fault("stream", status=503, times=2))  # task retries them
            if n % 10 < 5:
                await sleep(0.005)  # paced
            yield n  # the rest of each ten comes in a burst
        if ending == "error chunk":
            yield {"error": "the engine gave up"}
        elif ending == "not JSON":
            yield {"bad": {1, 2}}
        elif ending == "generator error":
            raise RuntimeError("the engine gave up")
        elif ending == "unreadable chunk":
            yield Booby()
        yield "never sent"

    async with running(platform, stream, backend=backend, return_aggregate_stream=True):
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "FAILED" if ending != "none" else "COMPLETED")
    assert job.stream == expected + (["never sent"] if ending == "none" else [])
    if ending == "none":
        assert job.done_reports == [{"output": [*expected, "never sent"]}]
    else:
        (report,) = job.done_reports
        assert isinstance(report, dict)
        assert "error" in report
        if ending == "unreadable chunk":
            assert "a chunk that cannot be read" in report["error"]

"""Which answer of a shared pipelined round belongs to which stream (docs/protocol.md §2.4).

The chunks of several streams waiting at once go out in one write and their answers come
back in the same order (``trio_worker/_chunk_convoy.py``). A platform that answers 200 to
every chunk cannot tell a round whose answers were handed to the wrong streams from a
correct one: here the fake platform answers each chunk of each stream as a plan says (a
503 to one chunk of one stream, a 400 to another stream's chunk, 200 to every other), so
a misaligned round retries or names the wrong chunk, stores one twice or loses one.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pytest
import trio

from trio_worker import Timings
from trio_worker.testing import FakePlatform, Fault

from .backends import BOTH_BACKENDS, sleep_for
from .test_delivery import finished, running, stream_of_four

if TYPE_CHECKING:
    from trio_worker._endpoint._routes import Request, Response

CHUNKS = 6
STREAMS = ("A", "B", "C")


class PerChunkAnswers(FakePlatform):
    """The fake platform, answering a planned fault to the first post of one chunk of one
    stream (keyed by job id and chunk), and as usual to every other request."""

    def __init__(self, plan: dict[tuple[str, Any], Fault]) -> None:
        super().__init__()
        self.plan = dict(plan)

    async def _answer(self, request: Request, fault: Fault | None) -> Response:
        if request.route == "stream" and fault is None:
            job_id = unquote(request.record.path.rstrip("/").rsplit("/", 1)[-1])
            chunk = json.loads(request.body)["output"]
            fault = self.plan.pop((job_id, chunk), None)
        return await super()._answer(request, fault)


def stream_posts(platform: FakePlatform) -> list[tuple[float, str, Any, int | None]]:
    """Every stream-chunk post: (arrival, job id, chunk, status answered)."""
    return [
        (r.time, r.path.rsplit("/", 1)[-1], json.loads(r.body)["output"], r.status)
        for r in platform.requests
        if r.route == "stream"
    ]


@BOTH_BACKENDS
async def test_each_answer_of_a_shared_round_goes_to_its_own_stream_and_chunk(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    sleep = sleep_for(backend)

    async def stream(job: dict[str, Any]) -> Any:
        await sleep(0.1)  # every job has started: their first chunks share a round
        yield 0
        await sleep(0.5)  # while that round's answers are held back
        for n in range(1, CHUNKS):
            yield n

    platform = PerChunkAnswers(
        {
            # B's first chunk is answered after a second: the bursts of all three streams
            # wait behind the first round and then share the next one.
            ("B", 0): Fault("stream", delay=1.0),
            ("A", 1): Fault("stream", status=503),  # refused for now: A sends it again
            ("C", 3): Fault("stream", status=400),  # refused for good: C names it
        }
    )
    async with running(platform, stream, backend=backend, concurrency=len(STREAMS)):
        for job_id in STREAMS:
            platform.enqueue({}, job_id=job_id)
        a, b, c = [await finished(platform, job_id, "COMPLETED") for job_id in STREAMS]
    assert platform.plan == {}, "a planned answer was never given"

    posts = stream_posts(platform)
    # The test means something only if the planned chunks shared one round with the other
    # streams' chunks: one write, so one arrival instant on the platform.
    shared = [p for p in posts if p[0] == next(p[0] for p in posts if p[1:3] == ("A", 1))]
    assert {job_id for _, job_id, _, _ in shared} == set(STREAMS)
    assert ("C", 3) in {(job_id, chunk) for _, job_id, chunk, _ in shared}

    # Every chunk stored exactly once, in order (the refused-for-now one after the chunks
    # that were on the wire behind it), in its own stream; the one refused for good named.
    assert a.stream == [0, *range(2, CHUNKS), 1]
    assert b.stream == list(range(CHUNKS))
    assert c.stream == [n for n in range(CHUNKS) if n != 3]
    assert a.done_reports == [{"output": []}]
    assert b.done_reports == [{"output": []}]
    assert c.done_reports == [
        {"output": [], "undelivered_chunk_count": 1, "undelivered_chunks": [3]}
    ]
    # Only A's chunk 1 was sent again, and it was answered 503 then 200.
    sent = Counter((job_id, chunk) for _, job_id, chunk, _ in posts)
    assert {key: n for key, n in sent.items() if n > 1} == {("A", 1): 2}
    assert [status for _, job_id, chunk, status in posts if (job_id, chunk) == ("A", 1)] == [
        503,
        200,
    ]


class SpawnedTasks(trio.abc.Instrument):
    """The name of every task started while it is installed."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name)


@BOTH_BACKENDS
@pytest.mark.parametrize("trouble", [False, True])
async def test_a_calm_stream_posts_its_chunks_with_no_task_of_its_own(
    backend: str, virtual_clock: trio.abc.Clock, trouble: bool
) -> None:
    # docs/protocol.md §2.4, "No task switch per chunk": while the platform takes every
    # chunk, the rounds' task carries the stream on; only trouble starts a task of the
    # stream's own (here a 503 to chunk 2), which then does the retrying.
    sleep = sleep_for(backend)

    async def stream(job: dict[str, Any]) -> Any:
        for n in range(CHUNKS):
            await sleep(0.1)
            yield n

    plan = {("A", 2): Fault("stream", status=503)} if trouble else {}
    platform = PerChunkAnswers(plan)
    spawned = SpawnedTasks()
    async with running(platform, stream, backend=backend):
        trio.lowlevel.add_instrument(spawned)
        platform.enqueue({}, job_id="A")
        job = await finished(platform, "A", "COMPLETED")
        trio.lowlevel.remove_instrument(spawned)
    assert platform.plan == {}
    assert job.stream == list(range(CHUNKS))
    own = [name for name in spawned.names if name.startswith("trio_worker._chunk_posts.")]
    assert bool(own) == trouble, own


@BOTH_BACKENDS
async def test_a_stream_whose_budget_is_spent_gives_each_later_chunk_one_attempt(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    """The stream's budget (20 s) runs out on chunk 0 in an outage; each chunk after it
    still gets one attempt's time (10 s), so the platform, back at 25 s, gets chunk 1,
    and with it a sign of life: the chunks after it have a budget again."""
    platform = FakePlatform()
    async with running(
        platform, stream_of_four(backend), timings=Timings(report_budget=20.0), backend=backend
    ):
        start = trio.current_time()
        platform.inject(Fault("stream", status=503, times=10**9, until=start + 25.0))
        job = await finished(platform, platform.enqueue({}), "COMPLETED")
    assert job.stream == [1, 2, 3]
    assert job.done_reports == [
        {"output": [], "undelivered_chunk_count": 1, "undelivered_chunks": [0]}
    ]

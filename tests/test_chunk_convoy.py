"""The convoy of stream chunks (trio_worker/_chunk_convoy.py) with an in-memory post.

The worker-level behaviour (writes shared by several jobs, a stop that cuts no other
stream short) is in test_stream_pipelining.py; here are the edges a worker rarely reaches:
the size of a round, a seat given up before it boards, a round that raises, the task
running the rounds cancelled, no place to run them. Each sender here is a stream of one
batch, as a ChunkPoster's seat: it boards, waits for its verdicts, and closes.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from trio_worker._chunk_convoy import ChunkConvoy
from trio_worker._chunk_posts import BATCH_BYTES, BATCH_REQUESTS, Seat, take_batch
from trio_worker._platform._http import HttpResponse

OK = HttpResponse(200, {}, b"")


class Post:
    """A pipelined post: records each round, answers every request after *hold* seconds,
    or raises *error*."""

    def __init__(self, *, hold: float = 1.0, error: Exception | None = None) -> None:
        self.rounds: list[list[tuple[str, bytes]]] = []
        self.hold = hold
        self.error = error

    async def __call__(self, requests: list[tuple[str, bytes]]) -> list[HttpResponse]:
        self.rounds.append(requests)
        await trio.sleep(self.hold)
        if self.error is not None:
            raise self.error
        return [OK] * len(requests)


def beside(nursery: trio.Nursery) -> Callable[[Callable[[], Awaitable[None]]], bool]:
    def spawn(task: Callable[[], Awaitable[None]]) -> bool:
        nursery.start_soon(task)
        return True

    return spawn


def bodies(count: int) -> list[bytes]:
    return [b"%d" % n for n in range(count)]


class Rider:
    """One stream on the convoy, as a ChunkPoster's seat: it boards a batch at a time and
    waits for its verdicts. Cancelled while it waits, its stream closes (its seat is
    abandoned)."""

    def __init__(self, convoy: ChunkConvoy, job: str) -> None:
        self.convoy = convoy
        self._answered = trio.Event()
        self.seat = convoy.open_stream(job, lambda seat: self._answered.set())

    async def send(self, batch: list[bytes]) -> list[bool | None] | None:
        """The batch's verdicts, or None when there was no round to join."""
        self._answered = trio.Event()
        if not self.convoy.board(self.seat, batch):
            return None
        try:
            await self._answered.wait()
        except BaseException:
            self.close()
            raise
        return self.seat.verdicts

    def close(self) -> None:
        if not self.seat.abandoned:
            self.convoy.close_stream(self.seat)


async def send(convoy: ChunkConvoy, job: str, batch: list[bytes]) -> list[bool | None] | None:
    """A stream of one batch: its verdicts (None: no round to join)."""
    rider = Rider(convoy, job)
    try:
        return await rider.send(batch)
    finally:
        rider.close()


def jobs_of(round_: list[tuple[str, bytes]]) -> list[str]:
    return [url for url, _ in round_]


async def test_batches_arriving_during_a_round_go_together_in_the_next(
    autojump_clock: trio.testing.MockClock,
) -> None:
    post = Post()
    answered: dict[str, list[bool | None] | None] = {}
    async with trio.open_nursery() as nursery:
        convoy = ChunkConvoy(post, beside(nursery))

        async def stream(job: str, count: int, after: float) -> None:
            await trio.sleep(after)
            answered[job] = await send(convoy, job, bodies(count))

        nursery.start_soon(stream, "a", 2, 0.0)
        nursery.start_soon(stream, "b", 1, 0.0)
        nursery.start_soon(stream, "c", 3, 0.5)  # while a and b are on the wire
        nursery.start_soon(stream, "d", 1, 0.7)
    assert [len(r) for r in post.rounds] == [3, 4]
    assert set(jobs_of(post.rounds[1])) == {"c", "d"}
    assert answered == {"a": [True] * 2, "b": [True], "c": [True] * 3, "d": [True]}


async def test_a_round_stops_boarding_at_its_size_but_always_takes_one_batch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    post = Post()
    async with trio.open_nursery() as nursery:
        convoy = ChunkConvoy(post, beside(nursery))
        nursery.start_soon(send, convoy, "first", bodies(1))
        # In this order, while the first round is on the wire:
        for job, count in (("big", BATCH_REQUESTS + 10), ("x", 100), ("y", 100), ("z", 100)):
            await trio.sleep(0.1)
            nursery.start_soon(send, convoy, job, bodies(count))
    # The oversized batch alone; then x and y fill a round, z waits for the next.
    assert [len(r) for r in post.rounds] == [1, BATCH_REQUESTS + 10, 200, 100]


async def test_a_batch_given_up_before_it_boards_is_never_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    post = Post()
    async with trio.open_nursery() as nursery:
        convoy = ChunkConvoy(post, beside(nursery))
        nursery.start_soon(send, convoy, "a", bodies(1))
        await trio.sleep(0.1)  # a's round is on the wire
        with trio.move_on_after(0.2):
            await send(convoy, "gone", bodies(1))
        assert await send(convoy, "b", bodies(1)) == [True]
    assert [jobs_of(r) for r in post.rounds] == [["a"], ["b"]]


async def test_a_round_that_raises_answers_nothing_and_is_logged(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    post = Post(error=RuntimeError("boom"))
    caplog.set_level(logging.ERROR, "trio_worker")
    answers: list[list[bool | None] | None] = []
    async with trio.open_nursery() as nursery:
        convoy = ChunkConvoy(post, beside(nursery))

        async def stream(job: str) -> None:
            answers.append(await send(convoy, job, bodies(2)))

        nursery.start_soon(stream, "a")
        nursery.start_soon(stream, "b")
    # Nothing answered: each stream sends its chunks again on its own.
    assert answers == [[None, None], [None, None]]
    [record] = caplog.records
    assert record.getMessage() == "a round of 4 pipelined stream chunks failed"
    assert record.exc_info is not None


async def test_when_the_rounds_task_is_cancelled_no_sender_is_left_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    post = Post(hold=3600)
    answers: list[list[bool | None] | None] = []
    async with trio.open_nursery() as senders:
        async with trio.open_nursery() as rounds:
            convoy = ChunkConvoy(post, beside(rounds))

            async def stream(job: str) -> None:
                answers.append(await send(convoy, job, bodies(1)))

            senders.start_soon(stream, "a")
            await trio.sleep(1)
            senders.start_soon(stream, "b")  # waiting for the next round
            await trio.sleep(1)
            rounds.cancel_scope.cancel()
    assert answers == [[None], [None]]
    assert len(post.rounds) == 1


class TimedPost(Post):
    """A Post that also notes when each round left."""

    def __init__(self) -> None:
        super().__init__()
        self.left: list[float] = []

    async def __call__(self, requests: list[tuple[str, bytes]]) -> list[HttpResponse]:
        self.left.append(trio.current_time())
        return await super().__call__(requests)


def idle_streams(convoy: ChunkConvoy, count: int) -> list[Seat]:
    """*count* open streams with nothing boarded (yet)."""
    return [convoy.open_stream(f"idle {n}", lambda seat: None) for n in range(count)]


async def test_a_lingering_round_leaves_once_every_open_stream_has_boarded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A round waits for the other open streams' chunks, up to the linger, and no longer
    than until every open stream has a batch waiting."""
    post = TimedPost()
    async with trio.open_nursery() as nursery:
        convoy = ChunkConvoy(post, beside(nursery), linger=0.001)
        riders = [Rider(convoy, job) for job in "abc"]

        async def stream(rider: Rider, after: float) -> None:
            await trio.sleep(after)
            await rider.send(bodies(1))

        async def newcomer() -> None:
            await trio.sleep(0.5)
            await send(convoy, "d", bodies(1))  # a new stream, while a, b and c idle

        async with trio.open_nursery() as senders:
            senders.start_soon(stream, riders[0], 0.0)
            senders.start_soon(stream, riders[1], 0.0003)
            senders.start_soon(stream, riders[2], 0.0006)  # the last open stream: it leaves
            senders.start_soon(newcomer)
        for rider in riders:
            rider.close()  # the rounds' task stays while a stream is open
    assert [len(r) for r in post.rounds] == [3, 1]
    assert post.left[0] == pytest.approx(0.0006)


async def test_a_lingering_round_leaves_after_the_linger_without_the_slow_streams(
    autojump_clock: trio.testing.MockClock,
) -> None:
    post = TimedPost()
    async with trio.open_nursery() as nursery:
        convoy = ChunkConvoy(post, beside(nursery), linger=0.001)
        idle = idle_streams(convoy, 62)
        async with trio.open_nursery() as senders:
            senders.start_soon(send, convoy, "a", bodies(1))
            senders.start_soon(send, convoy, "b", bodies(2))
        for seat in idle:
            convoy.close_stream(seat)  # the rounds' task stays while a stream is open
    assert [len(r) for r in post.rounds] == [3]
    assert post.left == [pytest.approx(0.001)]


async def test_a_lone_stream_does_not_linger(autojump_clock: trio.testing.MockClock) -> None:
    """A stream boards one batch at a time: waiting for more of its own gains nothing."""
    post = TimedPost()
    async with trio.open_nursery() as nursery:
        convoy = ChunkConvoy(post, beside(nursery), linger=0.001)
        [other] = idle_streams(convoy, 1)
        convoy.close_stream(other)  # one of the two ended: the other is alone
        await send(convoy, "a", bodies(2))
    assert post.left == [0.0]


async def test_the_rounds_task_stays_while_a_stream_is_open_and_ends_with_the_last(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Rounds seconds apart are run by one task while a stream is open (a chunk then
    finds it running, and a round starts no task), and it ends when the last stream
    closes, so the jobs' nursery is not held open."""
    post = Post()
    spawned: list[object] = []
    async with trio.open_nursery() as nursery:
        spawn_beside = beside(nursery)

        def counted(task: Callable[[], Awaitable[None]]) -> bool:
            spawned.append(task)
            return spawn_beside(task)

        convoy = ChunkConvoy(post, counted, linger=0.001)
        [kept] = idle_streams(convoy, 1)
        for job in ("a", "b", "c"):
            await send(convoy, job, bodies(1))
            await trio.sleep(5)
        assert len(spawned) == 1
        assert "driving=True" in repr(convoy)
        convoy.close_stream(kept)
    assert len(post.rounds) == 3
    assert "driving=False" in repr(convoy)


@pytest.mark.parametrize("place", ["none", "closed"])
async def test_with_no_place_for_rounds_a_stream_is_told_to_send_on_its_own(
    place: str, autojump_clock: trio.testing.MockClock
) -> None:
    post = Post()
    spawn = None if place == "none" else (lambda task: False)
    convoy = ChunkConvoy(post, spawn)
    assert not convoy.boards_now()
    assert await send(convoy, "a", bodies(2)) is None
    assert post.rounds == []
    assert "streams=0" in repr(convoy)


async def test_a_round_nobody_waits_for_any_more_ends_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    post = Post(hold=3600)
    async with trio.open_nursery() as nursery:
        convoy = ChunkConvoy(post, beside(nursery))

        async def give_up(job: str, after: float) -> None:
            with trio.move_on_after(after):
                await send(convoy, job, bodies(1))

        nursery.start_soon(give_up, "a", 1.0)
        nursery.start_soon(give_up, "b", 2.0)
    # The round went on while b still waited, and ended when b gave up too (a shutdown
    # past its grace is not held up by chunks nobody waits for).
    assert trio.current_time() == pytest.approx(2.0)
    assert len(post.rounds) == 1


async def test_a_round_goes_on_for_those_still_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    post = Post(hold=3.0)
    answered: list[list[bool | None] | None] = []
    async with trio.open_nursery() as nursery:
        convoy = ChunkConvoy(post, beside(nursery))

        async def stream(job: str, give_up_after: float) -> None:
            with trio.move_on_after(give_up_after):
                answered.append(await send(convoy, job, bodies(2)))

        nursery.start_soon(stream, "stopped", 1.0)
        nursery.start_soon(stream, "kept", 60.0)
    assert answered == [[True, True]]
    assert trio.current_time() == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("sizes", "taken"),
    [
        # Count-bound: the limit's count of small chunks, the rest for the next batch.
        ([10] * (BATCH_REQUESTS + 5), BATCH_REQUESTS),
        # Byte-bound: chunks are taken while the batch is under BATCH_BYTES; the last
        # one taken passes it by its own size, and a round then boards that batch alone.
        ([BATCH_BYTES // 2 + 1] * 4, 2),
        ([BATCH_BYTES // 4] * 6, 4),
        # One chunk over the limit still goes, alone.
        ([BATCH_BYTES * 2, 1], 1),
    ],
)
async def test_a_streams_batch_and_a_round_share_one_limit(sizes: list[int], taken: int) -> None:
    pending = deque(b"x" * size for size in sizes)
    batch = take_batch(pending)
    assert len(pending) == len(sizes) - taken
    assert len(batch) == taken
    assert sum(map(len, batch)) < BATCH_BYTES + max(sizes)
    # A round holds that batch whole; another stream's chunk, which would take it past the
    # limit, waits for a round of its own.
    post = Post(hold=0.0)
    async with trio.open_nursery() as nursery:
        convoy = ChunkConvoy(post, beside(nursery))
        nursery.start_soon(send, convoy, "a", batch)
        nursery.start_soon(send, convoy, "b", [b"y" * 10])
    assert sorted(len(r) for r in post.rounds) == sorted([1, taken])

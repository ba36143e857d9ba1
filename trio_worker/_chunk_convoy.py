"""The per-worker stream poster: the chunks of every job, posted together, one write a round.

Every streaming job's :class:`~trio_worker._chunk_posts.ChunkPoster` hands its waiting
chunks to the one :class:`ChunkConvoy` of the worker (the runner's ``chunks``), which posts
them to the job-stream route (docs/protocol.md §2.4): boarded with a callback the convoy's
task calls with their answers (:meth:`ChunkConvoy.board`, no task of the stream's own while
the platform takes every chunk), or awaited (:meth:`ChunkConvoy.send`).

Posting each stream's chunks on its own connection costs one write, one wake-up and one
read per chunk: 64 streams of 50 tokens a second are 3,200 request rounds a second, and on
a 2-core machine the worker's CPU, not the network, then sets how late a token reaches the
platform (docs/benchmarks.md, "64 paced streams"). Here the batches of every stream that
are waiting when a round starts go out in one write on one kept-alive connection, their
answers read back in order; batches that arrive while a round is on the wire wait for the
next one, so the busier the worker, the more each round carries.

One limit (:data:`BATCH_REQUESTS`, :data:`BATCH_BYTES`) bounds both a stream's batch and a
round of every stream's batches: the bodies a round holds are at most the limit plus one
chunk (a batch takes chunks while it has room, a round boards whole batches while they
fit, and its first whatever its size); the platform client bounds each answer.

A round runs in a task of its own beside the jobs (:data:`Spawn`), not in the task of
the stream that started it: a job cancelled while its chunks share a round with other
jobs' chunks abandons only its own wait, and cuts nobody else's round short (which would
make them send again chunks the platform may already have). A round nobody waits for any
more is cancelled at once, so it never holds the jobs' nursery open past a shutdown.
Where no such place exists (tests with no supervisor), each stream posts its own batch.

What each stream makes of its answers (order, retries, budget) is
:class:`~trio_worker._chunk_posts.ChunkPoster`'s business: a round is one attempt at each
chunk in it, and a chunk it did not get an answer for is that stream's to send again, on its
own, with the delivery's retry policy (:meth:`~trio_worker._delivery.Delivery.post`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

import trio

from ._platform._client import ReportOutcome, asked_pause, is_retryable

if TYPE_CHECKING:
    from ._delivery import Delivery
    from ._platform._http import HttpResponse

log = logging.getLogger("trio_worker")

#: ``spawn(task)``: start *task* beside the jobs; False when there is no place for it.
Spawn: TypeAlias = Callable[[Callable[[], Awaitable[None]]], bool]
#: ``post(requests)``: one pipelined attempt at each ``(url, body)``; the answers to a prefix.
PostPipelined: TypeAlias = Callable[[list[tuple[str, bytes]]], Awaitable[list["HttpResponse"]]]

# The one batch limit: a stream's batch, and a round of every stream's batches, take
# chunks up to this many requests or bytes of body. A round cut short by a broken
# connection sends its unanswered chunks again one at a time, so it is kept modest.
BATCH_REQUESTS = 256
BATCH_BYTES = 1024 * 1024
# Scheduler passes a round waits for more batches before it boards when it does not
# linger (Backend.round_linger): every open stream has boarded already (a lone stream),
# or the convoy has no linger. Streams board the moment a chunk is ready
# (docs/protocol.md §2.4), so without a wait a round often leaves with the one chunk that
# woke the convoy. With 64 streams at 50 chunks/s the worker's CPU per chunk was, in
# alternating runs, 164 us with one pass and 126 us with three; a 1 ms linger then took
# it to 0.70x of three passes on trio.
BOARDING_PASSES = 3


def has_room(requests: int, size: int) -> bool:
    """Whether a stream's batch of *requests* chunks and *size* bytes may take one more
    (the chunk taken last may pass :data:`BATCH_BYTES` by its own size)."""
    return requests < BATCH_REQUESTS and size < BATCH_BYTES


def fits(requests: int, size: int, seat: Seat) -> bool:
    """Whether a round of *requests* and *size* bytes may board *seat* within the limit
    (the first seat boards whatever its size: a round holds at most one batch over it)."""
    return requests + len(seat.requests) <= BATCH_REQUESTS and size + seat.size <= BATCH_BYTES


#: ``answered(answers)``: called in the convoy's task with the answers to a prefix of a
#: seat's requests; it must not block (a stream queues its next batch, or starts a task).
Answered: TypeAlias = Callable[[list["HttpResponse"]], None]


@dataclass(eq=False)
class Seat:
    """A batch waiting for, or riding, a round: its sender waits on :attr:`answered`
    (:meth:`ChunkConvoy.send`), or is called back (:meth:`ChunkConvoy.board`)."""

    requests: list[tuple[str, bytes]]
    answers: list[HttpResponse] = field(default_factory=list)
    answered: trio.Event | None = None
    callback: Answered | None = None
    abandoned: bool = False  # its sender stopped waiting (its job cancelled or over)
    size: int = field(init=False)  # bytes of body

    def __post_init__(self) -> None:
        self.size = sum(len(body) for _, body in self.requests)

    def answer(self, answers: list[HttpResponse]) -> None:
        self.answers = answers
        if self.answered is not None:
            self.answered.set()
        elif self.callback is not None and not self.abandoned:
            callback, self.callback = self.callback, None  # answered once
            callback(answers)


class ChunkConvoy:
    """The worker's stream poster: pipelined batches of many streams, sent together in
    rounds by one task (:meth:`send`), and single chunks retried on their own
    (:meth:`send_chunk`). It is the runner's :class:`~trio_worker._chunk_posts.ChunkSink`
    when built with the worker's *delivery*."""

    def __init__(
        self,
        post: PostPipelined,
        spawn: Spawn | None,
        *,
        delivery: Delivery | None = None,
        linger: float = 0.0,
    ) -> None:
        self._post = post
        self._spawn = spawn
        self._delivery = delivery
        self._linger = linger  # seconds a round waits for more batches; 0: BOARDING_PASSES
        self._streams = 0  # open streams (ChunkPoster), each with at most one seat waiting
        self._all_aboard: trio.Event | None = None
        self._boarding: trio.Event | None = None  # the task waits for a seat, idle
        self._waiting: deque[Seat] = deque()
        self._driving = False
        self._boarded: list[Seat] = []
        self._round_scope = trio.CancelScope()

    def __repr__(self) -> str:
        boarded = sum(len(seat.requests) for seat in self._boarded)
        waiting = sum(len(seat.requests) for seat in self._waiting)
        return f"<ChunkConvoy driving={self._driving} boarded={boarded} waiting={waiting}>"

    # -- the ChunkSink of the platform ----------------------------------------------------

    async def send_chunk(self, job_id: str, body: bytes, *, retry_until: float) -> bool:
        delivery = self._platform()
        url = self.stream_url(job_id)
        # A stream whose budget is spent still gives each chunk one attempt's timeout: the
        # platform may be back.
        once = trio.current_time() + delivery.timings.report_attempt_bound(len(body))
        outcome = ReportOutcome()
        with trio.move_on_at(max(retry_until, once)):
            await delivery.post(url, body, job_id=job_id, outcome=outcome)
        if not outcome.delivered:
            _log_lost(job_id, outcome.attempts, outcome.last_error or "no attempt made")
        return outcome.delivered

    async def send_batch(
        self, job_id: str, bodies: list[bytes], *, retry_until: float
    ) -> list[bool | None]:
        delivery = self._platform()
        verdicts: list[bool | None] = [None] * len(bodies)
        if not delivery.client.pipelining:
            return verdicts
        url = self.stream_url(job_id)
        answers = await self.send([(url, body) for body in bodies])
        return await self.verdicts(job_id, bodies, answers, retry_until=retry_until)

    async def verdicts(
        self, job_id: str, bodies: list[bytes], answers: list[HttpResponse], *, retry_until: float
    ) -> list[bool | None]:
        """:meth:`send_batch`'s verdicts on the *answers* a round gave *bodies*."""
        delivery = self._platform()
        verdicts: list[bool | None] = [None] * len(bodies)
        asked: float | None = None
        for index, answer in enumerate(answers):
            status = answer.status
            if 200 <= status < 300:
                verdicts[index] = True
            elif not is_retryable(status):
                _log_lost(job_id, 1, f"HTTP {status}")
                verdicts[index] = False
            elif (seconds := asked_pause(answer)) is not None:
                asked = seconds if asked is None else max(asked, seconds)
        if asked is not None and None in verdicts:
            # A 429 or 503 asked for a pause: the chunks go again after it, paced as a
            # report retried on its own would be (the delivery's one rule, within the
            # stream's budget and the shutdown plan).
            bound = delivery.timings.report_attempt_bound(len(bodies[0]))
            until = min(trio.current_time() + delivery.retry_wait(1, asked), retry_until)
            await delivery.plan.wait_to_retry(until, bound)
        return verdicts

    def _platform(self) -> Delivery:
        if self._delivery is None:
            raise RuntimeError("a ChunkConvoy built without a delivery posts no stream chunks")
        return self._delivery

    # -- streams ------------------------------------------------------------------------

    def stream_opened(self) -> None:
        """A stream will board here (at most one seat of it waiting at a time)."""
        self._streams += 1

    def stream_closed(self) -> None:
        """A stream said :meth:`stream_opened` is over: a lingering round waits no more
        for it."""
        self._streams -= 1
        self._boarded_one()

    def _boarded_one(self) -> None:
        if self._boarding is not None:
            self._boarding.set()
            self._boarding = None
        if self._all_aboard is not None and len(self._waiting) >= self._streams:
            self._all_aboard.set()

    async def _next_seat(self) -> bool:
        """Wait, idle, for a seat while a stream is open: whether one boarded. The task
        stays for the streams' next chunks rather than ending with every round, so a chunk
        finds it running (a stream's chunks board from the asyncio pump, which starts no
        task: ``ChunkPoster.accepts_now``) and a round costs no task of its own."""
        while not self._waiting:
            if self._streams <= 0:
                return False
            self._boarding = boarding = trio.Event()
            await boarding.wait()
        return True

    async def _gather(self) -> None:
        """Before a round: wait for more batches to board. With a linger, up to that long,
        but no longer than until every open stream has a seat waiting (a stream boards one
        batch at a time, so a lone fast stream never waits); otherwise a few passes."""
        if self._linger > 0 and len(self._waiting) < self._streams:
            self._all_aboard = trio.Event()
            try:
                with trio.move_on_after(self._linger):
                    await self._all_aboard.wait()
            finally:
                self._all_aboard = None
            return
        for _ in range(BOARDING_PASSES):
            await trio.lowlevel.checkpoint()

    # -- rounds ---------------------------------------------------------------------------

    async def send(self, requests: list[tuple[str, bytes]]) -> list[HttpResponse]:
        """One attempt at each request, in a round with whatever else is waiting: the
        answers to a prefix of *requests* (the rest are the caller's to send again)."""
        if not self._driving:
            if self._spawn is None or not self._spawn(self._drive):
                return await self._post(requests)
            self._driving = True
        answered = trio.Event()
        seat = Seat(requests, answered=answered)
        self._waiting.append(seat)
        self._boarded_one()
        try:
            await answered.wait()
        finally:
            if not answered.is_set():
                self.abandon(seat)
        return seat.answers

    def boards_now(self) -> bool:
        """Whether :meth:`board` would queue a batch for a round already under way,
        starting no task (the caller may not be a trio task: the asyncio pump)."""
        return self._driving and self._platform().client.pipelining

    def stream_url(self, job_id: str) -> str:
        """Where *job_id*'s chunks go (a stream asks once: :meth:`board` takes it)."""
        return self._platform().settings.platform.stream_url(job_id)

    def board(self, url: str, bodies: list[bytes], callback: Answered) -> Seat | None:
        """Queue *bodies* for the next round, to *url* (:meth:`stream_url`), without
        waiting: *callback* gets their answers, in the convoy's task. None when there is
        no round to join (pipelining off, or no place for the convoy's task): the caller
        posts them itself."""
        delivery = self._platform()
        if not delivery.client.pipelining:
            return None
        if not self._driving:
            if self._spawn is None or not self._spawn(self._drive):
                return None
            self._driving = True
        seat = Seat([(url, body) for body in bodies], callback=callback)
        self._waiting.append(seat)
        self._boarded_one()
        return seat

    def abandon(self, seat: Seat) -> None:
        """Its sender no longer waits for *seat*'s answers (its job cancelled or over)."""
        if seat in self._waiting:
            self._waiting.remove(seat)  # not boarded: nothing of it goes out
            return
        seat.abandoned = True
        if all(other.abandoned for other in self._boarded):
            # Nobody waits for this round's answers any more: it must not hold the jobs'
            # nursery open (a shutdown past its grace ends at once, docs/design.md §9).
            self._round_scope.cancel()

    async def _drive(self) -> None:
        """Run rounds while batches wait, and wait for the next while a stream is open;
        every boarded seat is answered, even when a round fails or this task is cancelled
        (then with what was answered, maybe none)."""
        boarded: list[Seat] = []
        try:
            while True:
                if not await self._next_seat():
                    return
                # Lets the streams with a batch ready now, and those whose generators wake
                # in the next scheduler passes (their timers due meanwhile) or within the
                # backend's linger (Backend.round_linger), join the round about to start:
                # fewer, fuller rounds.
                await self._gather()
                if not self._waiting:
                    continue  # abandoned while the round gathered
                self._boarded = boarded = self._board()
                answers: list[HttpResponse] = []
                with trio.CancelScope() as self._round_scope:
                    answers = await self._round(boarded)
                self._boarded = []
                start = 0
                # A seat called back may queue its stream's next batch for the next round.
                for seat in boarded:
                    end = start + len(seat.requests)
                    seat.answer(answers[start:end])
                    start = end
                boarded = []
        finally:
            self._driving = False
            self._boarding = None
            self._boarded = []
            left = [*boarded, *self._waiting]
            self._waiting.clear()
            for seat in left:
                seat.answer(seat.answers)

    def _board(self) -> list[Seat]:
        first = self._waiting.popleft()
        boarded = [first]
        requests, size = len(first.requests), first.size
        while self._waiting:
            seat = self._waiting[0]
            if not fits(requests, size, seat):
                break
            boarded.append(self._waiting.popleft())
            requests += len(seat.requests)
            size += seat.size
        return boarded

    async def _round(self, boarded: list[Seat]) -> list[HttpResponse]:
        requests = [request for seat in boarded for request in seat.requests]
        try:
            return await self._post(requests)
        except Exception:
            # A bug here must not fail the jobs riding along: their chunks go again one
            # at a time, on each stream's own account.
            log.exception("a round of %d pipelined stream chunks failed", len(requests))
            return []


def _log_lost(job_id: str, attempts: int, error: str) -> None:
    log.error(
        "stream chunk for job %s not delivered after %d attempt(s): %s", job_id, attempts, error
    )

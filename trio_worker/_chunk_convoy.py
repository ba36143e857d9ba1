"""The platform's stream sink: the chunks of every job, posted together, one write a round
(docs/protocol.md §2.4, "Streams share writes"). Rounds run in a task of their own beside
the jobs (:data:`Spawn`), so a job cancelled while its chunks share a round abandons only
its own seat, and cuts nobody else's round short."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeAlias

import trio

from ._chunk_posts import BATCH_BYTES, BATCH_REQUESTS, ChunkSink, Seat
from ._platform._client import ReportOutcome, is_retryable, report_attempt_bound
from ._platform._wire import asked_pause

if TYPE_CHECKING:
    from ._chunk_posts import Answered
    from ._delivery import Delivery
    from ._platform._http import HttpResponse

log = logging.getLogger("trio_worker")

#: ``spawn(task)``: start *task* beside the jobs; False when there is no place for it.
Spawn: TypeAlias = Callable[[Callable[[], Awaitable[None]]], bool]
#: ``post(requests)``: one pipelined attempt at each ``(url, body)``; the answers to a prefix.
PostPipelined: TypeAlias = Callable[[list[tuple[str, bytes]]], Awaitable[list["HttpResponse"]]]

# Scheduler passes a round waits for more seats when it does not linger (every open
# stream has boarded already, or the convoy has no linger, ``Backend.round_linger``): the
# streams whose generators wake in those passes join it.
BOARDING_PASSES = 3


class ChunkConvoy(ChunkSink):
    """The worker's stream sink: the seats of many streams, sent together in rounds by
    one task, and single chunks retried on their own with the worker's *delivery*."""

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
        self._linger = linger  # seconds a round waits for more seats; 0: BOARDING_PASSES
        self._streams = 0  # open streams, each with at most one seat waiting
        self._all_aboard: trio.Event | None = None
        self._boarding: trio.Event | None = None  # the task waits for a seat, idle
        self._waiting: deque[Seat] = deque()
        self._driving = False
        self._boarded: list[Seat] = []
        self._round_scope = trio.CancelScope()

    def __repr__(self) -> str:
        boarded = sum(len(seat.bodies) for seat in self._boarded)
        waiting = sum(len(seat.bodies) for seat in self._waiting)
        return (
            f"<ChunkConvoy driving={self._driving} streams={self._streams} "
            f"boarded={boarded} waiting={waiting}>"
        )

    # -- the ChunkSink -----------------------------------------------------------------

    def open_stream(self, job_id: str, answered: Answered) -> Seat:
        url = self._platform().client.stream_url(job_id) if self._delivery else job_id
        self._streams += 1
        return Seat(job_id, url, answered)

    def close_stream(self, seat: Seat) -> None:
        self._streams -= 1
        seat.abandoned = True
        if seat in self._waiting:
            self._waiting.remove(seat)  # not boarded: nothing of it goes out
        elif seat in self._boarded and all(other.abandoned for other in self._boarded):
            # Nobody waits for this round's answers any more: it must not hold the jobs'
            # nursery open (a shutdown past its grace ends at once, docs/design.md §9).
            self._round_scope.cancel()
        self._boarded_one()  # a lingering round waits no more for it

    def boards_now(self) -> bool:
        return self._driving and self._pipelining()

    def board(self, seat: Seat, bodies: list[bytes]) -> bool:
        if not self._pipelining():
            return False
        if not self._driving:
            if self._spawn is None or not self._spawn(self._drive):
                return False
            self._driving = True
        seat.take(bodies)
        self._waiting.append(seat)
        self._boarded_one()
        return True

    async def send_chunk(
        self, seat: Seat, body: bytes, *, retry_until: float, pause: float | None = None
    ) -> bool:
        delivery = self._platform()
        bound = report_attempt_bound(delivery.timings, len(body))
        if pause is not None:
            # A 429 or 503 asked for a pause: paced as a report retried on its own would
            # be (the delivery's one rule, within the stream's budget and the shutdown plan).
            until = min(trio.current_time() + delivery.retry_wait(1, pause), retry_until)
            await delivery.plan.wait_to_retry(until, bound)
        # A stream whose budget is spent still gives each chunk one attempt's timeout: the
        # platform may be back.
        once = trio.current_time() + bound
        outcome = ReportOutcome()
        with trio.move_on_at(max(retry_until, once)):
            await delivery.post(seat.url, body, job_id=seat.job_id, outcome=outcome)
        if not outcome.delivered:
            _log_lost(seat.job_id, outcome.attempts, outcome.last_error or "no attempt made")
        return outcome.delivered

    def _platform(self) -> Delivery:
        if self._delivery is None:
            raise RuntimeError("a ChunkConvoy built without a delivery posts no chunk alone")
        return self._delivery

    def _pipelining(self) -> bool:
        return self._delivery is None or self._delivery.client.pipelining

    # -- rounds ---------------------------------------------------------------------------

    def _boarded_one(self) -> None:
        if self._boarding is not None:
            self._boarding.set()
            self._boarding = None
        if self._all_aboard is not None and len(self._waiting) >= self._streams:
            self._all_aboard.set()

    async def _next_seat(self) -> bool:
        """Wait, idle, for a seat while a stream is open: whether one boarded. The task
        stays, so a chunk finds it running (the asyncio pump, which starts no task, may
        then board it: :meth:`boards_now`)."""
        while not self._waiting:
            if self._streams <= 0:
                return False
            self._boarding = boarding = trio.Event()
            await boarding.wait()
        return True

    async def _gather(self) -> None:
        """Before a round: wait for more seats to board. With a linger, up to that long,
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

    async def _drive(self) -> None:
        """Run rounds while seats wait, and wait for the next while a stream is open;
        every boarded seat is answered, even when a round fails or this task is cancelled
        (then with what was answered, maybe nothing)."""
        boarded: list[Seat] = []
        try:
            while True:
                if not await self._next_seat():
                    return
                await self._gather()
                if not self._waiting:
                    continue  # abandoned while the round gathered
                self._boarded = boarded = self._board()
                answers: list[HttpResponse] = []
                with trio.CancelScope() as self._round_scope:
                    answers = await self._round(boarded)
                self._boarded = []
                start = 0
                # A seat called back may board its stream's next batch for the next round.
                for seat in boarded:
                    end = start + len(seat.bodies)
                    _answer(seat, answers[start:end])
                    start = end
                boarded = []
        finally:
            self._driving = False
            self._boarding = None
            self._boarded = []
            left = [*boarded, *self._waiting]
            self._waiting.clear()
            for seat in left:
                _answer(seat, [])

    def _board(self) -> list[Seat]:
        first = self._waiting.popleft()
        boarded = [first]
        requests, size = len(first.bodies), first.size
        while self._waiting:
            seat = self._waiting[0]
            # Within the limit: only the first seat boards whatever its size.
            if requests + len(seat.bodies) > BATCH_REQUESTS or size + seat.size > BATCH_BYTES:
                break
            boarded.append(self._waiting.popleft())
            requests += len(seat.bodies)
            size += seat.size
        return boarded

    async def _round(self, boarded: list[Seat]) -> list[HttpResponse]:
        requests = [(seat.url, body) for seat in boarded for body in seat.bodies]
        try:
            return await self._post(requests)
        except Exception:
            # A bug here must not fail the jobs riding along: their chunks go again one
            # at a time, on each stream's own account.
            log.exception("a round of %d pipelined stream chunks failed", len(requests))
            return []


def _answer(seat: Seat, answers: list[HttpResponse]) -> None:
    """Tell *seat* how its batch went, from the *answers* a round gave a prefix of it."""
    if seat.abandoned:
        return
    verdicts: list[bool | None] = [None] * len(seat.bodies)
    asked: float | None = None
    for index, answer in enumerate(answers):
        status = answer.status
        if 200 <= status < 300:
            verdicts[index] = True
        elif not is_retryable(status):
            _log_lost(seat.job_id, 1, f"HTTP {status}")
            verdicts[index] = False
        elif (seconds := asked_pause(answer)) is not None:
            asked = seconds if asked is None else max(asked, seconds)
    seat.answer(verdicts, asked)


def _log_lost(job_id: str, attempts: int, error: str) -> None:
    log.error(
        "stream chunk for job %s not delivered after %d attempt(s): %s", job_id, attempts, error
    )

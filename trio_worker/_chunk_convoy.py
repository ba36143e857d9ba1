"""The stream chunks of every job, posted together: one pipelined write per round.

Posting each stream's chunks on its own connection costs one write, one wake-up and one
read per chunk: 64 streams of 50 tokens a second are 3,200 request rounds a second, and on
a 2-core machine the worker's CPU, not the network, then sets how late a token reaches the
platform (docs/benchmarks.md, "64 paced streams"). Here the batches of every stream that
are waiting when a round starts go out in one write on one kept-alive connection, their
answers read back in order; batches that arrive while a round is on the wire wait for the
next one, so the busier the worker, the more each round carries.

A round runs in a task of its own beside the jobs (:data:`Spawn`), not in the task of
the stream that started it: a job cancelled while its chunks share a round with other
jobs' chunks abandons only its own wait, and cuts nobody else's round short (which would
make them send again chunks the platform may already have). A round nobody waits for any
more is cancelled at once, so it never holds the jobs' nursery open past a shutdown.
Where no such place exists (local mode, tests with no supervisor), each stream posts its
own batch, as before.

What each stream makes of its answers (order, retries, budget) is
:func:`~trio_worker._chunk_posts.post_chunks`'s business, unchanged: a round is one attempt
at each chunk in it, and a chunk it did not get an answer for is that stream's to send again.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

import trio

if TYPE_CHECKING:
    from ._platform._http import HttpResponse

log = logging.getLogger("trio_worker")

#: ``spawn(task)``: start *task* beside the jobs; False when there is no place for it.
Spawn: TypeAlias = Callable[[Callable[[], Awaitable[None]]], bool]
#: ``post(requests)``: one pipelined attempt at each ``(url, body)``; the answers to a prefix.
PostPipelined: TypeAlias = Callable[[list[tuple[str, bytes]]], Awaitable[list["HttpResponse"]]]

# A round stops boarding batches at this many requests or bytes of body (one batch always
# boards, whatever its size): a round cut short by a broken connection sends its
# unanswered chunks again one at a time, so it is kept modest.
ROUND_REQUESTS = 256
ROUND_BYTES = 1024 * 1024


@dataclass(eq=False)
class _Seat:
    requests: list[tuple[str, bytes]]
    answers: list[HttpResponse] = field(default_factory=list)
    answered: trio.Event = field(default_factory=trio.Event)
    abandoned: bool = False  # its sender stopped waiting (its job cancelled or over)
    size: int = field(init=False)  # bytes of body

    def __post_init__(self) -> None:
        self.size = sum(len(body) for _, body in self.requests)


class ChunkConvoy:
    """Pipelined batches of many streams, sent together in rounds by one task."""

    def __init__(self, post: PostPipelined, spawn: Spawn | None) -> None:
        self._post = post
        self._spawn = spawn
        self._waiting: deque[_Seat] = deque()
        self._driving = False
        self._boarded: list[_Seat] = []
        self._round_scope = trio.CancelScope()

    async def send(self, requests: list[tuple[str, bytes]]) -> list[HttpResponse]:
        """One attempt at each request, in a round with whatever else is waiting: the
        answers to a prefix of *requests* (the rest are the caller's to send again)."""
        if not self._driving:
            if self._spawn is None or not self._spawn(self._drive):
                return await self._post(requests)
            self._driving = True
        seat = _Seat(requests)
        self._waiting.append(seat)
        try:
            await seat.answered.wait()
        finally:
            if not seat.answered.is_set():
                self._abandon(seat)
        return seat.answers

    def _abandon(self, seat: _Seat) -> None:
        if seat in self._waiting:
            self._waiting.remove(seat)  # not boarded: nothing of it goes out
            return
        seat.abandoned = True
        if all(other.abandoned for other in self._boarded):
            # Nobody waits for this round's answers any more: it must not hold the jobs'
            # nursery open (a shutdown past its grace ends at once, docs/design.md §9).
            self._round_scope.cancel()

    async def _drive(self) -> None:
        """Run rounds while batches wait; every boarded seat is answered, even when a
        round fails or this task is cancelled (then with what was answered, maybe none)."""
        boarded: list[_Seat] = []
        try:
            while True:
                # Lets the streams with a batch ready now (or those just answered, with
                # their next one) join the round about to start.
                await trio.lowlevel.checkpoint()
                if not self._waiting:
                    return
                self._boarded = boarded = self._board()
                answers: list[HttpResponse] = []
                with trio.CancelScope() as self._round_scope:
                    answers = await self._round(boarded)
                start = 0
                for seat in boarded:
                    end = start + len(seat.requests)
                    seat.answers = answers[start:end]
                    seat.answered.set()
                    start = end
        finally:
            self._driving = False
            self._boarded = []
            for seat in [*boarded, *self._waiting]:
                seat.answered.set()
            self._waiting.clear()

    def _board(self) -> list[_Seat]:
        first = self._waiting.popleft()
        boarded = [first]
        requests, size = len(first.requests), first.size
        while self._waiting:
            seat = self._waiting[0]
            if requests + len(seat.requests) > ROUND_REQUESTS or size + seat.size > ROUND_BYTES:
                break
            boarded.append(self._waiting.popleft())
            requests += len(seat.requests)
            size += seat.size
        return boarded

    async def _round(self, boarded: list[_Seat]) -> list[HttpResponse]:
        requests = [request for seat in boarded for request in seat.requests]
        try:
            return await self._post(requests)
        except Exception:
            # A bug here must not fail the jobs riding along: their chunks go again one
            # at a time, on each stream's own account.
            log.exception("a round of %d pipelined stream chunks failed", len(requests))
            return []

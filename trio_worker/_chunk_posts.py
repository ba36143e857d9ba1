"""Posting a stream's chunks to the job-stream route: in order, pipelined, retried.

docs/protocol.md §2.4 has the rules. The reference posts one chunk and waits for its answer
before asking the generator for the next one, so a stream runs at one round trip per chunk
at best (docs/protocol.md §8 item 15). Here the generator runs ahead into a bounded queue,
and the chunks waiting in it go out together, with those of the other streams waiting at
the same moment (:mod:`._chunk_convoy`): written at once on one kept-alive connection
(HTTP/1.1 pipelining), their answers read back in order. A chunk that was not answered, or
was answered with a status worth another attempt, is then sent again on its own, in order,
within the stream's budget.

At 64 streams of 50 tokens a second a chunk's every task switch counts (docs/benchmarks.md):
handing it to a task of the stream's own over a channel, that task waking again for the
round's answers, cost two scheduler passes, a channel, a seat and an event per chunk. On the
calm path a chunk now wakes no task but the convoy's (:class:`ChunkPoster`).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Protocol

import trio

from ._chunk_convoy import ChunkConvoy, has_room

if TYPE_CHECKING:
    from ._chunk_convoy import Seat
    from ._platform._http import HttpResponse

log = logging.getLogger("trio_worker")

# Chunks produced ahead of the one being posted; bounded so a fast generator cannot hold
# an unbounded backlog in memory.
STREAM_PIPELINE_DEPTH = 64


class ChunkSink(Protocol):
    """Where a streaming job's chunks go, in order: the platform, or stdout in local mode."""

    async def send_chunk(self, job_id: str, body: bytes, *, retry_until: float) -> bool:
        """Try until *retry_until* (trio time; at least one attempt); whether the chunk
        was delivered."""
        ...

    async def send_batch(
        self, job_id: str, bodies: list[bytes], *, retry_until: float
    ) -> list[bool | None]:
        """One attempt at every body, in order: per chunk, True when delivered, False when
        refused for good (and logged), None when it is worth sending again (after the
        wait the platform asked for, if any, up to *retry_until*)."""
        ...


class ChunkPoster:
    """One stream's chunks, posted in order; the indexes of those finally lost go to
    :attr:`undelivered`.

    The runner hands each chunk over with :meth:`put`, which does not switch tasks while
    fewer than :data:`STREAM_PIPELINE_DEPTH` chunks wait. While the platform takes every
    chunk at the first attempt (the calm path), the chunks waiting go to the worker's
    :class:`~trio_worker._chunk_convoy.ChunkConvoy` as one batch, at most one batch of the
    stream on the wire, and the convoy's own task queues the next batch when a round's
    answers come back: no task of the stream's own runs.

    On trouble (a chunk unanswered, or answered with a status worth another attempt), or
    with a sink that has no rounds to join (local mode, pipelining off), a task of the
    stream takes over, in order: later chunks wait behind it. The stream's budget is counted
    from its last sign of life (its start, or the last chunk acknowledged): an outage
    shorter than *budget* loses no chunk, and a dead platform costs the budget once, not
    once per chunk. A chunk refused with a status worth another attempt is sent again after
    the chunks already on the wire behind it, so a faulty platform can reorder (never lose)
    chunks of one batch, and after any trouble the next batch goes one chunk at a time
    until a batch is delivered whole; then the stream is calm again.
    """

    def __init__(
        self, sink: ChunkSink, job_id: str, nursery: trio.Nursery, *, budget: float
    ) -> None:
        self.undelivered: list[int] = []
        self._sink = sink
        self._convoy = sink if isinstance(sink, ChunkConvoy) else None
        self._job_id = job_id
        self._nursery = nursery
        self._budget = budget
        self._alive = trio.current_time()
        self._pending: deque[bytes] = deque()
        self._index = 0  # of the first chunk not yet settled
        self._batch: list[bytes] = []  # on the wire in a round, answers to come
        self._seat: Seat | None = None
        self._url: str | None = None  # the job's stream URL, built at the first batch
        self._posting = False  # a task of the stream's own posts
        self._calm = True
        self._closed = False
        self._changed: trio.Event | None = None
        self._counted = self._convoy is not None  # among the convoy's open streams
        if self._convoy is not None:
            self._convoy.stream_opened()

    async def put(self, body: bytes) -> None:
        """Queue *body*; waits only while the stream's backlog is full."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self.put_now(body)
        while len(self._pending) >= STREAM_PIPELINE_DEPTH:
            await self._wait()

    def accepts_now(self) -> bool:
        """Whether :meth:`put_now` may queue a chunk: the stream is calm, its backlog has
        room, and its chunks go out with no task started (a batch on the wire already, or
        a round under way to board): it may be called from outside trio's tasks."""
        if self._closed or not self._calm or len(self._pending) >= STREAM_PIPELINE_DEPTH - 1:
            return False
        if self._seat is not None or self._posting:
            return True
        return self._convoy is not None and self._convoy.boards_now()

    def put_now(self, body: bytes) -> None:
        """Queue *body* (:meth:`put` without its checkpoint and its wait for room); called
        from outside trio's tasks only after :meth:`accepts_now` said yes."""
        self._pending.append(body)
        if self._seat is None and not self._posting:
            self._next()

    async def settle(self) -> None:
        """Wait until every chunk put is delivered or counted as undelivered."""
        while self._pending or self._seat is not None or self._posting:
            await self._wait()
        self._closed = True

    def abandon(self) -> None:
        """The stream is over (its job stopped): its batch on the wire is nobody's now."""
        self._closed = True
        if self._seat is not None and self._convoy is not None:
            self._convoy.abandon(self._seat)
        self._seat = None
        if self._counted and self._convoy is not None:
            self._counted = False
            self._convoy.stream_closed()

    async def _wait(self) -> None:
        self._changed = changed = trio.Event()
        await changed.wait()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _next(self) -> None:
        """Send the chunks waiting: boarded on the convoy while calm, else by a task."""
        if self._closed:
            return
        batch = take_batch(self._pending)
        self._wake()
        if not (self._calm and self._board(batch)):
            self._posting = True
            self._nursery.start_soon(self._post, batch, None)

    def _board(self, batch: list[bytes]) -> bool:
        if self._convoy is None:
            return False
        if self._url is None:
            self._url = self._convoy.stream_url(self._job_id)
        seat = self._convoy.board(self._url, batch, self._answered)
        if seat is None:
            return False
        self._batch, self._seat = batch, seat
        return True

    def _answered(self, answers: list[HttpResponse]) -> None:
        # In the convoy's task: it must not block.
        batch, self._batch, self._seat = self._batch, [], None
        if self._closed:
            return
        if len(answers) == len(batch) and all(200 <= answer.status < 300 for answer in answers):
            self._alive = trio.current_time()
            self._index += len(batch)
            if self._pending:
                self._next()
            else:
                self._wake()
            return
        self._posting = True
        self._nursery.start_soon(self._post, batch, answers)

    async def _post(self, batch: list[bytes], answers: list[HttpResponse] | None) -> None:
        """The stream's own task: *batch* (with the *answers* a round gave it, if any)
        and the batches after it, until the stream is calm or has nothing waiting."""
        sink = self._sink
        try:
            while True:
                retry_until = self._alive + self._budget
                if answers is not None:
                    assert self._convoy is not None
                    verdicts = await self._convoy.verdicts(
                        self._job_id, batch, answers, retry_until=retry_until
                    )
                    self._calm = all(verdict is True for verdict in verdicts)
                elif self._calm:
                    verdicts = await sink.send_batch(self._job_id, batch, retry_until=retry_until)
                    self._calm = all(verdict is True for verdict in verdicts)
                else:
                    verdicts = [None] * len(batch)
                    self._calm = True
                for body, verdict in zip(batch, verdicts, strict=True):
                    if verdict is None:
                        verdict = await sink.send_chunk(
                            self._job_id, body, retry_until=self._alive + self._budget
                        )
                    if verdict:
                        self._alive = trio.current_time()
                    else:
                        self.undelivered.append(self._index)
                        self._calm = False
                    self._index += 1
                if not self._pending or self._closed:
                    return
                batch = take_batch(self._pending)
                self._wake()
                answers = None
                if self._calm and self._board(batch):
                    return  # calm again: the rounds carry the stream on
        finally:
            self._posting = False
            self._wake()


def take_batch(pending: deque[bytes]) -> list[bytes]:
    """The first chunks of *pending* (not empty), while the batch has room within the one
    limit (:func:`~trio_worker._chunk_convoy.has_room`): the last one taken may pass the
    byte limit by its own size."""
    batch = [pending.popleft()]
    size = len(batch[0])
    while pending and has_room(len(batch), size):
        body = pending.popleft()
        batch.append(body)
        size += len(body)
    return batch

"""Posting a stream's chunks to the job-stream route: in order, in batches, retried
(docs/protocol.md §2.4). One path for a chunk: those waiting when the stream's :class:`Seat`
is free board it as one batch (:meth:`ChunkSink.board`), the sink's answer boards the next,
and a chunk with no verdict is sent again on its own by a task of the stream
(:meth:`ChunkSink.send_chunk`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import TypeAlias

import trio

# Chunks produced ahead of the one being posted: a fast generator's backlog is bounded.
STREAM_PIPELINE_DEPTH = 64
# The one batch limit: a stream's batch, and a round of every stream's batches, take
# chunks up to this many requests or bytes of body. A round cut short by a broken
# connection sends its unanswered chunks again one at a time, so it is kept modest.
BATCH_REQUESTS = 256
BATCH_BYTES = 1024 * 1024

#: ``answered(seat)``: called by the sink with :attr:`Seat.verdicts` filled in. It must
#: not block (it runs in the sink's task, or in place for a local sink).
Answered: TypeAlias = Callable[["Seat"], None]


class Seat:
    """A stream's place on its sink: the batch it has boarded, if any, and whom to tell
    how it went. One per stream (a stream boards one batch at a time)."""

    __slots__ = ("abandoned", "answered", "bodies", "job_id", "pause", "size", "url", "verdicts")

    def __init__(self, job_id: str, url: str, answered: Answered) -> None:
        self.job_id = job_id
        self.url = url  # where the chunks go
        self.answered = answered
        self.bodies: list[bytes] = []
        self.size = 0  # bytes of body
        #: Per chunk: True delivered, False refused for good (logged), None worth another
        #: attempt (after :attr:`pause` seconds, when the platform asked for one).
        self.verdicts: list[bool | None] = []
        self.pause: float | None = None
        self.abandoned = False  # its stream is over: nobody waits for its answers

    def take(self, bodies: list[bytes]) -> None:
        """Board *bodies* (the sink then answers them once)."""
        self.bodies = bodies
        self.size = sum(map(len, bodies))

    def answer(self, verdicts: list[bool | None], pause: float | None = None) -> None:
        """The sink's verdicts on the batch; its owner hears of them unless it left."""
        self.verdicts, self.pause = verdicts, pause
        if not self.abandoned:
            self.answered(self)


class ChunkSink(ABC):
    """Where a streaming job's chunks go, in order: the platform, or a local stand-in."""

    @abstractmethod
    def open_stream(self, job_id: str, answered: Answered) -> Seat:
        """A stream of *job_id* starts: its seat, whose answers go to *answered*."""

    @abstractmethod
    def close_stream(self, seat: Seat) -> None:
        """The stream is over: its batch, if one is boarded, is nobody's now."""

    @abstractmethod
    def boards_now(self) -> bool:
        """Whether :meth:`board` would take a batch starting no task (the caller may not
        be a trio task: the asyncio pump)."""

    @abstractmethod
    def board(self, seat: Seat, bodies: list[bytes]) -> bool:
        """One attempt at each of *bodies*, answered through the seat; False when there
        is no round to join (then the stream sends them on its own)."""

    @abstractmethod
    async def send_chunk(
        self, seat: Seat, body: bytes, *, retry_until: float, pause: float | None = None
    ) -> bool:
        """Try until *retry_until* (trio time; at least one attempt, after *pause*
        seconds when the platform asked for one); whether the chunk was delivered."""


class LocalChunks(ChunkSink):
    """A sink in the worker's own process (stdout in local mode, nothing in the realtime
    route, a list in tests): each chunk is delivered in place, at once, never refused (so
    its answer starts no task, and the asyncio pump may board it)."""

    @abstractmethod
    def take(self, job_id: str, body: bytes) -> None:
        """Take one encoded chunk (``{"output": chunk}``)."""

    def open_stream(self, job_id: str, answered: Answered) -> Seat:
        return Seat(job_id, job_id, answered)

    def close_stream(self, seat: Seat) -> None:
        seat.abandoned = True

    def boards_now(self) -> bool:
        return True

    def board(self, seat: Seat, bodies: list[bytes]) -> bool:
        seat.take(bodies)
        for body in bodies:
            self.take(seat.job_id, body)
        seat.answer([True] * len(bodies))
        return True

    async def send_chunk(
        self, seat: Seat, body: bytes, *, retry_until: float, pause: float | None = None
    ) -> bool:
        await trio.lowlevel.checkpoint()
        self.take(seat.job_id, body)
        return True


def take_batch(pending: deque[bytes]) -> list[bytes]:
    """The first chunks of *pending* (not empty), while the batch has room within the one
    limit: the last one taken may pass the byte limit by its own size."""
    batch = [pending.popleft()]
    size = len(batch[0])
    while pending and len(batch) < BATCH_REQUESTS and size < BATCH_BYTES:
        body = pending.popleft()
        batch.append(body)
        size += len(body)
    return batch


class ChunkPoster:
    """One stream's chunks, posted in order; the indexes of those finally lost go to
    :attr:`undelivered`. :meth:`put` does not switch tasks while fewer than
    :data:`STREAM_PIPELINE_DEPTH` chunks wait. *budget* counts from the stream's last sign
    of life (docs/protocol.md §2.4, "Losses").
    """

    def __init__(
        self, sink: ChunkSink, job_id: str, nursery: trio.Nursery, *, budget: float
    ) -> None:
        self.undelivered: list[int] = []
        self._sink = sink
        self._nursery = nursery
        self._budget = budget
        self._alive = trio.current_time()
        self._pending: deque[bytes] = deque()
        self._index = 0  # of the first chunk not yet settled
        self._boarded = False  # a batch is in the seat, its answers to come
        self._posting = False  # a task of the stream's own posts
        self._calm = True
        self._closed = False
        self._changed: trio.Event | None = None
        self._seat = sink.open_stream(job_id, self._answered)

    async def put(self, body: bytes) -> None:
        """Queue *body*; waits only while the stream's backlog is full."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self.put_now(body)
        while len(self._pending) >= STREAM_PIPELINE_DEPTH:
            await self._wait()

    def accepts_now(self) -> bool:
        """Whether :meth:`put_now` may queue a chunk: the stream is calm, its backlog has
        room, and its chunks go out with no task started (a batch on its way already, or a
        sink that boards at once): it may be called from outside trio's tasks."""
        if self._closed or not self._calm or len(self._pending) >= STREAM_PIPELINE_DEPTH - 1:
            return False
        return self._boarded or self._posting or self._sink.boards_now()

    def put_now(self, body: bytes) -> None:
        """Queue *body* (:meth:`put` without its checkpoint and its wait for room); called
        from outside trio's tasks only after :meth:`accepts_now` said yes."""
        self._pending.append(body)
        if not (self._boarded or self._posting):
            self._next()

    async def settle(self) -> None:
        """Wait until every chunk put is delivered or counted as undelivered."""
        while self._pending or self._boarded or self._posting:
            await self._wait()
        self._closed = True

    def abandon(self) -> None:
        """The stream is over (its job stopped): its batch on its way is nobody's now."""
        if not self._seat.abandoned:
            self._closed = True
            self._boarded = False
            self._sink.close_stream(self._seat)

    async def _wait(self) -> None:
        self._changed = changed = trio.Event()
        await changed.wait()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _next(self) -> None:
        """Send the chunks waiting: boarded while calm, else by a task of the stream."""
        if self._closed:
            return
        batch = take_batch(self._pending)
        self._wake()
        if not (self._calm and self._board(batch)):
            self._posting = True
            self._nursery.start_soon(self._post, batch, None, None)

    def _board(self, batch: list[bytes]) -> bool:
        self._boarded = True  # before: a local sink answers in place
        if self._sink.board(self._seat, batch):
            return True
        self._boarded = False
        return False

    def _answered(self, seat: Seat) -> None:
        # In the sink's task (or in place): it must not block.
        self._boarded = False
        if self._closed:
            return
        verdicts = seat.verdicts
        if all(verdicts):
            self._alive = trio.current_time()
            self._index += len(verdicts)
            if self._pending:
                self._next()
            else:
                self._wake()
            return
        self._posting = True
        self._nursery.start_soon(self._post, seat.bodies, verdicts, seat.pause)

    async def _post(
        self, batch: list[bytes], verdicts: list[bool | None] | None, pause: float | None
    ) -> None:
        """The stream's own task: *batch* (with the *verdicts* its seat got, if it was
        boarded) and the batches after it, until the stream is calm or has nothing
        waiting."""
        try:
            while True:
                # A batch sent one chunk at a time calms the stream if it is delivered whole.
                self._calm = verdicts is None
                if verdicts is None:
                    verdicts = [None] * len(batch)
                for body, verdict in zip(batch, verdicts, strict=True):
                    if verdict is None:
                        verdict = await self._sink.send_chunk(
                            self._seat, body, retry_until=self._alive + self._budget, pause=pause
                        )
                        pause = None
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
                verdicts = pause = None
                if self._calm and self._board(batch):
                    return  # calm again: the seat carries the stream on
        finally:
            self._posting = False
            self._wake()

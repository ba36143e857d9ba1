"""Posting a stream's chunks to the job-stream route: in order, pipelined, retried.

docs/protocol.md §2.4 has the rules. The reference posts one chunk and waits for its answer
before asking the generator for the next one, so a stream runs at one round trip per chunk
at best (docs/protocol.md §8 item 15). Here the generator runs ahead into a bounded channel,
and the chunks waiting in it go out together, with those of the other streams waiting at
the same moment (:mod:`._chunk_convoy`): written at once on one kept-alive connection
(HTTP/1.1 pipelining), their answers read back in order. A chunk that was not answered, or
was answered with a status worth another attempt, is then sent again on its own, in order,
within the stream's budget.
"""

from __future__ import annotations

import logging
from typing import Protocol

import trio

from ._chunk_convoy import has_room

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


async def post_chunks(
    sink: ChunkSink,
    job_id: str,
    receive: trio.MemoryReceiveChannel[bytes],
    undelivered: list[int],
    *,
    budget: float,
) -> None:
    """Post the chunks in order; the indexes of those finally lost go to *undelivered*.

    The stream's budget is counted from its last sign of life (its start, or the last
    chunk acknowledged): an outage shorter than *budget* loses no chunk, and a dead
    platform costs the budget once, not once per chunk.

    Chunks are pipelined only while the platform takes them all at the first attempt:
    a chunk refused with a status worth another attempt is sent again after the chunks
    already on the wire behind it, so a faulty platform can reorder (never lose) chunks of
    one batch, and after any trouble the next batch goes one chunk at a time until a
    batch is delivered whole.
    """
    alive = trio.current_time()
    index = 0
    calm = True
    async with receive:
        async for first in receive:
            batch = _take_batch(first, receive)
            if calm:
                verdicts = await sink.send_batch(job_id, batch, retry_until=alive + budget)
                calm = all(verdict is True for verdict in verdicts)
            else:
                verdicts = [None] * len(batch)
                calm = True
            for body, verdict in zip(batch, verdicts, strict=True):
                if verdict is None:
                    verdict = await sink.send_chunk(job_id, body, retry_until=alive + budget)
                if verdict:
                    alive = trio.current_time()
                else:
                    undelivered.append(index)
                    calm = False
                index += 1


def _take_batch(first: bytes, receive: trio.MemoryReceiveChannel[bytes]) -> list[bytes]:
    """*first* and the chunks already waiting behind it, while the batch has room within
    the one limit (:func:`~trio_worker._chunk_convoy.has_room`): the last one taken may
    pass the byte limit by its own size."""
    batch = [first]
    size = len(first)
    while has_room(len(batch), size):
        try:
            body = receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            break
        batch.append(body)
        size += len(body)
    return batch

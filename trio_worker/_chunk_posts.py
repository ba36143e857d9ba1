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
from typing import TYPE_CHECKING, Protocol

import trio

from ._chunk_convoy import ChunkConvoy, Spawn
from ._platform._client import PlatformClient, ReportOutcome, is_retryable, report_retry_after

if TYPE_CHECKING:
    from ._config import Settings

log = logging.getLogger("trio_worker")

# Chunks produced ahead of the one being posted; bounded so a fast generator cannot hold
# an unbounded backlog in memory.
STREAM_PIPELINE_DEPTH = 64
# Chunks stop joining a batch at this many, or once this many bytes of body (past the
# first chunk's) have joined it: a failed batch goes again chunk by chunk, so it is kept
# modest.
PIPELINE_BATCH = 32
PIPELINE_BATCH_BYTES = 256 * 1024


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


class PlatformChunks:
    """Posts chunks to the job-stream route; pipelined batches of all streams together
    (:class:`~trio_worker._chunk_convoy.ChunkConvoy`) when *spawn* gives their rounds a
    task beside the jobs."""

    def __init__(
        self, client: PlatformClient, settings: Settings, spawn: Spawn | None = None
    ) -> None:
        self.client = client
        self.settings = settings
        self._convoy = ChunkConvoy(client.post_pipelined, spawn)

    async def send_chunk(self, job_id: str, body: bytes, *, retry_until: float) -> bool:
        url = self.settings.platform.stream_url(job_id)
        # A stream whose budget is spent still gives each chunk one attempt's timeout: the
        # platform may be back.
        once = trio.current_time() + self.settings.timings.report_attempt_bound(len(body))
        outcome = ReportOutcome()
        with trio.move_on_at(max(retry_until, once)):
            await self.client.post_report(url, body, job_id=job_id, outcome=outcome)
        if not outcome.delivered:
            _log_lost(job_id, outcome.attempts, outcome.last_error or "no attempt made")
        return outcome.delivered

    async def send_batch(
        self, job_id: str, bodies: list[bytes], *, retry_until: float
    ) -> list[bool | None]:
        verdicts: list[bool | None] = [None] * len(bodies)
        if not self.client.pipelining:
            return verdicts
        url = self.settings.platform.stream_url(job_id)
        answers = await self._convoy.send([(url, body) for body in bodies])
        wait = 0.0
        for index, answer in enumerate(answers):
            status = answer.status
            if 200 <= status < 300:
                verdicts[index] = True
            elif not is_retryable(status):
                _log_lost(job_id, 1, f"HTTP {status}")
                verdicts[index] = False
            elif status in (429, 503):
                wait = max(wait, report_retry_after(answer) or 0.0)
        if wait and None in verdicts:
            # A 429 or 503 asked for a pause: the chunks go again after it, as a report
            # retried on its own would (within the stream's budget).
            await trio.sleep(max(0.0, min(wait, retry_until - trio.current_time())))
        return verdicts


def _log_lost(job_id: str, attempts: int, error: str) -> None:
    log.error(
        "stream chunk for job %s not delivered after %d attempt(s): %s", job_id, attempts, error
    )


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
    """*first* and the chunks already waiting behind it, within the batch's bounds."""
    batch = [first]
    size = 0
    while len(batch) < PIPELINE_BATCH and size < PIPELINE_BATCH_BYTES:
        try:
            body = receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            break
        batch.append(body)
        size += len(body)
    return batch

"""``_backends._asyncio.AsyncioChunks``: the pump that carries an asyncio generator's chunks
to the trio reader, and its hand-off while the reader waits (docs/protocol.md §2.4; the
pipelined stream as a whole is tested in tests/test_stream_pipelining.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import trio
import trio.testing

from trio_worker import Timings
from trio_worker._backends import BACKENDS
from trio_worker._backends._asyncio import AsyncioChunks
from trio_worker._scopes import Scopes

from .backends import ASYNCIO_ONLY

pytestmark = pytest.mark.timeout(60)


@ASYNCIO_ONLY
async def test_a_chunk_yielded_after_its_reader_was_cancelled_is_not_handed_off(
    backend: str,
) -> None:
    """The pump hands a chunk off only while the trio reader waits for it. A stopped job's
    reader is cancelled before its pump is, and the generator may yield once in between:
    that chunk stays in the buffer (never posted by the pump), for a reader to take in
    order if one comes back."""
    go, release = asyncio.Event(), asyncio.Event()

    async def tokens() -> Any:
        await go.wait()
        yield "first"
        await release.wait()
        yield "after the stop"

    offered: list[Any] = []
    offers = [trio.Event(), trio.Event()]

    def offer(chunk: Any) -> bool:
        offers[len(offered)].set()
        offered.append(chunk)
        return True

    chunks = AsyncioChunks(tokens(), close_bound=1.0, waits=Scopes(Timings()))
    BACKENDS["asyncio"].hand_off(chunks, offer)
    try:
        reading = trio.CancelScope()
        with trio.fail_after(5):

            async def read() -> None:
                with reading:
                    await chunks.__anext__()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                await trio.testing.wait_all_tasks_blocked()  # the reader waits
                reader = chunks._reader
                assert reader is not None
                go.set()
                await offers[0].wait()  # handed off while the reader waited
                reading.cancel()  # the stop: the reader's wait ends first
            release.set()
            # The pump either buffers the second chunk and sets the reader's event, or
            # (the bug) hands it off too.
            async with trio.open_nursery() as race:

                async def until(event: trio.Event) -> None:
                    await event.wait()
                    race.cancel_scope.cancel()

                race.start_soon(until, reader)
                race.start_soon(until, offers[1])
            assert offered == ["first"]
            assert await chunks.__anext__() == "after the stop"
    finally:
        with trio.CancelScope(shield=True):
            await chunks.aclose()

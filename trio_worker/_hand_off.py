"""A chunk handed from where it was yielded to the runner, without waking the runner's task.

On the asyncio backend an async generator runs as an asyncio task apart from the trio task
that reads it (``_asyncio_host.AsyncioChunks``). Waking that trio task for every chunk cost
a guest tick of trio and a task step per token; while the stream is calm the runner's work
on a chunk (encode it, queue it for the next round) needs neither, so the source offers the
chunk to the runner first (``_runner.calm_chunk_taker``). Its own module: the asyncio host
and the handlers both name it, and neither may import the other's layer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["HandsOffChunks"]


class HandsOffChunks(ABC):
    """The chunks of an async generator that runs apart from its trio reader (on the
    asyncio host): they can reach the reader's code without waking its task."""

    @abstractmethod
    def hand_off(self, offer: Callable[[Any], bool]) -> None:
        """From now on, offer each chunk to *offer* (on the loop's thread, without a task
        switch) while the reader waits for one; a chunk it refuses (False) is read as
        before."""

"""A streaming worker: an async generator whose chunks reach the caller as they are made.

python examples/streaming_worker.py --test_input '{"input": {"words": 5}}'

The handler is trio code, so it says ``async_backend="trio"``: async code runs on asyncio
unless told otherwise, as every async handler written for ``runpod`` is asyncio code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

import trio_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


async def handler(job: dict[str, Any]) -> AsyncIterator[str]:
    for i in range(int(job["input"].get("words", 3))):
        await trio.sleep(0.01)  # stands in for decoding one token
        yield f"token-{i}"


if __name__ == "__main__":
    trio_worker.start(handler, return_aggregate_stream=True, async_backend="trio")

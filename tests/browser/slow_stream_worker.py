"""A streaming worker slow enough for a person (or a browser test) to watch chunks arrive."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

import trio_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


async def handler(job: dict[str, Any]) -> AsyncIterator[str]:
    for i in range(int(job["input"].get("words", 3))):
        await trio.sleep(float(job["input"].get("pause", 0.3)))
        yield f"token-{i}"


if __name__ == "__main__":
    trio_worker.start(handler, return_aggregate_stream=True, async_backend="trio")

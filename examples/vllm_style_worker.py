"""A vLLM-style worker: an asyncio engine built once, streaming tokens to many jobs at once.

python examples/vllm_style_worker.py --test_input '{"input": {"prompt": "hello", "tokens": 5}}'

The engine stands in for vLLM's AsyncLLMEngine (no GPU): one background asyncio task takes
requests from an ``asyncio.Queue`` and feeds each request's own queue, one token per step.
It is built in the initializer and used by every job, on the one asyncio loop the worker
keeps for its life (async code runs on asyncio unless ``async_backend`` says otherwise, in
either form of ``start()``). A stop or shutdown cancels the handler's asyncio task: the
request is aborted in ``finally``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import trio_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

MAX_CONCURRENCY = 8


class Engine:
    """One decoding loop for every request, as an inference engine batches them."""

    def __init__(self) -> None:
        self._requests: asyncio.Queue[tuple[str, int, asyncio.Queue[str | None]]] = asyncio.Queue()
        self._active: dict[int, tuple[list[str], asyncio.Queue[str | None]]] = {}
        self._ids = 0
        self._loop_task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            if not self._active:
                self._admit(await self._requests.get())
            while not self._requests.empty():
                self._admit(self._requests.get_nowait())
            await asyncio.sleep(0.005)  # one decoding step for the whole batch
            for request_id, (words, out) in list(self._active.items()):
                out.put_nowait(words.pop(0) if words else None)
                if not words:
                    out.put_nowait(None)
                    del self._active[request_id]

    def _admit(self, request: tuple[str, int, asyncio.Queue[str | None]]) -> None:
        prompt, tokens, out = request
        self._ids += 1
        self._active[self._ids] = ([f"{prompt}-{i}" for i in range(tokens)], out)

    async def generate(self, prompt: str, tokens: int) -> AsyncIterator[str]:
        out: asyncio.Queue[str | None] = asyncio.Queue()
        await self._requests.put((prompt, tokens, out))
        while (token := await out.get()) is not None:
            yield token


ENGINE: list[Engine] = []


async def load_engine() -> None:
    ENGINE.append(Engine())


def concurrency_modifier(current: int) -> int:
    return MAX_CONCURRENCY


async def handler(job: dict[str, Any]) -> AsyncIterator[str]:
    request = job["input"]
    try:
        async for token in ENGINE[0].generate(request["prompt"], int(request.get("tokens", 8))):
            yield token
    except asyncio.CancelledError:
        print(f"job {job['id']}: aborted", flush=True)
        raise


if __name__ == "__main__":
    # The reference's one-dict form; start(handler, initializer=load_engine, ...) runs the
    # same code on the same asyncio loop.
    trio_worker.start(
        {
            "handler": handler,
            "initializer": load_engine,
            "concurrency_modifier": concurrency_modifier,
            "return_aggregate_stream": True,
        }
    )

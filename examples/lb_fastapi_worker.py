"""A load-balancing worker: Runpod's FastAPI tutorial worker, migrated in one line.

Runpod's load-balancing endpoints send HTTP straight to the worker's own server (``PORT``)
and read its health from ``GET /ping`` (docs/load-balancing.md). The tutorial's worker
writes that route by hand beside a global ``model_ready`` flag and runs uvicorn; here the
model loads in the app's lifespan as before, and ``trio_worker.start_app`` owns ``/ping``
(204 while loading, 200 once loaded, 503 with the reason if the load fails), answers
requests that arrive too early with 503 and ``Retry-After``, bounds the load with
``init_timeout``, and drains requests in flight on SIGTERM.

Run it (``pip install . fastapi`` in a clone, or ``pip install -e '.[test]'``):
``PORT=8000 python examples/lb_fastapi_worker.py``, then
``curl localhost:8000/ping`` and
``curl -X POST localhost:8000/generate -H 'content-type: application/json' -d '{"prompt": "hi"}'``.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI
from pydantic import BaseModel

import trio_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

MODEL: dict[str, str] = {}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await asyncio.sleep(0.5)  # stands for loading the weights
    MODEL["name"] = "tiny-echo"
    yield
    MODEL.clear()


app = FastAPI(lifespan=lifespan)


class GenerationRequest(BaseModel):
    prompt: str
    max_tokens: int = 16


@app.post("/generate")
async def generate(request: GenerationRequest) -> dict[str, str]:
    words = request.prompt.split()[: request.max_tokens]
    return {"model": MODEL["name"], "text": " ".join(reversed(words))}


if __name__ == "__main__":
    # Was: uvicorn.run(app, host="0.0.0.0", port=int(os.getenv("PORT", "80"))), plus a
    # hand-written /ping and a model_ready flag.
    trio_worker.start_app(app, init_timeout=600)

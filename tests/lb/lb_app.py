"""A load-balancing worker for the process tests: a FastAPI app under ``start_app``.

``LB_LOAD`` picks the load: ``ok``, ``fail`` (raises during the lifespan startup),
``segv`` (the process dies by SIGSEGV while loading), ``stubborn`` (never returns, and
swallows its cancellation); ``LB_INIT_TIMEOUT`` bounds it. ``GET /slow`` waits for
``LB_SLOW_S`` seconds, ``GET /crash`` kills the process with SIGSEGV; ``LB_GRACE_S`` is
the shutdown grace, ``LB_FAILURE_HOLD_S`` how long a failed load is held before status 1.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI

import trio_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await asyncio.sleep(0)  # asyncio code: the default backend for an async app
    load = os.environ.get("LB_LOAD", "ok")
    if load == "fail":
        print("loading weights from /models/x", flush=True)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    if load == "stubborn":
        while True:  # a load that swallows its cancellation
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                print("cancellation swallowed", flush=True)
    if load == "segv":
        print("about to touch the GPU", flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
    yield
    print("lifespan shutdown ran", flush=True)


app = FastAPI(lifespan=lifespan)


@app.get("/slow")
async def slow() -> dict[str, bool]:
    print("slow request started", flush=True)
    await asyncio.sleep(float(os.environ.get("LB_SLOW_S", "0.5")))
    return {"slow": True}


@app.get("/crash")
async def crash() -> None:
    sys.stdout.write("segfaulting now\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGSEGV)


if __name__ == "__main__":
    grace = float(os.environ.get("LB_GRACE_S", "20"))
    init_timeout = float(os.environ.get("LB_INIT_TIMEOUT", "30"))
    hold = float(os.environ.get("LB_FAILURE_HOLD_S", "0.2"))
    timings = trio_worker.Timings(shutdown_grace=grace, failure_hold=hold)
    trio_worker.start_app(app, init_timeout=init_timeout, timings=timings)

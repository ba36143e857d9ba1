"""The paced-stream handler alone, with no SDK: its own CPU per chunk.

``python benchmarks/handler_alone.py BACKEND STREAMS SHORT LONG PAIRS`` runs *STREAMS* copies
of ``worker_trio.stream_paced`` (the very generator the paced-streams figure runs, one chunk
every ``BENCH_CHUNK_INTERVAL`` seconds) on *BACKEND* ("trio" or "asyncio"), all started at
once, and only iterates them: no job is taken, no chunk encoded or posted. It prints one
JSON line: the marginal CPU per chunk (a run of *LONG* chunks per stream less one of
*SHORT*, divided by the chunks between them) of each of *PAIRS* pairs, and their median.

This is the part of "CPU per streamed chunk" that no SDK can remove: the generator's timer
wake-ups and its chunk, paid by the reference's handler (on asyncio) as by trio_worker's.
Started together, the streams' wake-ups fall in the same loop passes, the cheapest case;
the SDK's own share of a paced chunk is at most the figure less this one
(docs/benchmarks.md, "What the paced-chunk target leaves the SDK").
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import trio

if __package__ in (None, ""):  # run as a script: the checkout's benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import worker_trio


async def _drain(job_id: int) -> None:
    async for _chunk in worker_trio.stream_paced({"id": str(job_id)}):
        pass


def run(backend: str, streams: int, chunks: int) -> float:
    """CPU seconds of *streams* paced generators of *chunks* chunks each, run together."""
    worker_trio.CHUNKS = chunks
    started = time.process_time()
    if backend == "trio":

        async def on_trio() -> None:
            async with trio.open_nursery() as nursery:
                for job_id in range(streams):
                    nursery.start_soon(_drain, job_id)

        trio.run(on_trio)
    else:

        async def on_asyncio() -> None:
            await asyncio.gather(*(_drain(job_id) for job_id in range(streams)))

        asyncio.run(on_asyncio())
    return time.process_time() - started


def main(argv: list[str]) -> int:
    backend, streams, short, long, pairs = argv[1], *(int(arg) for arg in argv[2:6])
    if backend not in ("trio", "asyncio"):
        raise SystemExit(f"unknown backend {backend!r}")
    samples = []
    for _ in range(pairs):
        cpu_short = run(backend, streams, short)
        cpu_long = run(backend, streams, long)
        samples.append((cpu_long - cpu_short) * 1e6 / (streams * (long - short)))
    print(
        json.dumps(
            {
                "backend": backend,
                "cpu_us_per_chunk": statistics.median(samples),
                "cpu_us_samples": samples,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

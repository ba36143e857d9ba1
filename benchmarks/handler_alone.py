"""The paced-stream handler alone, with no SDK: its own CPU per chunk.

``python benchmarks/handler_alone.py BACKEND STREAMS SHORT LONG PAIRS`` runs *STREAMS* copies
of ``worker_trio.stream_paced`` (the very generator the paced-streams figure runs, one chunk
every ``BENCH_CHUNK_INTERVAL`` seconds) on *BACKEND* ("trio" or "asyncio"), and only
iterates them: no job is taken, no chunk encoded or posted. It prints one JSON line: the
marginal CPU per chunk (a run of *LONG* chunks per stream less one of *SHORT*, divided by
the chunks between them) of each of *PAIRS* pairs, and their median, for two ways of
starting the streams:

- ``cpu_us_per_chunk``: all started at once. Their wake-ups fall in the same loop passes:
  the cheapest case, a lower bound of the handler's share.
- ``phased.cpu_us_per_chunk``: stream *k* starts *k*/*STREAMS* of an interval after the
  first, so their wake-ups are spread evenly over each interval, as those of streams started
  whenever their jobs came are. In the paced-streams figure itself the worker starts its 64
  streams over 9-17 ms, most of the 20 ms interval (the first chunk's yield time of each,
  as the platform received it). A loop pass then wakes two or three streams, not all 64,
  and each stream pays a larger share of the passes.

This is the part of "CPU per streamed chunk" that no SDK can remove: the generator's timer
wake-ups and its chunk, paid by the reference's handler (on asyncio) as by trio_worker's.
The SDK's own share of a paced chunk is the figure less this one, phased
(docs/benchmarks.md, "The paced handler alone").
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
from benchmarks._cpu_figures import marginal_us


async def _drain(job_id: int, delay: float) -> None:
    if delay > 0:
        await worker_trio.sleep(delay)
    async for _chunk in worker_trio.stream_paced({"id": str(job_id)}):
        pass


def run(backend: str, streams: int, chunks: int, *, phased: bool = False) -> float:
    """CPU seconds of *streams* paced generators of *chunks* chunks each, started together
    or, *phased*, spread evenly over one interval."""
    worker_trio.CHUNKS = chunks
    spacing = worker_trio.CHUNK_INTERVAL / streams if phased else 0.0
    delays = [job_id * spacing for job_id in range(streams)]
    started = time.process_time()
    if backend == "trio":

        async def on_trio() -> None:
            async with trio.open_nursery() as nursery:
                for job_id, delay in enumerate(delays):
                    nursery.start_soon(_drain, job_id, delay)

        trio.run(on_trio)
    else:

        async def on_asyncio() -> None:
            await asyncio.gather(*(_drain(job_id, delay) for job_id, delay in enumerate(delays)))

        asyncio.run(on_asyncio())
    return time.process_time() - started


def main(argv: list[str]) -> int:
    backend, streams, short, long, pairs = argv[1], *(int(arg) for arg in argv[2:6])
    if backend not in ("trio", "asyncio"):
        raise SystemExit(f"unknown backend {backend!r}")
    if long <= short:
        raise SystemExit(f"LONG ({long}) must be more chunks than SHORT ({short})")
    samples: dict[bool, list[float]] = {False: [], True: []}
    # The two ways of starting alternate, pair by pair: each sees the machine as the other.
    for _ in range(pairs):
        for phased in (False, True):
            cpu_short = run(backend, streams, short, phased=phased)
            cpu_long = run(backend, streams, long, phased=phased)
            us = marginal_us((cpu_short, streams * short), (cpu_long, streams * long))
            assert us is not None  # LONG > SHORT, checked above
            samples[phased].append(us)
    print(
        json.dumps(
            {
                "backend": backend,
                "cpu_us_per_chunk": statistics.median(samples[False]),
                "cpu_us_samples": samples[False],
                "phased": {
                    "cpu_us_per_chunk": statistics.median(samples[True]),
                    "cpu_us_samples": samples[True],
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

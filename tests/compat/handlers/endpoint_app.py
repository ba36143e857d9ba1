"""The handler behind the endpoint-client tests: echo, stream, or wait to be cancelled.

A plain function that returns a generator streams (trio_worker handles a handler by what
it returns), so one handler serves every method of the reference's endpoint client.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import trio_worker


def _chunks(count: int) -> Iterator[dict[str, int]]:
    for n in range(count):
        yield {"chunk": n}


def handler(job: dict[str, Any]) -> object:
    job_input = job["input"]
    mode = job_input.get("mode", "echo")
    if mode == "stream":
        return _chunks(job_input["count"])
    if mode == "wait":
        # Runs until cancelled (check_cancelled raises once the job is stopped).
        for _ in range(60_000):
            trio_worker.check_cancelled()
            time.sleep(0.005)
    if mode == "fail":
        raise ValueError("asked to fail")
    return {"echo": job_input}


if __name__ == "__main__":
    trio_worker.start(handler)

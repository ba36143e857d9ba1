"""One job into one report (docs/design.md §5), the same in queue and local mode."""

from __future__ import annotations

import json
import math
from collections.abc import Generator
from typing import Any

import pytest
import trio

from trio_worker._config import Settings
from trio_worker._handlers import ThreadWaits
from trio_worker._lifecycle import HeldJob
from trio_worker._options import worker_options
from trio_worker._runner import JobRunner, JobSpec, ProgressTarget, current_progress


class ListChunks:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def send_chunk(self, job_id: str, body: bytes, *, retry_until: float) -> bool:
        self.bodies.append(body)
        return True


def runner(handler: Any, chunks: ListChunks, **options: Any) -> JobRunner:
    return JobRunner(
        JobSpec.from_options(worker_options(handler, **options)),
        Settings.from_environ({}, capture_logs="off"),
        chunks,
        None,
        trio.CapacityLimiter(math.inf),
        ThreadWaits(),
        shared_process=lambda: False,
    )


def gen(job: dict[str, Any]) -> Generator[object, None, None]:
    yield 1


def raises(job: dict[str, Any]) -> object:
    raise ValueError("no")


@pytest.mark.parametrize(
    "handler", [lambda job: 1, lambda job: {"error": "x"}, lambda job: {1}, gen, raises]
)
async def test_refresh_worker_marks_every_report(handler: Any) -> None:
    report = await runner(handler, ListChunks(), refresh_worker=True).run(HeldJob("j", {}))
    assert json.loads(report.body)["stopPod"] is True
    plain = await runner(handler, ListChunks()).run(HeldJob("j", {}))
    assert "stopPod" not in json.loads(plain.body)


async def test_chunks_go_to_the_sink_in_order() -> None:
    def three(job: dict[str, Any]) -> Generator[object, None, None]:
        yield from ("a", "b", "c")

    chunks = ListChunks()
    report = await runner(three, chunks, return_aggregate_stream=True).run(HeldJob("j", {}))
    assert [json.loads(body) for body in chunks.bodies] == [{"output": c} for c in "abc"]
    assert json.loads(report.body) == {"output": ["a", "b", "c"]}
    assert report.is_stream


async def test_the_progress_target_is_set_only_while_a_job_runs() -> None:
    seen: list[object] = []

    def handler(job: dict[str, Any]) -> None:
        seen.append(current_progress.get())

    job_runner = runner(handler, ListChunks())
    target = ProgressTarget(lambda job_id, body: None, trio.lowlevel.current_trio_token())
    job_runner.progress = target
    await job_runner.run(HeldJob("j", {}))
    assert seen == [target]
    assert current_progress.get() is None

"""One job into one report (docs/design.md §5), the same in queue and local mode."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any, cast

import pytest
import trio

from tests.backends import BOTH_BACKENDS, sleep_for
from trio_worker import Timings as _Timings
from trio_worker._chunk_posts import LocalChunks
from trio_worker._config import Settings
from trio_worker._options import AsyncBackend, worker_options
from trio_worker._payloads import Payloads
from trio_worker._progress_calls import ProgressTarget, current_progress
from trio_worker._runner import JobRunner, JobSpec
from trio_worker._scopes import Scopes
from trio_worker._state import HeldJob

# A handler for the backend named: sync code is the same on both, async code is the
# backend's own.
Make = Callable[[str], Any]


class ListChunks(LocalChunks):
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def take(self, job_id: str, body: bytes) -> None:
        self.bodies.append(body)


def runner(handler: Any, chunks: ListChunks, backend: str, **options: Any) -> JobRunner:
    worker = worker_options(handler, async_backend=cast("AsyncBackend", backend), **options)
    settings = Settings.from_environ({}, capture_logs="off")
    return JobRunner(
        JobSpec.from_options(worker),
        settings,
        Payloads.for_worker(settings, stop_pod=worker.refresh_worker),
        chunks,
        None,
        Scopes(_Timings()),
        shared_process=lambda: False,
    )


def gen(job: dict[str, Any]) -> Generator[object, None, None]:
    yield 1


def raises(job: dict[str, Any]) -> object:
    raise ValueError("no")


def async_returning(value: object) -> Make:
    def make(backend: str) -> Any:
        sleep = sleep_for(backend)

        async def handler(job: dict[str, Any]) -> object:
            await sleep(0)
            return value

        return handler

    return make


def async_gen(backend: str) -> Any:
    sleep = sleep_for(backend)

    async def handler(job: dict[str, Any]) -> AsyncGenerator[object, None]:
        await sleep(0)
        yield 1

    return handler


def async_raises(backend: str) -> Any:
    sleep = sleep_for(backend)

    async def handler(job: dict[str, Any]) -> object:
        await sleep(0)
        raise ValueError("no")

    return handler


def same(handler: Any) -> Make:
    return lambda backend: handler


@BOTH_BACKENDS
@pytest.mark.parametrize(
    ("make", "fails"),
    [
        pytest.param(same(lambda job: 1), False, id="sync value"),
        pytest.param(same(lambda job: {"error": "x"}), True, id="sync error"),
        pytest.param(same(lambda job: {1}), True, id="sync unserializable"),
        pytest.param(same(gen), False, id="sync gen"),
        pytest.param(same(raises), True, id="sync raises"),
        pytest.param(async_returning(1), False, id="async value"),
        pytest.param(async_returning({"error": "x"}), True, id="async error"),
        pytest.param(async_gen, False, id="async gen"),
        pytest.param(async_raises, True, id="async raises"),
    ],
)
async def test_refresh_worker_marks_every_report(backend: str, make: Make, fails: bool) -> None:
    handler = make(backend)
    report = await runner(handler, ListChunks(), backend, refresh_worker=True).run(HeldJob("j", {}))
    marked = json.loads(report.body)
    assert marked["stopPod"] is True
    assert ("error" in marked) is fails  # the report the handler meant, marked
    plain = await runner(handler, ListChunks(), backend).run(HeldJob("j", {}))
    assert "stopPod" not in json.loads(plain.body)


def three(job: dict[str, Any]) -> Generator[object, None, None]:
    yield from ("a", "b", "c")


def async_three(backend: str) -> Any:
    sleep = sleep_for(backend)

    async def handler(job: dict[str, Any]) -> AsyncGenerator[object, None]:
        for chunk in "abc":
            await sleep(0)
            yield chunk

    return handler


@BOTH_BACKENDS
@pytest.mark.parametrize("make", [same(three), async_three], ids=["sync gen", "async gen"])
async def test_chunks_go_to_the_sink_in_order(backend: str, make: Make) -> None:
    chunks = ListChunks()
    report = await runner(make(backend), chunks, backend, return_aggregate_stream=True).run(
        HeldJob("j", {})
    )
    assert [json.loads(body) for body in chunks.bodies] == [{"output": c} for c in "abc"]
    assert json.loads(report.body) == {"output": ["a", "b", "c"]}
    assert report.is_stream


@BOTH_BACKENDS
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_the_progress_target_is_set_only_while_a_job_runs(
    backend: str, is_async: bool
) -> None:
    seen: list[object] = []

    def handler(job: dict[str, Any]) -> None:
        seen.append(current_progress.get())

    async def async_handler(job: dict[str, Any]) -> None:
        await sleep_for(backend)(0)
        seen.append(current_progress.get())

    job_runner = runner(async_handler if is_async else handler, ListChunks(), backend)
    token = trio.lowlevel.current_trio_token()
    target = ProgressTarget(lambda job_id, body: None, token, token.run_sync_soon)
    job_runner.progress = target
    await job_runner.run(HeldJob("j", {}))
    assert seen == [target]
    assert current_progress.get() is None

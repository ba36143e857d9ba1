"""The real worker against the in-process fake platform, in virtual time, for the supervisor
tests (tests/test_supervisor*.py; the ``harness`` fixture is in tests/conftest.py)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import trio

import trio_worker
import trio_worker.testing
from tests.backends import sleep_for
from tests.conftest import serve_in_process
from trio_worker.testing import FakePlatform

Handler = Callable[[dict[str, Any]], Any]


class Harness:
    """The worker on *backend* (its ``async_backend``) against *platform*, in process."""

    def __init__(self, platform: FakePlatform, backend: str = "trio") -> None:
        self.platform = platform
        self.backend = backend
        self.error: BaseException | None = None
        self.finished = trio.Event()
        self._changed = trio.Event()

    def _observe(self, job: object, before: object, event: object) -> None:
        self._changed.set()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Wait for *condition*, re-checked after every job transition."""
        with trio.fail_after(60):
            while not condition():
                self._changed = trio.Event()
                await self._changed.wait()

    async def start(
        self, nursery: trio.Nursery, handler: Handler, **kwargs: Any
    ) -> trio_worker.WorkerHandle:
        kwargs.setdefault(
            "timings", trio_worker.Timings(claim_grace=3.0, report_deadline=2.0, report_budget=2.0)
        )
        observers = [self._observe, *kwargs.pop("observers", ())]

        async def run(task_status: trio.TaskStatus[trio_worker.WorkerHandle]) -> None:
            try:
                serve = serve_in_process(
                    self.platform, handler, backend=self.backend, observers=observers, **kwargs
                )
                await serve(task_status=task_status)
            except trio_worker.InitializationError as exc:
                self.error = exc
            finally:
                self.finished.set()

        handle: trio_worker.WorkerHandle = await nursery.start(run)
        return handle


def error_of(platform: FakePlatform, job_id: str) -> dict[str, Any]:
    record = platform.job(job_id)
    assert len(record.done_reports) == 1, record.done_reports
    body = record.done_reports[0]
    assert isinstance(body, dict)
    parsed = json.loads(body["error"])
    assert isinstance(parsed, dict)
    return parsed


def echo_on(backend: str) -> Callable[[dict[str, Any]], Awaitable[Any]]:
    """An async handler in *backend*'s own code: sleeps ``input.seconds``, returns its input."""
    sleep = sleep_for(backend)

    async def echo(job: dict[str, Any]) -> Any:
        await sleep(float(job["input"].get("seconds", 0)))
        return job["input"]

    return echo

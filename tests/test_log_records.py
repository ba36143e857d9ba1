"""The worker's log records carry text, never the exception they describe.

A handler that keeps records (pytest's ``caplog``, ``logging.handlers.MemoryHandler``, a
log shipper's queue) keeps their ``args``; an exception among them keeps its traceback,
and the traceback every frame of the finished run: supervisor, client, platform records.
A process that runs ``serve()`` many times grew by hundreds of MB that way. The message
text is unchanged: only what the record holds on to is.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import trio
import trio.testing

import trio_worker
from trio_worker._exceptions import TransportError
from trio_worker._platform._heartbeat import heartbeat_task
from trio_worker._platform._http import HttpResponse
from trio_worker.testing import FakePlatform, Fault

from .backends import BOTH_BACKENDS, sleep_for
from .supervisor_harness import Harness


class Keeper(logging.Handler):
    """Keeps every record, as a MemoryHandler or caplog would."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def holding_exceptions(self) -> list[str]:
        args = (
            (r, a)
            for r in self.records
            for a in (r.args if isinstance(r.args, tuple) else (r.args or {}).values())
        )
        return [f"{r.getMessage()!r} holds {a!r}" for r, a in args if isinstance(a, BaseException)]

    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@pytest.fixture
def keeper() -> Iterator[Keeper]:
    logger = logging.getLogger("trio_worker")
    handler, level = Keeper(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class Refusing:
    """An HTTP backend whose every request fails below HTTP."""

    async def exchange(
        self,
        method: str,
        requests: Sequence[tuple[str, bytes]],
        answers: list[HttpResponse] | None = None,
        *,
        max_body: int = 0,
        keep_body: int | None = None,
    ) -> list[HttpResponse]:
        raise TransportError("connection refused by 127.0.0.1:9")

    async def aclose(self) -> None:
        return None


async def test_a_failed_ping_is_logged_as_text(
    keeper: Keeper, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.move_on_after(2.5):
        await heartbeat_task(Refusing(), "http://platform/ping/w1", 1.0, lambda: ("j1",))
    failures = [m for m in keeper.messages() if m.startswith("ping failed")]
    assert len(failures) == 3
    assert "TransportError: connection refused by 127.0.0.1:9" in failures[0]
    assert keeper.holding_exceptions() == []


@BOTH_BACKENDS
async def test_take_errors_and_progress_errors_are_logged_as_text(
    backend: str, keeper: Keeper, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    harness = Harness(FakePlatform(take_hold=5.0, stop_hold=5.0), backend)
    # The drop first: on the first, fresh connection it is a failure to log (on a
    # kept-alive one it would be a stale connection, the take sent again at once).
    harness.platform.inject(Fault("take", drop=True))
    harness.platform.inject(Fault("take", status=500, times=2))

    async def handler(job: dict[str, Any]) -> object:
        trio_worker.progress_update(job, {"not json": {1, 2}})
        await sleep_for(backend)(0)
        return job["input"]

    handle = await harness.start(nursery, handler)
    job_id = harness.platform.enqueue({"n": 1})
    await harness.wait_until(lambda: harness.platform.job(job_id).status == "COMPLETED")
    handle.shutdown()
    with trio.fail_after(60):
        await harness.finished.wait()
    messages = keeper.messages()
    assert sum(m.startswith("job-take failed") for m in messages) == 3
    assert any(m.startswith(f"progress_update for job {job_id} not sent") for m in messages)
    assert keeper.holding_exceptions() == []

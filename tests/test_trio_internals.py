"""No private name of a dependency is used (docs/how-it-works.md, the asyncio backend).

The kept threads (``_backends/_handler_calls.py``) are the worker's own threads on trio's
public API, with their own record for ``check_cancelled()``; the asyncio backend's guest run
ticks as trio wrote it. Read from the source with ``ast``, so a private name hidden in a
function, under a guard or behind ``getattr`` of a literal is still seen.
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

import trio_worker
import trio_worker.testing
from tests.conftest import serve_in_process
from trio_worker._backends import _handler_calls
from trio_worker.testing import FakePlatform

from .backends import BOTH_BACKENDS

PACKAGE = Path(trio_worker.__file__).parent
DEPENDENCIES = ("trio", "httpx", "h11", "httpcore", "hypercorn", "outcome", "sniffio", "asyncio")


def _private(dotted: str) -> bool:
    """``trio._core``, ``trio.Cancelled._create``: a name past the package's own that starts
    with one underscore (dunders are Python's, not the dependency's)."""
    parts = dotted.split(".")
    return parts[0] in DEPENDENCIES and any(
        part.startswith("_") and not part.startswith("__") for part in parts[1:]
    )


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def private_uses(source: str) -> list[str]:
    """Every private name of a dependency *source* imports, reads, or asks ``getattr``
    for on one of the dependency's modules."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Attribute):
            names = [name for name in [_dotted(node)] if name is not None]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and (owner := _dotted(node.args[0])) is not None
        ):
            names = [f"{owner}.{node.args[1].value}"]
        line = getattr(node, "lineno", 0)
        found += [f"{line}: {name}" for name in names if _private(name)]
    return found


def test_the_check_sees_private_names_however_they_are_reached() -> None:
    source = """
import trio._threads
from trio._core import _run
import trio.lowlevel
def f():
    try:
        from trio._threads import PARENT_TASK_DATA
    except ImportError:
        pass
    raise trio.Cancelled._create()
    getattr(trio.lowlevel, "_private")
    trio.lowlevel.current_task().__class__
"""
    assert sorted(use.split(": ")[1] for use in private_uses(source)) == [
        "trio.Cancelled._create",
        "trio._core",
        "trio._core._run",
        "trio._threads",
        "trio._threads",
        "trio._threads.PARENT_TASK_DATA",
        "trio.lowlevel._private",
    ]


def test_no_private_name_of_a_dependency_is_used() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{use}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for use in private_uses(path.read_text(encoding="utf-8"))
    ]
    assert found == []


def test_an_asyncio_backend_worker_leaves_trios_guest_mode_as_trio_wrote_it() -> None:
    """The guest run's tick is trio's own, in the worker's run and after it."""
    import trio._core._run as trio_run  # the test looks; the package never does

    tick = trio_run.GuestState.guest_tick
    force = trio_run.Runner.force_guest_tick_asap

    async def main() -> object:
        platform = FakePlatform(take_hold=0.2)

        async def handler(job: dict[str, Any]) -> object:
            assert trio_run.GuestState.guest_tick is tick
            return job["input"]

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                handle = await nursery.start(
                    serve_in_process(platform, handler, backend="asyncio", heartbeat="off")
                )
                record = await platform.wait_for_status(platform.enqueue("hi"), "COMPLETED")
                handle.shutdown()
        return record.output

    assert trio_worker.run_asyncio_host(main) == "hi"
    assert trio_run.GuestState.guest_tick is tick
    assert trio_run.Runner.force_guest_tick_asap is force


@BOTH_BACKENDS
async def test_a_stopped_sync_handler_sees_check_cancelled_and_frees_its_slot(
    backend: str, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    platform = FakePlatform(take_hold=0.2)
    running, stopped = threading.Event(), threading.Event()

    def handler(job: dict[str, Any]) -> str:
        if job["input"] == "next":
            return "ran"
        running.set()
        while True:
            try:
                trio_worker.check_cancelled()
            except trio.Cancelled:
                stopped.set()
                raise
            threading.Event().wait(0.001)

    handle: trio_worker.WorkerHandle = await nursery.start(
        serve_in_process(platform, handler, backend=backend, heartbeat="off")
    )
    job_id = platform.enqueue("first")
    # A hang guard, not a timing claim: autojump is blind to the handler's thread.
    with trio.fail_after(3600):
        await trio.to_thread.run_sync(running.wait)
        handle.stop_job(job_id)
        await trio.to_thread.run_sync(stopped.wait)
        # Its thread returned, so its slot (concurrency 1) takes the next job.
        after = await platform.wait_for_status(platform.enqueue("next"), "COMPLETED")
    assert after.output == "ran"
    assert platform.job(job_id).status != "COMPLETED"
    nursery.cancel_scope.cancel()


async def test_an_abandoned_call_says_when_its_thread_ended() -> None:
    release = threading.Event()
    call = _handler_calls.ThreadCall(release.wait, (10,))
    with trio.move_on_after(0.001):
        await _handler_calls.run_sync(call)
    assert call.ended is not None and not call.ended.is_set()
    assert _handler_calls.calls_waited_for() == 0  # abandoned: nobody waits for it
    release.set()
    with trio.fail_after(10):
        await call.ended.wait()


@pytest.mark.parametrize("cancelled", [False, True])
async def test_the_calls_waited_for_are_counted_until_they_return_or_are_abandoned(
    cancelled: bool,
) -> None:
    release, started = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        release.wait(10)
        return "done"

    results: list[str] = []
    async with trio.open_nursery() as nursery:

        async def call() -> None:
            results.append(await _handler_calls.in_thread(work))

        nursery.start_soon(call)
        await trio.to_thread.run_sync(started.wait, 10)
        assert _handler_calls.calls_waited_for() == 1
        if cancelled:
            nursery.cancel_scope.cancel()
        else:
            release.set()
    assert _handler_calls.calls_waited_for() == 0
    assert results == ([] if cancelled else ["done"])
    release.set()

"""A trio release that renames the private names trio_worker uses for speed.

Two hooks buy CPU: trio's per-thread record of the calling task, so the worker's kept
threads are trio threads without ``trio.to_thread``'s cost per call (``_threads.py``), and
trio's guest tick, so trio's idle waits on the asyncio backend happen on the host loop
(``_guest_tick.py``). Neither is looked up at import; each is used only when found with
the shape it needs, and without it the public path runs: ``import trio_worker`` works and
jobs run, on both backends, with every promise a thread has (``check_cancelled``,
``trio.from_thread``).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import trio

import trio_worker
import trio_worker.testing
from trio_worker import _threads
from trio_worker._options import AsyncBackend
from trio_worker.testing import FakePlatform

from .backends import BOTH_BACKENDS

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(trio_worker.__file__).parent

# What a trio release might do to each name: rename it, or the module that holds it. trio's
# own code keeps the names it was written with (its functions hold their module's globals),
# as a release that renamed them would; only a lookup from outside sees the new ones.
RENAMES = {
    "threads: record renamed": "hide('trio._threads', 'PARENT_TASK_DATA')\n",
    "threads: module gone": "hide('trio._threads')\n",
    "guest tick: class renamed": "hide('trio._core._run', 'GuestState')\n",
    "guest tick: module gone": "hide('trio._core._run')\n",
}

HIDE = """
import importlib, sys, types

def hide(module, name=None):
    package, _, leaf = module.rpartition('.')
    if name is None:
        sys.modules[module] = None
        delattr(importlib.import_module(package), leaf)
        return
    real = sys.modules[module]
    seen = types.ModuleType(module)
    seen.__dict__.update({k: v for k, v in vars(real).items() if k != name})
    sys.modules[module] = seen
    setattr(importlib.import_module(package), leaf, seen)
"""

WORKER = """
import json, sys
import trio, trio.testing, trio._threads, trio._core._run
{hide}
{rename}
import trio_worker, trio_worker.testing
from trio_worker import _guest_tick, _threads
from trio_worker.testing import FakePlatform

def sync_handler(job):
    trio_worker.check_cancelled()
    return {{"sync": job["input"], "loop": trio.from_thread.run_sync(lambda: "reached")}}

async def async_handler(job):
    return {{"async": job["input"]}}

def stream(job):
    yield from range(3)

async def run_jobs(backend):
    outputs = []
    for handler in (sync_handler, async_handler, stream):
        platform = FakePlatform(take_hold=0.2)
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                handle = await nursery.start(lambda task_status: trio_worker.testing.serve(
                    handler, async_backend=backend, app=platform,
                    environ=platform.worker_env("http://platform"), heartbeat="off",
                    handle_signals=False, capture_logs="off", task_status=task_status))
                job_id = platform.enqueue({{"n": 1}})
                record = await platform.wait_for_status(job_id, "COMPLETED")
                outputs.append(record.stream or record.output)
                handle.shutdown()
    return outputs

print(json.dumps({{
    "trio": trio.run(run_jobs, "trio"),
    "asyncio": trio_worker.run_asyncio_host(run_jobs, "asyncio"),
    "private threads": _threads.trio_thread_hooks() is not None,
    "private tick": _guest_tick._trio_guest_tick is not None,
}}))
"""


def run_worker(rename: str) -> dict[str, Any]:
    # The installed package, in a process of its own: the renames happen before import.
    code = textwrap.dedent(WORKER).format(hide=HIDE, rename=rename)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


EXPECTED_OUTPUTS = [
    {"sync": {"n": 1}, "loop": "reached"},
    {"async": {"n": 1}},
    [0, 1, 2],
]


@pytest.mark.slow
@pytest.mark.parametrize("rename", list(RENAMES))
def test_import_and_jobs_work_on_the_public_path_when_a_private_name_is_renamed(
    rename: str,
) -> None:
    result = run_worker(RENAMES[rename])
    assert result["trio"] == EXPECTED_OUTPUTS
    assert result["asyncio"] == EXPECTED_OUTPUTS
    # The other hook, untouched, is still used.
    assert result["private threads"] is not rename.startswith("threads")
    assert result["private tick"] is not rename.startswith("guest tick")


@pytest.mark.slow
def test_with_todays_trio_both_hooks_are_used() -> None:
    result = run_worker("")
    assert result["trio"] == EXPECTED_OUTPUTS
    assert result["asyncio"] == EXPECTED_OUTPUTS
    assert result["private threads"] and result["private tick"]


def test_no_private_name_of_a_dependency_is_imported_at_module_level() -> None:
    """``trio._x``, ``httpx._x``, ``h11._x``, ``httpcore._x``: only inside a function,
    under a guard (an ``except ImportError`` around it), never when a module loads."""
    dependencies = ("trio", "httpx", "h11", "httpcore", "hypercorn", "outcome", "sniffio")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            private = [
                name
                for name in names
                if name.split(".")[0] in dependencies
                and any(part.startswith("_") for part in name.split(".")[1:])
            ]
            if private and not _guarded(tree, node):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {private}")
    assert found == []


def _guarded(tree: ast.Module, node: ast.stmt) -> bool:
    """Whether *node* sits in a function, inside a ``try`` that catches ImportError."""
    for parent in ast.walk(tree):
        if not isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for statement in ast.walk(parent):
            if isinstance(statement, ast.Try) and any(
                node is inner for body in statement.body for inner in ast.walk(body)
            ):
                caught = [ast.unparse(h.type) for h in statement.handlers if h.type is not None]
                if any("ImportError" in name for name in caught):
                    return True
    return False


# -- the public path of the kept threads, in this process --------------------------------


@pytest.fixture
def public_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As on a trio whose per-thread record is renamed."""
    import trio._threads as trio_threads

    seen = types.ModuleType("trio._threads")
    seen.__dict__.update({k: v for k, v in vars(trio_threads).items() if k != "PARENT_TASK_DATA"})
    monkeypatch.setitem(sys.modules, "trio._threads", seen)
    monkeypatch.setattr(trio, "_threads", seen)
    _threads.trio_thread_hooks.cache_clear()
    try:
        assert _threads.trio_thread_hooks() is None
        yield
    finally:
        _threads.trio_thread_hooks.cache_clear()


@BOTH_BACKENDS
async def test_on_the_public_path_a_stopped_sync_handler_still_sees_check_cancelled(
    backend: str, public_threads: None, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
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
        lambda task_status: trio_worker.testing.serve(
            handler,
            async_backend=cast("AsyncBackend", backend),
            app=platform,
            environ=platform.worker_env("http://platform"),
            heartbeat="off",
            handle_signals=False,
            capture_logs="off",
            task_status=task_status,
        )
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


async def test_on_the_public_path_an_abandoned_call_still_says_when_its_thread_ended(
    public_threads: None,
) -> None:
    release = threading.Event()
    call = _threads.ThreadCall(release.wait, (10,))
    with trio.move_on_after(0.001):
        await _threads.run_sync(call)
    assert call.ended is not None and not call.ended.is_set()
    release.set()
    with trio.fail_after(10):
        await call.ended.wait()

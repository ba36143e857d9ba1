"""Which loop runs the user's async code, and what code of the other family meets
(docs/design.md §2, "Which backend by default").

One rule for both forms of ``start()``: async user code runs on asyncio unless the caller
names ``async_backend``; all-sync user code runs on trio. Code of the wrong family fails
with one line naming ``async_backend``, asyncio's ``Queue``, ``Lock`` and ``Event``
included.

Here through real workers; the rule as ``_options.worker_options`` applies it is in
tests/test_options_backend_choice.py, ``Backend.explain`` in tests/test_backends_explain.py.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

import pytest
import trio
import trio.lowlevel

import trio_worker
import trio_worker.testing
from trio_worker.testing import FakePlatform, memory_network

from .backends import ASYNCIO_ONLY
from .script_worker import run_script_job

REPO = Path(__file__).resolve().parents[1]
AsyncBackend = Literal["trio", "asyncio"]  # serve()'s async_backend
WAIT = 30.0  # a safety bound on each wait; never reached when the code is right


# --- the migration guide's second step, through a real worker process -------------------

# The shape of worker-infinity-embedding's and worker-vllm's handlers: asyncio code whose
# own exceptions become an output. Run on trio, it reported trio's error text as its result.
OWN_ERRORS_AS_OUTPUT = """
import asyncio, trio_worker

QUEUE = None

def load_model():
    pass

async def handler(job):
    try:
        queue = asyncio.Queue()
        await queue.put(job["input"]["text"])
        await asyncio.sleep(0.001)
        return {"echo": await queue.get()}
    except Exception as e:
        return {"error": str(e)}

trio_worker.start(handler, initializer=load_model, init_timeout=30)
"""


@pytest.mark.slow
async def test_an_asyncio_handler_moved_to_the_keyword_form_still_runs_on_asyncio(
    tmp_path: Path,
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(OWN_ERRORS_AS_OUTPUT)
    record, status = await run_script_job(script, {"text": "hi"})
    assert (record.status, record.output) == ("COMPLETED", {"echo": "hi"})
    assert status == 0


def test_the_one_dict_and_keyword_forms_run_asyncio_code_alike_in_local_mode(
    tmp_path: Path,
) -> None:
    script = tmp_path / "worker.py"
    outputs = []
    for start in (
        "trio_worker.start(handler, initializer=load_model, init_timeout=30)",
        "trio_worker.start({'handler': handler, 'initializer': load_model})",
    ):
        script.write_text(OWN_ERRORS_AS_OUTPUT.replace(OWN_ERRORS_AS_OUTPUT.split("\n")[-2], start))
        done = subprocess.run(
            [sys.executable, str(script), "--test_input", '{"input": {"text": "hi"}}'],
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # as installed
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert outputs == [{"output": {"echo": "hi"}}] * 2


# --- code of the other family fails with one line naming the option --------------------


async def asyncio_queue(job: dict[str, Any]) -> object:
    return await asyncio.Queue().get()


async def asyncio_lock(job: dict[str, Any]) -> object:
    lock = asyncio.Lock()
    await lock.acquire()
    async with lock:  # held: this acquire has to wait
        return None


async def asyncio_event(job: dict[str, Any]) -> object:
    return await asyncio.Event().wait()


async def asyncio_sleep(job: dict[str, Any]) -> object:
    await asyncio.sleep(0)
    return None


async def asyncio_stream(job: dict[str, Any]) -> AsyncIterator[object]:
    yield 1
    await asyncio.Event().wait()


async def trio_sleep(job: dict[str, Any]) -> object:
    await trio.lowlevel.checkpoint()
    return None


async def trio_nursery(job: dict[str, Any]) -> object:
    async with trio.open_nursery():
        return None


async def trio_stream(job: dict[str, Any]) -> AsyncIterator[object]:
    yield 1
    await trio.lowlevel.checkpoint()


async def run_one_job(handler: Callable[..., Any], backend: AsyncBackend) -> tuple[str | None, str]:
    """The error type and message reported for the one job *handler* ran on *backend*, in
    process. A stream's error is the reference's plain string, which names no type."""
    platform = FakePlatform()
    job_id = platform.enqueue({})
    async with memory_network(platform) as opener, trio.open_nursery() as nursery:
        handle: trio_worker.WorkerHandle = await nursery.start(
            functools.partial(
                trio_worker.testing.serve,
                handler,
                async_backend=backend,
                environ=platform.worker_env("http://platform"),
                open_stream=opener,
                heartbeat="off",
                handle_signals=False,
                capture_logs="off",
            )
        )
        with trio.fail_after(WAIT):
            record = await platform.wait_for_status(job_id)
        handle.shutdown()
    assert record.status == "FAILED"
    assert isinstance(record.error, str)
    if record.error.startswith("handler: "):
        return None, record.error.removeprefix("handler: ").split(" \ntraceback: ")[0]
    error = json.loads(record.error)
    assert isinstance(error, dict)
    return error["error_type"], error["error_message"]


@pytest.mark.parametrize(
    "handler", [asyncio_queue, asyncio_lock, asyncio_event, asyncio_sleep, asyncio_stream]
)
async def test_asyncio_code_on_trio_fails_with_one_line_naming_the_option(
    handler: Callable[..., object],
) -> None:
    error_type, message = await run_one_job(handler, "trio")
    assert error_type == (None if handler is asyncio_stream else "trio_worker.AsyncioUnderTrio")
    assert 'async_backend="asyncio"' in message
    assert "\n" not in message


@ASYNCIO_ONLY
@pytest.mark.parametrize("handler", [trio_sleep, trio_nursery, trio_stream])
async def test_trio_code_on_asyncio_fails_with_one_line_naming_the_option(
    backend: AsyncBackend, handler: Callable[..., object]
) -> None:
    error_type, message = await run_one_job(handler, backend)
    assert error_type == (None if handler is trio_stream else "trio_worker.TrioUnderAsyncio")
    assert 'async_backend="trio"' in message
    assert "\n" not in message

"""start_app as a real process: the installed package, real signals, real exit statuses.

The worker runs ``tests/lb/lb_app.py`` with the test venv's interpreter, which has the
package installed (no PYTHONPATH), under the crash watchdog as in production.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from tests.integration.conftest import WorkerProcess, kill_all, open_worker

pytestmark = pytest.mark.slow

APP = Path(__file__).with_name("lb_app.py")
_PORT_LINE = re.compile(r"the app on port (\d+)")


def env(**overrides: str) -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RUNPOD_", "PORT", "LB_")) and k != "PYTHONPATH"
    }
    return {**base, "PORT": "0", "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": "true", **overrides}


async def start(nursery: trio.Nursery, **overrides: str) -> tuple[WorkerProcess, str]:
    worker = await open_worker(nursery, [sys.executable, str(APP)], env(**overrides), APP.parent)
    await worker.until_output("the app on port")
    match = _PORT_LINE.search(worker.output)
    assert match is not None
    return worker, f"http://127.0.0.1:{match.group(1)}"


async def get(url: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.get(url)


async def test_sigterm_drains_runs_the_lifespan_shutdown_and_exits_0(
    nursery: trio.Nursery,
) -> None:
    worker, url = await start(nursery, LB_SLOW_S="0.3")
    try:
        await worker.until_output("/ping answers 200")
        assert (await get(url + "/ping")).status_code == 200
        answers: list[int] = []
        done = trio.Event()

        async def slow() -> None:
            answers.append((await get(url + "/slow")).status_code)
            done.set()

        nursery.start_soon(slow)
        await worker.until_output("slow request started")
        worker.signal(signal.SIGTERM)
        await worker.until_output("shutting down")
        assert (await get(url + "/ping")).status_code == 503
        await done.wait()
        assert answers == [200]  # in flight at SIGTERM, finished within the grace
        assert await worker.wait() == 0
        assert "lifespan shutdown ran" in worker.output
    finally:
        await kill_all([worker])


async def test_on_asyncio_a_request_the_grace_cuts_gets_503_and_the_exit_is_0(
    nursery: trio.Nursery,
) -> None:
    worker, url = await start(nursery, LB_SLOW_S="60", LB_GRACE_S="0.2")
    try:
        await worker.until_output("/ping answers 200")
        answers: list[httpx.Response] = []
        done = trio.Event()

        async def slow() -> None:
            answers.append(await get(url + "/slow"))
            done.set()

        nursery.start_soon(slow)
        await worker.until_output("slow request started")
        worker.signal(signal.SIGTERM)
        await done.wait()
        assert answers[0].status_code == 503
        assert answers[0].json()["status"] == "draining"
        assert await worker.wait() == 0
        assert "1 request(s) still running" in worker.output
    finally:
        await kill_all([worker])


async def test_a_failed_load_is_logged_once_and_exits_1(nursery: trio.Nursery) -> None:
    # Held long enough that a loaded machine still reads the 503 before the exit.
    worker, url = await start(nursery, LB_LOAD="fail", LB_FAILURE_HOLD_S="3")
    try:
        await worker.until_output("the model failed to load")
        answer = await get(url + "/ping")
        assert answer.status_code == 503
        assert answer.json()["error_category"] == "cuda_error"
        assert "loading weights" not in answer.text  # the output tail stays in the log
        assert await worker.wait() == 1
        assert worker.output.count("the model failed to load") == 1
        assert "loading weights from /models/x" in worker.output
    finally:
        await kill_all([worker])


async def test_a_load_that_swallows_its_cancellation_still_times_out_and_exits_1(
    nursery: trio.Nursery,
) -> None:
    worker, _ = await start(nursery, LB_LOAD="stubborn", LB_INIT_TIMEOUT="0.3")
    try:
        await worker.until_output("the model failed to load")
        assert await worker.wait() == 1
        assert "(timeout): InitTimeout" in worker.output
        assert "cancellation swallowed" in worker.output
    finally:
        await kill_all([worker])


@pytest.mark.parametrize("where", ["load", "request"])
async def test_a_process_killed_by_a_signal_is_explained_by_the_watchdog(
    nursery: trio.Nursery, where: str
) -> None:
    overrides = {"LB_LOAD": "segv"} if where == "load" else {}
    worker, url = await start(nursery, **overrides)
    try:
        if where == "request":
            await worker.until_output("/ping answers 200")
            with pytest.raises(httpx.HTTPError):
                await get(url + "/crash")
        assert await worker.wait() == 128 + signal.SIGSEGV
        assert re.search(r"killed by SIGSEGV .*\(segfault\)", worker.output)
        last = "about to touch the GPU" if where == "load" else "segfaulting now"
        assert "its last output:\n" in worker.output and last in worker.output
    finally:
        await kill_all([worker])


def test_a_port_in_use_is_one_line_and_status_2() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, str(APP)],
            env=env(PORT=str(port)),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert f"cannot serve on port {port}" in done.stderr

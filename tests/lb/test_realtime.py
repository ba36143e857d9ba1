"""runpod's realtime mode: ``start(handler)`` with ``RUNPOD_REALTIME_PORT`` set.

The worker is a real process (the installed package, no PYTHONPATH); the shapes are
runpod 1.12's ``rp_fastapi.WorkerAPI._realtime``: a job ``{"id", "input"}`` in, 422
without either, ``{"output": ...}`` or ``{"error": "..."}`` out.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
from pathlib import Path

import httpx
import pytest
import trio

from tests.integration.conftest import WorkerProcess, kill_all, open_worker
from tests.lb.test_process import env

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("realtime_worker.py")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def start(nursery: trio.Nursery, concurrency: int) -> tuple[WorkerProcess, str]:
    port = free_port()
    overrides = {
        "RUNPOD_REALTIME_PORT": str(port),
        "RUNPOD_REALTIME_CONCURRENCY": str(concurrency),
        "RUNPOD_ENDPOINT_ID": "ep1",
    }
    worker = await open_worker(nursery, [sys.executable, str(WORKER)], env(**overrides))
    await worker.until_output("/ping answers 200")
    return worker, f"http://127.0.0.1:{port}"


async def test_a_job_in_the_handlers_result_out(nursery: trio.Nursery) -> None:
    worker, url = await start(nursery, concurrency=1)
    try:
        assert "model loaded" in worker.output
        async with httpx.AsyncClient(timeout=10) as client:
            assert (await client.get(url + "/ping")).status_code == 200
            done = await client.post(url + "/ep1/realtime", json={"id": "j1", "input": {"a": 1}})
            failed = await client.post(
                url + "/ep1/realtime", json={"id": "j2", "input": {"fail": 1}}
            )
            missing = await client.post(url + "/ep1/realtime", json={"id": "j3"})
            elsewhere = await client.post(url + "/other/realtime", json={"id": "j4", "input": {}})
        assert done.status_code == 200
        assert done.json() == {"output": {"echo": {"a": 1}, "running": 1}}
        assert failed.status_code == 200
        error = json.loads(failed.json()["error"])
        assert error["error_type"] == "ValueError" and error["error_message"] == "bad prompt"
        assert missing.status_code == 422
        assert missing.json()["detail"][0]["loc"] == ["body", "input"]
        assert elsewhere.status_code == 404
        worker.signal(signal.SIGTERM)
        assert await worker.wait() == 0
    finally:
        await kill_all([worker])


@pytest.mark.parametrize("concurrency", [1, 2])
async def test_realtime_concurrency_is_honoured(nursery: trio.Nursery, concurrency: int) -> None:
    worker, url = await start(nursery, concurrency=concurrency)
    seen: list[int] = []
    try:
        async with httpx.AsyncClient(timeout=20) as client:

            async def one(n: int) -> None:
                job = {"id": f"j{n}", "input": {"hold": 0.2}}
                answer = await client.post(url + "/ep1/realtime", json=job)
                seen.append(answer.json()["output"]["running"])

            async with trio.open_nursery() as jobs:
                for n in range(4):
                    jobs.start_soon(one, n)
        assert max(seen) == concurrency
    finally:
        await kill_all([worker])


async def test_a_handler_that_exits_is_answered_then_the_worker_exits_with_its_status(
    nursery: trio.Nursery,
) -> None:
    worker, url = await start(nursery, concurrency=1)
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await client.post(
                url + "/ep1/realtime", json={"id": "j1", "input": {"exit": 3}}
            )
        assert answer.status_code == 200
        assert json.loads(answer.json()["error"])["error_type"] == "SystemExit"
        assert await worker.wait() == 3
    finally:
        await kill_all([worker])

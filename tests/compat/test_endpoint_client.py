"""The reference's own endpoint clients against trio_worker's local endpoint.

``python handler.py --rp_serve_api`` runs the local endpoint with a real worker taking
from it over loopback; ``runpod.Endpoint`` (requests) and the asyncio client
(``runpod.endpoint.asyncio``, aiohttp) are pointed at it through ``runpod.endpoint_url_base``
and driven through every method they have.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import IO, Any

import pytest
import runpod

from .conftest import HANDLERS

pytestmark = pytest.mark.slow

ENDPOINT_ID = "local-ep"
BOUND = 60  # seconds; a safety bound on a hung server, never reached when things work


@pytest.fixture(scope="module")
def endpoint_url() -> Iterator[str]:
    """The dev server's ``/v2`` base URL, as ``runpod.endpoint_url_base`` expects it."""
    # The installed package, as a user's process finds it: no checkout on PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "PYTHONPATH"))}
    process = subprocess.Popen(
        [
            sys.executable,
            str(HANDLERS / "endpoint_app.py"),
            "--rp_serve_api",
            "--rp_api_host",
            "127.0.0.1",
            "--rp_api_port",
            "0",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    found: list[str] = []
    ready = threading.Event()
    # Drained to the end, so a chatty server never blocks on a full pipe.
    reader = threading.Thread(target=_drain, args=(process.stdout, found, ready), daemon=True)
    reader.start()
    try:
        ready.wait(BOUND)
        assert found, "the local endpoint never printed its URL"
        yield f"{found[0]}/v2"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(BOUND)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        reader.join(BOUND)
        process.stdout.close()


def _drain(stdout: IO[str], found: list[str], ready: threading.Event) -> None:
    for line in stdout:
        if not found and "local endpoint:" in line:
            found.append(line.split("local endpoint:", 1)[1].strip())
            ready.set()
    ready.set()


@pytest.fixture
def endpoint(endpoint_url: str, monkeypatch: pytest.MonkeyPatch) -> runpod.Endpoint:
    monkeypatch.setattr(runpod, "endpoint_url_base", endpoint_url)
    monkeypatch.setattr(runpod, "api_key", "local-key")
    return runpod.Endpoint(ENDPOINT_ID)


# --- runpod.Endpoint ------------------------------------------------------------------------


def test_run_then_status_and_output(endpoint: runpod.Endpoint) -> None:
    job = endpoint.run({"prompt": "hi"})
    assert job.status() in ("IN_QUEUE", "IN_PROGRESS", "COMPLETED")
    assert job.output(timeout=BOUND) == {"echo": {"prompt": "hi"}}
    assert job.status() == "COMPLETED"


def test_run_sync_returns_the_output(endpoint: runpod.Endpoint) -> None:
    assert endpoint.run_sync({"prompt": "sync"}, timeout=BOUND) == {"echo": {"prompt": "sync"}}


def test_run_sync_of_a_failing_job_returns_no_output(endpoint: runpod.Endpoint) -> None:
    # The reference client returns the answer's "output": a failed job has none.
    assert endpoint.run_sync({"mode": "fail"}, timeout=BOUND) is None


def test_stream_yields_every_chunk_in_order(endpoint: runpod.Endpoint) -> None:
    job = endpoint.run({"mode": "stream", "count": 4})
    assert list(job.stream()) == [{"chunk": n} for n in range(4)]


def test_cancel_stops_a_running_job(endpoint: runpod.Endpoint) -> None:
    job = endpoint.run({"mode": "wait"})
    answer = job.cancel(timeout=BOUND)
    assert answer["id"] == job.job_id
    assert answer["status"] == "CANCELLED"
    assert job.status() == "CANCELLED"
    # The worker is free again: the next job completes.
    assert endpoint.run_sync({"after": "cancel"}, timeout=BOUND) == {"echo": {"after": "cancel"}}


def test_health_counts_jobs_and_workers(endpoint: runpod.Endpoint) -> None:
    endpoint.run_sync({"for": "health"}, timeout=BOUND)
    health = endpoint.health(timeout=BOUND)
    assert health["jobs"]["completed"] >= 1
    assert set(health["jobs"]) >= {"completed", "failed", "inProgress", "inQueue", "retried"}
    assert set(health["workers"]) >= {"idle", "running"}


def test_purge_queue_removes_the_queued_jobs(endpoint: runpod.Endpoint) -> None:
    blocker = endpoint.run({"mode": "wait"})
    queued = [endpoint.run({"n": n}) for n in range(3)]
    answer = endpoint.purge_queue(timeout=BOUND)
    assert answer["removed"] >= 2  # the blocker may not have been taken yet
    blocker.cancel(timeout=BOUND)
    assert all(job.status() in ("CANCELLED", "COMPLETED") for job in queued)


# --- the asyncio client ---------------------------------------------------------------------


async def _asyncio_client_session(base: str) -> dict[str, Any]:
    import aiohttp
    from runpod.endpoint.asyncio.asyncio_runner import Endpoint as AsyncEndpoint

    runpod.endpoint_url_base = base
    runpod.api_key = "local-key"
    async with aiohttp.ClientSession() as session:
        endpoint = AsyncEndpoint(ENDPOINT_ID, session)
        results: dict[str, Any] = {}
        job = await endpoint.run({"prompt": "async"})
        results["status"] = await job.status()
        results["output"] = await job.output(timeout=BOUND)
        streaming = await endpoint.run({"mode": "stream", "count": 3})
        results["stream"] = [chunk async for chunk in streaming.stream()]
        waiting = await endpoint.run({"mode": "wait"})
        results["cancel"] = await waiting.cancel()
        results["cancelled_status"] = await waiting.status()
        results["health"] = await endpoint.health()
        results["purge"] = await endpoint.purge_queue()
        return results


def test_the_asyncio_client_through_every_method(
    endpoint_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runpod, "endpoint_url_base", endpoint_url)
    monkeypatch.setattr(runpod, "api_key", "local-key")
    results = asyncio.run(asyncio.wait_for(_asyncio_client_session(endpoint_url), BOUND))
    assert results["status"] in ("IN_QUEUE", "IN_PROGRESS", "COMPLETED")
    assert results["output"] == {"echo": {"prompt": "async"}}
    assert results["stream"] == [{"chunk": n} for n in range(3)]
    assert results["cancel"]["status"] == "CANCELLED"
    assert results["cancelled_status"] == "CANCELLED"
    assert "jobs" in results["health"] and "workers" in results["health"]
    assert results["purge"]["removed"] == 0

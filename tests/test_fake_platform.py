"""The fake platform: the endpoint API, its Python API, and over real loopback HTTP.

Most tests drive the app in-process through ``httpx.ASGITransport`` in virtual time (the
``autojump_clock`` fixture), so long-polls and deadlines are checked to the exact virtual
second with no real waiting. The worker routes are tested in
tests/test_fake_platform_take_and_stop.py, tests/test_fake_platform_reports.py and
tests/test_fake_platform_faults.py.
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from tests.fake_platform_client import (
    EP,
    FORM,
    TAKE,
    asgi_client,
    batch,
    done_url,
    ping_url,
    report,
    take_one,
)
from trio_worker.testing import (
    FakePlatform,
    run_platform_server,
)
from trio_worker.testing._http_server import serve_asgi

if TYPE_CHECKING:
    from trio.testing import MockClock

    from trio_worker.testing import JobRecord
    from trio_worker.testing._http_server import Receive, Scope, Send

pytestmark = pytest.mark.timeout(20)


# -- the endpoint API ----------------------------------------------------------------------


async def test_run_status_and_health(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    async with asgi_client(platform) as client:
        queued = (await client.post("/run", json={"input": {"q": 1}, "s3Config": "w"})).json()
        job_id = queued["id"]
        assert queued == {"id": job_id, "status": "IN_QUEUE"}
        assert (await client.get(f"/status/{job_id}")).json()["status"] == "IN_QUEUE"
        await trio.sleep(2.0)
        job = await take_one(client)
        in_progress = (await client.get(f"{EP}/status/{job_id}")).json()
        health_busy = (await client.get("/health")).json()
        await trio.sleep(0.5)
        await report(client, job_id, {"output": "answer"})
        done = (await client.get(f"/status/{job_id}")).json()
        health = (await client.get("/health")).json()
        missing = await client.get("/status/nope")
    assert job == {"id": job_id, "input": {"q": 1}, "s3Config": "w"}
    assert in_progress["status"] == "IN_PROGRESS"
    assert in_progress["workerId"] == "w1"
    assert health_busy["workers"] == {"running": 1, "idle": 0}
    assert health_busy["jobs"]["inProgress"] == 1
    assert done == {
        "id": job_id,
        "status": "COMPLETED",
        "delayTime": 2000,
        "executionTime": 500,
        "workerId": "w1",
        "output": "answer",
    }
    assert health["jobs"]["completed"] == 1
    assert health["jobs"]["inQueue"] == 0
    assert health["workers"] == {"running": 0, "idle": 1}
    assert missing.status_code == 404


async def test_failed_status_carries_the_error(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    async with asgi_client(platform) as client:
        job_id = (await client.post(f"{EP}/run", json={"input": {}})).json()["id"]
        await client.get(TAKE)
        await report(client, job_id, {"error": "it broke"})
        status = (await client.get(f"/status/{job_id}")).json()
    assert status["status"] == "FAILED"
    assert status["error"] == "it broke"
    assert "output" not in status


async def test_run_rejects_bodies_without_input(autojump_clock: MockClock) -> None:
    platform = FakePlatform()
    async with asgi_client(platform) as client:
        assert (await client.post("/run", json={"nope": 1})).status_code == 400
        assert (await client.post("/run", content=b"[not json")).status_code == 400
        assert (await client.get("/run")).status_code == 405
    assert platform.jobs == {}


async def test_cancel_and_purge_queue(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    async with asgi_client(platform) as client:
        ids = [(await client.post("/run", json={"input": {"n": n}})).json()["id"] for n in range(4)]
        cancelled = (await client.post(f"/cancel/{ids[0]}")).json()
        purged = (await client.post("/purge-queue")).json()
        health = (await client.get("/health")).json()
        empty = await client.get(TAKE)
    assert cancelled == {"id": ids[0], "status": "CANCELLED"}
    assert purged == {"removed": 3, "status": "completed"}
    assert health["jobs"]["inQueue"] == 0
    assert health["jobs"]["cancelled"] == 4
    assert empty.status_code == 204


async def test_runsync_waits_for_the_result(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=10.0)
    async with asgi_client(platform) as client, trio.open_nursery() as nursery:

        async def worker() -> None:
            job = await take_one(client)
            await trio.sleep(3.0)
            await report(client, str(job["id"]), {"output": "synced"})

        nursery.start_soon(worker)
        start = trio.current_time()
        answer = (await client.post("/runsync", json={"input": {"x": 1}})).json()
    assert trio.current_time() - start == 3.0
    assert answer["status"] == "COMPLETED"
    assert answer["output"] == "synced"


async def test_runsync_gives_up_after_its_bound(autojump_clock: MockClock) -> None:
    platform = FakePlatform(runsync_wait=60.0)
    async with asgi_client(platform) as client:
        start = trio.current_time()
        answer = (await client.post("/runsync?wait=2500", json={"input": {"x": 1}})).json()
    assert trio.current_time() - start == 2.5
    assert answer["status"] == "IN_QUEUE"


# -- the Python API ------------------------------------------------------------------------


async def test_waiters_wake_on_the_right_event(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    job_id = platform.enqueue("x")
    woke: dict[str, float] = {}
    async with asgi_client(platform) as client, trio.open_nursery() as nursery:

        async def wait_done() -> None:
            record: JobRecord = await platform.wait_for_status(job_id)
            woke["done"] = trio.current_time()
            assert record.status == "COMPLETED"

        async def wait_pings() -> None:
            await platform.wait_for_requests("ping", 2)
            woke["pings"] = trio.current_time()

        nursery.start_soon(wait_done)
        nursery.start_soon(wait_pings)
        start = trio.current_time()
        await client.get(TAKE)
        for _ in range(2):
            await trio.sleep(1.0)
            await client.get(ping_url(job_id))
        await trio.sleep(1.0)
        await report(client, job_id, {"output": 1})
    assert woke == {"pings": start + 2.0, "done": start + 3.0}


def test_testing_all_lists_exactly_the_public_names() -> None:
    import trio_worker.testing as testing

    public = {name for name in vars(testing) if not name.startswith("_")} - {"annotations"}
    assert set(testing.__all__) == public
    assert FakePlatform.__module__ == "trio_worker.testing"


def test_enqueue_rejects_duplicate_ids_and_works_outside_trio() -> None:
    platform = FakePlatform()
    assert platform.enqueue("x", job_id="fixed") == "fixed"
    with pytest.raises(ValueError):
        platform.enqueue("y", job_id="fixed")
    assert platform.job("fixed").enqueue_time is None  # no trio clock yet
    assert platform.statistics().in_queue == 1
    with pytest.raises(ValueError):
        FakePlatform(requeue_after=0)


async def test_worker_env_urls_route_to_the_platform(autojump_clock: MockClock) -> None:
    platform = FakePlatform(api_key="k", take_hold=0, endpoint_id="my-ep")
    env = platform.worker_env("http://platform/", worker_id="pod-7", ping_interval_ms=2000)
    assert env["RUNPOD_AI_API_KEY"] == "k"
    assert env["RUNPOD_POD_ID"] == "pod-7"
    assert env["RUNPOD_PING_INTERVAL"] == "2000"
    job_id = platform.enqueue("x")

    def fill(template: str) -> str:  # the reference SDK's substitutions (docs/protocol.md §1.5)
        return template.replace("$RUNPOD_POD_ID", "pod-7").replace("$ID", job_id)

    take = env["RUNPOD_WEBHOOK_GET_JOB"].replace("$ID", "pod-7") + "&job_in_progress=0"
    async with asgi_client(platform, {"Authorization": "k"}) as client:
        assert (await client.get(take)).json()["id"] == job_id
        stream = fill(env["RUNPOD_WEBHOOK_POST_STREAM"]) + "&isStream=false"
        assert (await client.post(stream, content=b'{"output": 1}')).status_code == 200
        done = fill(env["RUNPOD_WEBHOOK_POST_OUTPUT"]) + "&isStream=false"
        assert (await client.post(done, content=b'{"output": 2}')).status_code == 200
        ping = fill(env["RUNPOD_WEBHOOK_PING"])
        assert (await client.get(ping, params={"job_id": job_id})).status_code == 200
    assert [r.route for r in platform.requests] == ["take", "stream", "done", "ping"]
    assert platform.job(job_id).output == 2
    assert platform.pings[0].worker == "pod-7"


async def test_stats_route_reports_timings(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    ids = [platform.enqueue(n) for n in range(2)]
    async with asgi_client(platform) as client:
        for job_id in ids:
            await client.get(TAKE)
            await trio.sleep(0.25)
            await report(client, job_id, {"output": 1})
        stats = (await client.get("/_stats")).json()
    assert stats["statistics"]["completed"] == 2
    assert stats["summary"]["finished"] == 2
    assert stats["summary"]["jobs_per_second"] == 4.0
    assert stats["summary"]["take_to_done_ms"]["p50"] == 250.0
    assert [job["done_time"] - job["take_time"] for job in stats["jobs"]] == [0.25, 0.25]


# -- over real loopback --------------------------------------------------------------------


async def test_take_and_done_over_loopback() -> None:
    platform = FakePlatform(api_key="k", take_hold=0.5)
    job_id = platform.enqueue({"n": 1})
    async with run_platform_server(platform) as url:
        env = platform.worker_env(url)
        take = env["RUNPOD_WEBHOOK_GET_JOB"].replace("$ID", "w1") + "&job_in_progress=0"
        done = env["RUNPOD_WEBHOOK_POST_OUTPUT"].replace("$RUNPOD_POD_ID", "w1")
        async with httpx.AsyncClient(headers={"Authorization": "k"}) as client:
            job = (await client.get(take)).json()
            response = await client.post(
                done.replace("$ID", job["id"]) + "&isStream=false",
                content=b'{"output": {"n": 2}}',
                headers=FORM,
            )
            with trio.fail_after(5):
                record = await platform.wait_for_status(job_id)
    assert job == {"id": job_id, "input": {"n": 1}}
    assert response.status_code == 200
    assert record.status == "COMPLETED"
    assert record.output == {"n": 2}


async def test_disconnected_take_over_loopback_keeps_the_job(nursery: trio.Nursery) -> None:
    platform = FakePlatform(take_hold=60.0)
    answered = trio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await platform(scope, receive, send)
        finally:
            answered.set()  # the platform has finished with the request, one way or another

    port = await nursery.start(serve_asgi, app)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        with trio.fail_after(5):
            async with trio.open_nursery() as inner:
                inner.start_soon(client.get, TAKE)
                await platform.wait_for_requests("take", 1)
                inner.cancel_scope.cancel()  # the worker closes its long-poll
            await answered.wait()  # the server noticed the disconnect and ended the hold
        assert platform.statistics().takes_waiting == 0
        job_id = platform.enqueue("must not be lost")
        job = (await client.get(TAKE)).json()
    assert job["id"] == job_id
    assert platform.job(job_id).takes == 1
    assert platform.requests[0].status is None


def test_cli_serves_preloaded_jobs_and_stats() -> None:
    # The installed package (the test venv has it), not the checkout on PYTHONPATH.
    command = [sys.executable, "-m", "trio_worker.testing", "--port", "0", "--preload", "3"]
    with subprocess.Popen(
        [*command, "--take-hold", "0"], stdout=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None
            url = process.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:")
            with httpx.Client(base_url=url, timeout=10) as client:
                jobs = client.get(batch(5)).json()
                for job in jobs:
                    client.post(done_url(job["id"]), content=b'{"output": null}')
                stats = client.get("/_stats").json()
        finally:
            process.terminate()
            process.wait(timeout=10)
    assert process.returncode == 0
    assert [job["input"] for job in jobs] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert stats["statistics"]["completed"] == 3
    assert all(job["take_time"] <= job["done_time"] for job in stats["jobs"])

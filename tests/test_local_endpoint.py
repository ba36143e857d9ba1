"""The local endpoint applies the platform's rules (docs/protocol.md §4.1).

Refusals before queueing, the 90 s ``/runsync`` wait, body limits, execution timeouts,
result expiry and the finished-job cap run in-process in virtual time; webhooks run both
in virtual time (exact retry timing) and over real loopback HTTP.
"""

from __future__ import annotations

import json
import re
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from trio_worker._endpoint._rules import (
    RUN_BODY_LIMIT,
    RUN_RESULT_TTL,
    RUNSYNC_RESULT_TTL,
)
from trio_worker.testing import FakePlatform, run_platform_server
from trio_worker.testing._http_server import serve_asgi

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio.testing import MockClock

    from trio_worker.testing._http_server import Receive, Scope, Send

pytestmark = pytest.mark.timeout(30)

EP = "/v2/ep"
TAKE = f"{EP}/job-take/w1?gpu=x"
STOP = f"{EP}/job-stop/w1?gpu=x"


def done_url(job_id: str) -> str:
    return f"{EP}/job-done/w1/{job_id}?gpu=x&isStream=false"


@asynccontextmanager
async def client_of(platform: FakePlatform) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=platform)
    async with httpx.AsyncClient(transport=transport, base_url="http://platform") as client:
        yield client


async def finish(client: httpx.AsyncClient, body: object) -> str:
    """Take the next job as worker w1 and report *body* for it; its id."""
    job = (await client.get(TAKE)).json()
    await client.post(done_url(job["id"]), content=json.dumps(body))
    return str(job["id"])


# -- refused before anything is queued ---------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/run", {"input": "text"}, '"input" must be a JSON object, not a string'),
        ("/run", {"input": [1]}, "not an array"),
        ("/run", {"input": None}, "not null"),
        ("/runsync", {"input": 3}, "not a number"),
        ("/run", {"prompt": "x"}, 'with an "input" key'),
        ("/run", [{"input": {}}], 'with an "input" key'),
        ("/run", {"input": {}, "webhook": "ftp://x"}, '"webhook" must be'),
        ("/run", {"input": {}, "webhook": 7}, '"webhook" must be'),
        ("/run", {"input": {}, "policy": []}, '"policy" must be'),
        ("/run", {"input": {}, "policy": {"executionTimeout": 5000}}, "above 5000"),
        ("/run", {"input": {}, "policy": {"executionTimeout": "9000"}}, "above 5000"),
        ("/run", {"input": {}, "policy": {"ttl": 5}}, "policy.ttl"),
        ("/run", {"input": {}, "policy": {"lowPriority": "yes"}}, "lowPriority"),
        ("/runsync?wait=abc", {"input": {}}, "wait must be"),
        ("/runsync?wait=999", {"input": {}}, "wait must be"),
        ("/runsync?wait=300001", {"input": {}}, "wait must be"),
    ],
)
async def test_bad_requests_are_refused_with_400_and_queue_nothing(
    autojump_clock: MockClock, path: str, body: object, words: str
) -> None:
    platform = FakePlatform()
    async with client_of(platform) as client:
        response = await client.post(path, json=body)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert list(response.json()) == ["error"]
    assert words in response.json()["error"]
    assert platform.jobs == {}
    assert platform.statistics().in_queue == 0


async def test_runsync_waits_90_seconds_by_default(autojump_clock: MockClock) -> None:
    platform = FakePlatform()
    async with client_of(platform) as client:
        start = trio.current_time()
        answer = (await client.post("/runsync", json={"input": {}})).json()
    assert trio.current_time() - start == 90.0
    assert answer["status"] == "IN_QUEUE"


async def test_bodies_past_the_limit_get_413_and_queue_nothing(autojump_clock: MockClock) -> None:
    platform = FakePlatform()
    filler = "x" * (RUN_BODY_LIMIT - 20)
    async with client_of(platform) as client:
        fits = await client.post("/run", json={"input": {"a": filler[:-100]}})
        too_big = await client.post("/run", json={"input": {"a": filler + "y" * 30}})
        synced = await client.post(
            "/runsync?wait=1000", json={"input": {"a": filler * 2 + "y" * 100}}
        )
        status = await client.post("/status/x", content=b"{" * 100_000)
    assert fits.status_code == 200
    assert too_big.status_code == 413
    assert too_big.json() == {"error": f"request body larger than {RUN_BODY_LIMIT} bytes"}
    assert synced.status_code == 413  # 20 MiB for /runsync
    assert status.status_code == 413
    assert len(platform.jobs) == 1


# The 413 is answered on the head, before the body is read (a declared size past the
# limit): httpx then leaves its unfinished body iterator to the garbage collector.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_413_reaches_a_real_client_over_loopback() -> None:
    platform = FakePlatform()
    async with (
        run_platform_server(platform) as url,
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        big = await client.post("/run", content=b'{"input": {"a": "' + b"x" * RUN_BODY_LIMIT)
        after = await client.post("/run", json={"input": {"a": 1}})
    assert big.status_code == 413
    assert "error" in big.json()
    assert after.status_code == 200


# -- execution timeout ---------------------------------------------------------------------


async def test_execution_timeout_times_the_job_out_and_stops_its_worker(
    autojump_clock: MockClock,
) -> None:
    platform = FakePlatform(take_hold=0, stop_hold=60)
    policy = {"executionTimeout": 6000}
    async with client_of(platform) as client, trio.open_nursery() as nursery:
        await nursery.start(platform.run_requeue_checker)
        job_id = (await client.post("/run", json={"input": {}, "policy": policy})).json()["id"]
        await trio.sleep(4)
        await client.get(TAKE)
        taken = trio.current_time()
        stop = await client.get(STOP)  # held until the stop signal comes
        stopped = trio.current_time()
        status = (await client.get(f"/status/{job_id}")).json()
        late = await client.post(done_url(job_id), content=b'{"output": "late"}')
        nursery.cancel_scope.cancel()
    assert stopped - taken == 6.0
    assert stop.json() == {"jobsToStop": [job_id]}
    assert status == {
        "id": job_id,
        "status": "TIMED_OUT",
        "delayTime": 4000,
        "executionTime": 6000,
        "workerId": "w1",
    }
    assert late.status_code == 200
    assert platform.job(job_id).status == "TIMED_OUT"
    assert platform.statistics().timed_out == 1


async def test_default_execution_timeout_counts_from_each_take(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0, execution_timeout=10, requeue_after=3)
    job_id = platform.enqueue({})
    async with client_of(platform) as client, trio.open_nursery() as nursery:
        await nursery.start(platform.run_requeue_checker)
        await client.get(TAKE)  # never pinged: requeued after 3 s
        await platform.wait_for_status(job_id, "IN_QUEUE")
        await trio.sleep(5)
        await client.get(TAKE)
        retaken = trio.current_time()

        async def keep_listing() -> None:
            while True:
                await client.get(f"{EP}/ping/w1?gpu=x&job_id={job_id}")
                await trio.sleep(1)

        nursery.start_soon(keep_listing)
        record = await platform.wait_for_status(job_id)
        nursery.cancel_scope.cancel()
    assert record.status == "TIMED_OUT"
    assert record.done_time == retaken + 10  # the first take's deadline was dropped


async def test_a_job_finished_in_time_is_not_timed_out(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0, execution_timeout=10)
    async with client_of(platform) as client, trio.open_nursery() as nursery:
        await nursery.start(platform.run_requeue_checker)
        await client.post("/run", json={"input": {}})
        job_id = await finish(client, {"output": 1})
        await trio.sleep(20)
        nursery.cancel_scope.cancel()
    assert platform.job(job_id).status == "COMPLETED"


# -- retention -----------------------------------------------------------------------------


async def test_run_results_expire_after_30_minutes_runsync_after_1(
    autojump_clock: MockClock,
) -> None:
    platform = FakePlatform(take_hold=5, expire_results=True)
    async with client_of(platform) as client, trio.open_nursery() as nursery:
        await nursery.start(platform.run_requeue_checker)
        await client.post("/run", json={"input": {}})
        run_id = await finish(client, {"output": 1})
        nursery.start_soon(partial(client.post, "/runsync", json={"input": {}}))
        sync_id = await finish(client, {"output": 2})
        await trio.sleep(RUNSYNC_RESULT_TTL - 0.001)
        assert (await client.get(f"/status/{sync_id}")).status_code == 200
        await trio.sleep(0.001)
        sync_gone = await client.get(f"/status/{sync_id}")
        await trio.sleep(RUN_RESULT_TTL - RUNSYNC_RESULT_TTL - 0.001)
        assert (await client.get(f"/status/{run_id}")).status_code == 200
        await trio.sleep(0.001)
        run_gone = await client.get(f"/stream/{run_id}")
        nursery.cancel_scope.cancel()
    assert sync_gone.status_code == 404
    assert run_gone.status_code == 404
    assert platform.jobs == {}


async def test_runsync_wait_lengthens_the_result_lifetime(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=5, expire_results=True)
    async with client_of(platform) as client, trio.open_nursery() as nursery:
        nursery.start_soon(partial(client.post, "/runsync?wait=120000", json={"input": {}}))
        job_id = await finish(client, {"output": 2})
        await trio.sleep(119)
        kept = await client.get(f"/status/{job_id}")
        await trio.sleep(1)
        gone = await client.get(f"/status/{job_id}")
    assert (kept.status_code, gone.status_code) == (200, 404)


async def test_only_the_newest_finished_jobs_are_kept(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0, max_finished=3)
    async with client_of(platform) as client:
        for n in range(5):
            await client.post("/run", json={"input": {"n": n}})
        ids = [await finish(client, {"output": n}) for n in range(4)]
        codes = [(await client.get(f"/status/{i}")).status_code for i in ids]
        queued = next(i for i in platform.jobs if i not in ids)
        await client.post(f"/cancel/{queued}")
        first_kept = await client.get(f"/status/{ids[1]}")
    assert codes == [404, 200, 200, 200]
    assert first_kept.status_code == 404  # the cancel finished a fifth job
    assert len(platform.jobs) == 3


# -- webhooks ------------------------------------------------------------------------------


class Receiver:
    """An ASGI webhook receiver answering the given statuses in turn (then 200)."""

    def __init__(self, *statuses: int, delay: float = 0.0) -> None:
        self.statuses = list(statuses)
        self.delay = delay
        self.calls: list[tuple[float, str, bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.calls.append((trio.current_time(), scope["path"], body))
        await trio.sleep(self.delay)
        status = self.statuses.pop(0) if self.statuses else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def test_webhook_gets_the_status_object_with_two_retries_10_s_apart(
    autojump_clock: MockClock,
) -> None:
    platform = FakePlatform(take_hold=0)
    flaky, dead = Receiver(500, 503), Receiver(500, 500, 500, 500)
    receivers = {"flaky.test": flaky, "dead.test": dead}

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        host = dict(scope["headers"])[b"host"].decode()
        await receivers[host](scope, receive, send)

    def client_factory() -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=route))

    async with client_of(platform) as client, trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: platform.webhooks.run(
                client_factory=client_factory, task_status=task_status
            )
        )
        for host in receivers:
            await client.post("/run", json={"input": {}, "webhook": f"http://{host}/hook?a=1"})
        ok_id = await finish(client, {"output": {"answer": 42}})
        dead_id = await finish(client, {"error": "broke"})
        finished = trio.current_time()
        ok_call = await platform.webhooks.wait_finished(ok_id)
        dead_call = await platform.webhooks.wait_finished(dead_id)
        status = (await client.get(f"/status/{ok_id}")).json()
        nursery.cancel_scope.cancel()
    assert [t - finished for t, _, _ in flaky.calls] == [0.0, 10.0, 20.0]
    assert [t - finished for t, _, _ in dead.calls] == [0.0, 10.0, 20.0]  # 2 retries, no more
    assert all(path == "/hook" for _, path, _ in flaky.calls + dead.calls)
    assert json.loads(flaky.calls[-1][2]) == status
    assert json.loads(dead.calls[0][2])["error"] == "broke"
    assert (ok_call.attempts, ok_call.delivered) == ([500, 503, 200], True)
    assert (dead_call.attempts, dead_call.delivered) == ([500, 500, 500], False)


async def test_a_slow_webhook_delays_nothing_else(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    slow = Receiver(delay=8.0)

    def client_factory() -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=slow))

    async with client_of(platform) as client, trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: platform.webhooks.run(
                client_factory=client_factory, task_status=task_status
            )
        )
        for _ in range(2):
            await client.post("/run", json={"input": {}, "webhook": "http://slow.test/"})
        start = trio.current_time()
        first = await finish(client, {"output": 1})
        second = await finish(client, {"output": 2})
        await platform.webhooks.wait_finished(first)
        await platform.webhooks.wait_finished(second)
        nursery.cancel_scope.cancel()
    assert [t - start for t, _, _ in slow.calls] == [0.0, 0.0]


async def test_webhook_over_loopback_and_unsent_without_a_sender(nursery: trio.Nursery) -> None:
    receiver = Receiver()
    hook_port = await nursery.start(serve_asgi, receiver, "127.0.0.1", 0)
    hook = f"http://127.0.0.1:{hook_port}/done"
    platform = FakePlatform(take_hold=0)
    async with (
        run_platform_server(platform) as url,
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        await client.post("/run", json={"input": {"q": 1}, "webhook": hook})
        job_id = await finish(client, {"output": "fine"})
        with trio.fail_after(10):
            call = await platform.webhooks.wait_finished(job_id)
    assert call.delivered is True
    assert [(path, json.loads(body)["output"]) for _, path, body in receiver.calls] == [
        ("/done", "fine")
    ]
    unsent = FakePlatform(take_hold=0)
    async with client_of(unsent) as client:
        await client.post("/run", json={"input": {}, "webhook": hook})
        await finish(client, {"output": 1})
    assert [call.finished for call in unsent.webhooks.calls] == [False]


# -- the page and the schema -----------------------------------------------------------------


async def test_the_page_is_self_contained_and_the_schema_follows_the_routes(
    autojump_clock: MockClock,
) -> None:
    platform = FakePlatform()
    async with client_of(platform) as client:
        root, docs = await client.get("/"), await client.get("/docs")
        schema = (await client.get("/openapi.json")).json()
        posted = await client.post("/docs")
    assert root.status_code == 200
    assert root.headers["content-type"] == "text/html; charset=utf-8"
    assert docs.content == root.content
    page = root.text
    assert "default-src 'none'" in page
    assert not re.search(r"(src|href)=\"(https?:)?//", page)  # nothing from elsewhere
    assert "http://" not in page and "https://" not in page
    for element in ('id="body"', 'id="run"', 'id="runsync"', 'id="chunks"', 'id="error"'):
        assert element in page
    assert posted.status_code == 405
    assert schema["openapi"].startswith("3.")
    assert set(schema["paths"]) == {
        "/run",
        "/runsync",
        "/status/{id}",
        "/stream/{id}",
        "/cancel/{id}",
        "/health",
        "/purge-queue",
    }
    assert set(schema["paths"]["/status/{id}"]) == {"get", "post"}
    run = schema["paths"]["/run"]["post"]
    assert run["requestBody"]["content"]["application/json"]["schema"]["required"] == ["input"]
    assert {"200", "400", "413"} <= set(run["responses"])
    wait = schema["paths"]["/runsync"]["post"]["parameters"][0]
    assert (wait["name"], wait["schema"]["maximum"]) == ("wait", 300000)

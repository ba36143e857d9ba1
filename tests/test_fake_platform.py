"""The fake platform: worker routes, endpoint API, faults, requeue.

Most tests drive the app in-process through ``httpx.ASGITransport`` in virtual time (the
``autojump_clock`` fixture), so long-polls and deadlines are checked to the exact virtual
second with no real waiting. A few run over real loopback HTTP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from trio_worker.testing import (
    ConnectionDropped,
    FakePlatform,
    Fault,
    run_platform_server,
)
from trio_worker.testing._http_server import serve_asgi

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio.testing import MockClock

    from trio_worker.testing import JobRecord
    from trio_worker.testing._http_server import Receive, Scope, Send

pytestmark = pytest.mark.timeout(20)

EP = "/v2/ep"
TAKE = f"{EP}/job-take/w1?gpu=x&job_in_progress=0"
TAKE_W2 = f"{EP}/job-take/w2?gpu=x&job_in_progress=0"
STOP = f"{EP}/job-stop/w1?gpu=x"
STOP_W2 = f"{EP}/job-stop/w2?gpu=x"
FORM = {"Content-Type": "application/x-www-form-urlencoded", "charset": "utf-8"}


def batch(size: int, worker: str = "w1") -> str:
    return f"{EP}/job-take-batch/{worker}?gpu=x&batch_size={size}&job_in_progress=0"


def done_url(job_id: str, worker: str = "w1", *, is_stream: bool = False) -> str:
    return f"{EP}/job-done/{worker}/{job_id}?gpu=x&isStream={'true' if is_stream else 'false'}"


def stream_url(job_id: str) -> str:
    return f"{EP}/job-stream/w1/{job_id}?gpu=x&isStream=false"


def ping_url(*job_ids: str, worker: str = "w1") -> str:
    ids = f"job_id={'%2C'.join(job_ids)}&" if job_ids else ""
    return f"{EP}/ping/{worker}?gpu=x&{ids}runpod_version=1.0"


@asynccontextmanager
async def asgi_client(
    platform: FakePlatform, headers: dict[str, str] | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=platform)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://platform", headers=headers
    ) as client:
        yield client


async def report(
    client: httpx.AsyncClient, job_id: str, body: object, *, is_stream: bool = False
) -> httpx.Response:
    """POST a job-done body the way the reference SDK does (JSON under a form type)."""
    url = done_url(job_id, is_stream=is_stream)
    return await client.post(url, content=json.dumps(body), headers=FORM)


async def take_one(client: httpx.AsyncClient, url: str = TAKE) -> dict[str, object]:
    response = await client.get(url)
    assert response.status_code == 200, response
    job = response.json()
    assert isinstance(job, dict)
    return job


# -- job-take -------------------------------------------------------------------------------


async def test_take_holds_exactly_take_hold_then_204(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=5.0)
    async with asgi_client(platform) as client:
        start = trio.current_time()
        response = await client.get(TAKE)
    assert response.status_code == 204
    assert response.content == b""
    assert trio.current_time() - start == 5.0
    assert platform.requests[0].route == "take"
    assert platform.requests[0].status == 204
    assert platform.requests[0].query["job_in_progress"] == "0"


async def test_take_hold_zero_answers_at_once(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    async with asgi_client(platform) as client:
        start = trio.current_time()
        assert (await client.get(TAKE)).status_code == 204
    assert trio.current_time() == start


async def test_queued_job_is_handed_out_at_once_with_extra_keys(autojump_clock: MockClock) -> None:
    platform = FakePlatform()
    job_id = platform.enqueue({"prompt": "hi"}, extra={"webhook": "http://hook"})
    async with asgi_client(platform) as client:
        start = trio.current_time()
        job = await take_one(client)
    assert trio.current_time() == start
    assert job == {"id": job_id, "input": {"prompt": "hi"}, "webhook": "http://hook"}
    record = platform.job(job_id)
    assert record.status == "IN_PROGRESS"
    assert record.taken_by == "w1"
    assert record.take_time == start
    assert record.takes == 1


async def test_job_enqueued_during_the_hold_is_delivered_at_once(
    autojump_clock: MockClock,
) -> None:
    platform = FakePlatform(take_hold=30.0)
    start = trio.current_time()
    answers: list[tuple[float, httpx.Response]] = []
    async with asgi_client(platform) as client, trio.open_nursery() as nursery:

        async def take() -> None:
            response = await client.get(TAKE)
            answers.append((trio.current_time() - start, response))

        nursery.start_soon(take)
        await trio.sleep(2.0)
        job_id = platform.enqueue("late")
    assert [(t, r.status_code) for t, r in answers] == [(2.0, 200)]
    assert answers[0][1].json()["id"] == job_id


async def test_one_job_goes_to_exactly_one_of_several_waiting_takers(
    autojump_clock: MockClock,
) -> None:
    platform = FakePlatform(take_hold=10.0)
    statuses: list[int] = []
    async with asgi_client(platform) as client, trio.open_nursery() as nursery:

        async def take(url: str) -> None:
            statuses.append((await client.get(url)).status_code)

        for url in (TAKE, TAKE_W2, batch(4, "w3")):
            nursery.start_soon(take, url)
        await trio.sleep(1.0)
        platform.enqueue("only one")
    assert sorted(statuses) == [200, 204, 204]
    assert platform.statistics().jobs_handed_out == 1


async def test_cancelled_take_does_not_lose_the_job(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=30.0)
    async with asgi_client(platform) as client:
        with trio.move_on_after(1.0) as scope:  # the worker gives up on the long-poll
            await client.get(TAKE)
        assert scope.cancelled_caught
        job_id = platform.enqueue("after the cancel")
        assert platform.job(job_id).status == "IN_QUEUE"
        job = await take_one(client, TAKE_W2)
    assert job["id"] == job_id
    assert platform.job(job_id).taken_by == "w2"
    assert platform.job(job_id).takes == 1
    assert platform.requests[0].status is None  # never answered


async def test_batch_take_returns_at_most_batch_size(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=3.0)
    ids = [platform.enqueue({"n": n}) for n in range(5)]
    async with asgi_client(platform) as client:
        first = (await client.get(batch(3))).json()
        second = (await client.get(batch(3))).json()
        start = trio.current_time()
        empty = await client.get(batch(3))
    assert [job["id"] for job in first] == ids[:3]
    assert [job["id"] for job in second] == ids[3:]
    assert first[0] == {"id": ids[0], "input": {"n": 0}}
    assert empty.status_code == 204
    assert trio.current_time() - start == 3.0
    assert {platform.job(i).status for i in ids} == {"IN_PROGRESS"}


async def test_batch_take_rejects_a_bad_batch_size(autojump_clock: MockClock) -> None:
    platform = FakePlatform()
    async with asgi_client(platform) as client:
        response = await client.get(f"{EP}/job-take-batch/w1?batch_size=lots")
    assert response.status_code == 400


async def test_cancelled_queued_job_is_skipped(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    first = platform.enqueue("cancel me")
    second = platform.enqueue("keep me")
    platform.cancel(first)
    async with asgi_client(platform) as client:
        job = await take_one(client)
        assert (await client.get(TAKE)).status_code == 204
    assert job["id"] == second
    assert platform.job(first).status == "CANCELLED"
    assert platform.job(first).takes == 0


async def test_template_without_query_string_still_routes(autojump_clock: MockClock) -> None:
    # docs/protocol.md §1.5: without "?" in GET_JOB the SDK's "&job_in_progress" lands in the path.
    platform = FakePlatform(take_hold=0)
    job_id = platform.enqueue(1)
    async with asgi_client(platform) as client:
        job = await take_one(client, f"{EP}/job-take/w1&job_in_progress=1")
    assert job["id"] == job_id
    assert platform.requests[0].query == {"job_in_progress": "1"}


async def test_enqueue_raw_hands_out_the_payload_verbatim(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    platform.enqueue_raw(b"{not json")
    platform.enqueue_raw({"id": "no-input"})
    platform.enqueue_raw("plain", content_type="text/plain")
    async with asgi_client(platform) as client:
        broken = await client.get(batch(5))  # raw answers are delivered alone, even to a batch
        missing_input = await client.get(TAKE)
        plain = await client.get(TAKE)
        response = await report(client, "no-input", {"error": "missing input"})
    assert broken.content == b"{not json"
    assert missing_input.json() == {"id": "no-input"}
    assert plain.headers["content-type"] == "text/plain"
    assert plain.content == b"plain"
    assert response.status_code == 200  # the id became a job held by w1
    assert platform.job("no-input").taken_by == "w1"
    assert platform.job("no-input").status == "FAILED"


# -- job-done, progress, stream -----------------------------------------------------------


async def test_done_completes_and_fails_jobs(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    ok = platform.enqueue("ok")
    bad = platform.enqueue("bad")
    async with asgi_client(platform) as client:
        await client.get(batch(2))
        await trio.sleep(1.5)
        first = await report(client, ok, {"output": {"answer": 42}, "stopPod": True})
        second = await report(client, bad, {"error": '{"error_type": "ValueError"}'})
    assert first.status_code == second.status_code == 200
    completed = platform.job(ok)
    assert completed.status == "COMPLETED"
    assert completed.output == {"answer": 42}
    assert completed.stop_pod is True
    assert completed.done_by == "w1"
    assert completed.is_stream is False
    assert completed.done_time is not None
    assert completed.take_time is not None
    assert completed.done_time - completed.take_time == 1.5
    failed = platform.job(bad)
    assert failed.status == "FAILED"
    assert failed.error == '{"error_type": "ValueError"}'
    assert platform.statistics().completed == platform.statistics().failed == 1
    assert platform.statistics().duplicate_reports == 0


async def test_progress_is_recorded_then_ignored_after_the_end(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    job_id = platform.enqueue("x")
    async with asgi_client(platform) as client:
        await client.get(TAKE)
        await report(client, job_id, {"status": "IN_PROGRESS", "output": "25%"})
        status = (await client.get(f"/status/{job_id}")).json()
        await report(client, job_id, {"output": "final"}, is_stream=True)
        late = await report(client, job_id, {"status": "IN_PROGRESS", "output": "50%"})
    job = platform.job(job_id)
    assert status["status"] == "IN_PROGRESS"
    assert status["output"] == "25%"
    assert late.status_code == 200
    assert job.progress == ["25%"]
    assert job.late_progress == ["50%"]
    assert job.status == "COMPLETED"
    assert job.output == "final"
    assert job.is_stream is True
    assert job.done_reports == [{"output": "final"}]
    assert platform.statistics().late_progress_updates == 1


async def test_second_terminal_report_is_recorded_as_duplicate(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    job_id = platform.enqueue("x")
    async with asgi_client(platform) as client:
        await client.get(TAKE)
        await report(client, job_id, {"output": 1})
        await report(client, job_id, {"error": "again"})
    job = platform.job(job_id)
    assert job.status == "COMPLETED"  # the first report decides
    assert job.output == 1
    assert job.duplicates == [{"error": "again"}]
    assert platform.statistics().duplicate_reports == 1


async def test_reports_for_unknown_jobs_and_bad_bodies_are_rejected(
    autojump_clock: MockClock,
) -> None:
    platform = FakePlatform(take_hold=0)
    job_id = platform.enqueue("x")
    async with asgi_client(platform) as client:
        unknown = await report(client, "nope", {"output": 1})
        not_json = await client.post(done_url(job_id), content=b"{oops")
        wrong_method = await client.get(done_url(job_id))
        no_route = await client.get("/v2/ep/job-take/too/many/parts")
    assert unknown.status_code == 404
    assert not_json.status_code == 400
    assert wrong_method.status_code == 405
    assert no_route.status_code == 404
    assert platform.statistics().unknown_job_reports == 1
    assert platform.job(job_id).status == "IN_QUEUE"


async def test_stream_chunks_are_appended_and_read_incrementally(
    autojump_clock: MockClock,
) -> None:
    platform = FakePlatform(take_hold=0)
    job_id = platform.enqueue("x")
    async with asgi_client(platform) as client:
        await client.get(TAKE)
        for chunk in ("a", {"b": 2}):
            response = await client.post(stream_url(job_id), content=json.dumps({"output": chunk}))
            assert response.status_code == 200
        first_read = (await client.get(f"/stream/{job_id}")).json()
        await client.post(stream_url(job_id), content=json.dumps({"output": "c"}))
        await report(client, job_id, {"output": []}, is_stream=True)
        second_read = (await client.post(f"{EP}/stream/{job_id}")).json()
        third_read = (await client.get(f"/stream/{job_id}")).json()
    assert platform.job(job_id).stream == ["a", {"b": 2}, "c"]
    assert first_read == {
        "id": job_id,
        "status": "IN_PROGRESS",
        "stream": [{"output": "a"}, {"output": {"b": 2}}],
    }
    assert second_read["stream"] == [{"output": "c"}]
    assert second_read["status"] == "COMPLETED"
    assert third_read["stream"] == []


# -- job-stop ------------------------------------------------------------------------------


async def test_stop_long_poll_delivers_to_the_holding_worker_only(
    autojump_clock: MockClock,
) -> None:
    platform = FakePlatform(take_hold=0, stop_hold=4.0)
    job_id = platform.enqueue("x")
    answers: dict[str, tuple[float, int, object]] = {}
    async with asgi_client(platform) as client:
        await client.get(TAKE)
        start = trio.current_time()
        async with trio.open_nursery() as nursery:

            async def poll(name: str, url: str) -> None:
                response = await client.get(url)
                body = response.json() if response.status_code == 200 else None
                answers[name] = (trio.current_time() - start, response.status_code, body)

            nursery.start_soon(poll, "w1", STOP)
            nursery.start_soon(poll, "w2", STOP_W2)
            await trio.sleep(1.0)
            platform.request_stop(job_id)
    assert answers["w1"] == (1.0, 200, {"jobsToStop": [job_id]})
    assert answers["w2"] == (4.0, 204, None)
    assert platform.job(job_id).stop_delivered_time == start + 1.0


async def test_stop_for_a_queued_job_waits_until_it_is_taken(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0, stop_hold=2.0)
    job_id = platform.enqueue("x")
    platform.request_stop(job_id)
    async with asgi_client(platform) as client:
        nobody_holds_it = await client.get(STOP)
        await client.get(TAKE)
        delivered = await client.get(STOP)
        again = await client.get(STOP)
    assert nobody_holds_it.status_code == 204
    assert delivered.json() == {"jobsToStop": [job_id]}
    assert again.status_code == 204  # delivered once


async def test_stop_addressed_to_a_worker_is_delivered_even_for_unknown_ids(
    autojump_clock: MockClock,
) -> None:
    platform = FakePlatform(stop_hold=0)
    platform.request_stop("ghost", worker="w2")
    async with asgi_client(platform) as client:
        assert (await client.get(STOP)).status_code == 204
        assert (await client.get(STOP_W2)).json() == {"jobsToStop": ["ghost"]}


async def test_cancel_of_a_held_job_queues_a_stop_for_its_holder(
    autojump_clock: MockClock,
) -> None:
    platform = FakePlatform(take_hold=0, stop_hold=1.0)
    job_id = platform.enqueue("x")
    async with asgi_client(platform) as client:
        await client.get(TAKE)
        cancelled = (await client.post(f"/cancel/{job_id}")).json()
        stop = await client.get(STOP)
        late_result = await report(client, job_id, {"output": "too late"})
    assert cancelled["status"] == "CANCELLED"
    assert stop.json() == {"jobsToStop": [job_id]}
    assert late_result.status_code == 200
    job = platform.job(job_id)
    assert job.status == "CANCELLED"
    assert job.done_reports == [{"output": "too late"}]  # recorded, status unchanged
    assert job.duplicates == []


# -- ping and requeue ----------------------------------------------------------------------


async def test_ping_is_recorded(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    a = platform.enqueue("a")
    b = platform.enqueue("b")
    async with asgi_client(platform) as client:
        await client.get(batch(2))
        response = await client.get(ping_url(a, b))
        empty = await client.get(ping_url())
    assert response.status_code == empty.status_code == 200
    assert [p.job_ids for p in platform.pings] == [(a, b), ()]
    assert platform.pings[0].worker == "w1"
    assert platform.pings[0].query["runpod_version"] == "1.0"
    assert "w1" in platform.statistics().workers


async def test_job_is_requeued_after_pings_stop_listing_it(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0, requeue_after=3.0)
    job_id = platform.enqueue("x")
    async with asgi_client(platform) as client, trio.open_nursery() as nursery:
        await nursery.start(platform.run_requeue_checker)
        start = trio.current_time()
        await client.get(TAKE)
        for _ in range(2):  # listed at t=1 and t=2: due at t=5
            await trio.sleep(1.0)
            await client.get(ping_url(job_id))
        with trio.fail_after(60):  # virtual seconds: fails fast if the checker never wakes
            await platform.wait_for_status(job_id, "IN_QUEUE")
        requeued_at = trio.current_time() - start
        job = await take_one(client, TAKE_W2)
        nursery.cancel_scope.cancel()
    assert requeued_at == 5.0
    record = platform.job(job_id)
    assert job["id"] == job_id
    assert [(r.time - start, r.worker) for r in record.requeues] == [(5.0, "w1")]
    assert record.taken_by == "w2"
    assert record.takes == 2
    assert platform.statistics().requeues == 1


async def test_pings_from_another_worker_do_not_keep_a_job(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0, requeue_after=2.0)
    job_id = platform.enqueue("x")
    async with asgi_client(platform) as client:
        await client.get(TAKE)
        await trio.sleep(1.0)
        await client.get(ping_url(job_id, worker="w2"))  # not the holder
        await trio.sleep(1.0)
        # No background checker: the next request applies the rule lazily.
        await client.get(ping_url())
    assert platform.job(job_id).status == "IN_QUEUE"
    assert len(platform.job(job_id).requeues) == 1


async def test_a_job_kept_in_pings_is_never_requeued(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0, requeue_after=2.0)
    job_id = platform.enqueue("x")
    async with asgi_client(platform) as client, trio.open_nursery() as nursery:
        await nursery.start(platform.run_requeue_checker)
        await client.get(TAKE)
        for _ in range(10):
            await trio.sleep(1.0)
            await client.get(ping_url(job_id))
        await report(client, job_id, {"output": "done"})
        await trio.sleep(10.0)
        nursery.cancel_scope.cancel()
    assert platform.job(job_id).requeues == []
    assert platform.job(job_id).status == "COMPLETED"


async def test_requeue_is_off_by_default(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    job_id = platform.enqueue("x")
    async with asgi_client(platform) as client, trio.open_nursery() as nursery:
        await nursery.start(platform.run_requeue_checker)
        await client.get(TAKE)
        await trio.sleep(3600.0)
        await client.get(ping_url())
        nursery.cancel_scope.cancel()
    assert platform.job(job_id).status == "IN_PROGRESS"
    assert platform.job(job_id).requeues == []


# -- faults --------------------------------------------------------------------------------


async def test_fault_status_answers_instead_of_the_route(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    job_id = platform.enqueue("x")
    platform.inject(Fault("take", status=503, times=2))
    async with asgi_client(platform) as client:
        statuses = [(await client.get(TAKE)).status_code for _ in range(3)]
    assert statuses == [503, 503, 200]
    assert platform.job(job_id).takes == 1  # the faulted takes handed out nothing
    assert [r.status for r in platform.requests] == [503, 503, 200]
    assert platform.requests[0].fault is not None


async def test_fault_body_and_any_route(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    platform.inject(Fault("*", status=429, body=b"slow down"))
    async with asgi_client(platform) as client:
        limited = await client.get(ping_url())
        fine = await client.get(ping_url())
    assert (limited.status_code, limited.content) == (429, b"slow down")
    assert fine.status_code == 200


async def test_fault_delay_delays_the_real_answer(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    job_id = platform.enqueue("x")
    platform.inject(Fault("done", delay=3.0))
    async with asgi_client(platform) as client:
        await client.get(TAKE)
        start = trio.current_time()
        response = await report(client, job_id, {"output": 1})
    assert response.status_code == 200
    assert trio.current_time() - start == 3.0
    assert platform.job(job_id).done_time == start + 3.0  # "before": recorded after the delay


async def test_fault_drop_looks_like_a_dead_connection(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    job_id = platform.enqueue("x")
    platform.inject(Fault("take", drop=True))
    async with asgi_client(platform) as client:
        with pytest.raises(httpx.RemoteProtocolError) as info:
            await client.get(TAKE)
        job = await take_one(client)
    assert isinstance(info.value, ConnectionDropped)
    assert job["id"] == job_id  # "before": nothing was handed out
    assert platform.requests[0].dropped
    assert platform.requests[0].status is None


async def test_fault_after_done_records_the_result_but_answers_500(
    autojump_clock: MockClock,
) -> None:
    platform = FakePlatform(take_hold=0)
    job_id = platform.enqueue("x")
    platform.inject(Fault("done", status=500, when="after"))
    async with asgi_client(platform) as client:
        await client.get(TAKE)
        first = await report(client, job_id, {"output": "result"})
        retry = await report(client, job_id, {"output": "result"})
    assert first.status_code == 500
    assert retry.status_code == 200
    job = platform.job(job_id)
    assert job.status == "COMPLETED"
    assert job.duplicates == [{"output": "result"}]  # what a blind retry produces


async def test_fault_after_take_loses_the_job_in_transit(autojump_clock: MockClock) -> None:
    platform = FakePlatform(take_hold=0)
    job_id = platform.enqueue("x")
    platform.inject(Fault("take", drop=True, when="after", delay=1.0))
    async with asgi_client(platform) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(TAKE)
        nothing = await client.get(TAKE)
    assert nothing.status_code == 204
    job = platform.job(job_id)
    assert job.status == "IN_PROGRESS"  # the platform thinks w1 has it
    assert job.taken_by == "w1"


def test_fault_validation() -> None:
    with pytest.raises(ValueError):
        Fault("take", status=500, drop=True)
    with pytest.raises(ValueError):
        Fault("take", times=0)
    with pytest.raises(ValueError):
        Fault("take", delay=-1.0)


# -- auth ------------------------------------------------------------------------------------


async def test_worker_routes_require_the_api_key(autojump_clock: MockClock) -> None:
    platform = FakePlatform(api_key="secret", take_hold=0)
    async with (
        asgi_client(platform) as anonymous,
        asgi_client(platform, {"Authorization": "wrong"}) as wrong,
        asgi_client(platform, {"Authorization": "secret"}) as right,
    ):
        assert (await anonymous.get(TAKE)).status_code == 401
        assert (await wrong.get(ping_url())).status_code == 401
        assert (await wrong.post(done_url("x"), content=b"{}")).status_code == 401
        assert (await right.get(TAKE)).status_code == 204
        assert (await right.get(ping_url())).status_code == 200
        # The endpoint API of a local dev server is open.
        assert (await anonymous.post("/run", json={"input": {"n": 1}})).status_code == 200
    assert platform.pings[0].worker == "w1"
    assert len(platform.pings) == 1


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
    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "trio_worker.testing", "--port", "0", "--preload", "3"]
    with subprocess.Popen(
        [*command, "--take-hold", "0"], stdout=subprocess.PIPE, text=True, env=env
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

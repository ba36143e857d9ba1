"""The fake platform's reports: job-done, progress, stream chunks, pings and the requeue of
a job whose pings stop listing it, in-process and in virtual time."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
import trio

from tests.fake_platform_client import (
    EP,
    TAKE,
    TAKE_W2,
    asgi_client,
    batch,
    done_url,
    ping_url,
    report,
    stream_url,
    take_one,
)
from trio_worker.testing import (
    FakePlatform,
)

if TYPE_CHECKING:
    from trio.testing import MockClock


pytestmark = pytest.mark.timeout(20)


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

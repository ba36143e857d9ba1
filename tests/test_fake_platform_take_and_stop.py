"""The fake platform's long-polls: job-take (single and batch) and job-stop, driven
in-process through ``httpx.ASGITransport`` in virtual time (the ``autojump_clock``
fixture), so holds and deadlines are checked to the exact virtual second."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from tests.fake_platform_client import (
    EP,
    STOP,
    STOP_W2,
    TAKE,
    TAKE_W2,
    asgi_client,
    batch,
    report,
    take_one,
)
from trio_worker.testing import (
    FakePlatform,
)

if TYPE_CHECKING:
    from trio.testing import MockClock


pytestmark = pytest.mark.timeout(20)


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

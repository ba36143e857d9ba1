"""The fake platform's injected faults and its API key check, in-process and in virtual
time."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from tests.fake_platform_client import TAKE, asgi_client, done_url, ping_url, report, take_one
from trio_worker.testing import (
    ConnectionDropped,
    FakePlatform,
    Fault,
)

if TYPE_CHECKING:
    from trio.testing import MockClock


pytestmark = pytest.mark.timeout(20)


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

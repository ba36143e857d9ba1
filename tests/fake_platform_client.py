"""The worker routes of the fake platform as the reference SDK calls them (URLs for workers
w1 and w2, the form content type it posts JSON under) and an in-process ``httpx`` client,
for the fake platform's tests (tests/test_fake_platform*.py)."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import httpx

from trio_worker.testing import (
    FakePlatform,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


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

"""Job ids in URLs: percent-encoded as one path segment, decoded by the fake platform, and
every odd id delivered onto its own job end to end (docs/protocol.md §2.3)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import trio
import trio.testing

import trio_worker.testing
from trio_worker._config import Settings
from trio_worker._platform._client import PlatformClient, job_path_segment
from trio_worker._platform._http import HttpPool
from trio_worker.testing import FakePlatform, memory_network, run_platform_server

from .scripted_server import send_one

ODD_IDS = ["a?x=1", "a#b", "a&isStream=true", "a b", "café", "w/x", "100%", "a%2Fb", "中/😀"]
TEMPLATE_ENV = {
    "RUNPOD_WEBHOOK_GET_JOB": "http://p.test/v2/ep/job-take/$ID",
    "RUNPOD_WEBHOOK_POST_OUTPUT": "http://p.test/v2/ep/job-done/$RUNPOD_POD_ID/$ID",
    "RUNPOD_WEBHOOK_POST_STREAM": "http://p.test/v2/ep/job-stream/$RUNPOD_POD_ID/$ID",
    "RUNPOD_POD_ID": "w1",
}


def platform_routes() -> PlatformClient:
    """The client whose routes' URLs are built from TEMPLATE_ENV's templates."""
    settings = Settings.from_environ(TEMPLATE_ENV)
    return PlatformClient(settings.platform, settings.timings)


@pytest.mark.parametrize(
    ("job_id", "segment"),
    [
        ("sync-1f2e3d-e1", "sync-1f2e3d-e1"),  # the platform's ids: unchanged
        ("A.b_c~d-9", "A.b_c~d-9"),
        ("a?x=1", "a%3Fx%3D1"),
        ("a#b", "a%23b"),
        ("a&isStream=true", "a%26isStream%3Dtrue"),
        ("a b", "a%20b"),
        ("café", "caf%C3%A9"),
        ("w/x", "w%2Fx"),
        ("100%", "100%25"),
        ("\ud800", "%ED%A0%80"),  # a lone surrogate: never raises
    ],
)
def test_job_path_segment(job_id: str, segment: str) -> None:
    assert job_path_segment(job_id) == segment


@pytest.mark.parametrize("job_id", ODD_IDS)
def test_done_and_stream_urls_keep_the_id_in_one_segment(job_id: str) -> None:
    routes = platform_routes()
    done = routes.done_url(job_id, is_stream=False)
    stream = routes.stream_url(job_id)
    segment = job_path_segment(job_id)
    assert done == f"http://p.test/v2/ep/job-done/w1/{segment}?isStream=false"
    assert routes.done_url(job_id, is_stream=True).endswith(f"/{segment}?isStream=true")
    assert stream == f"http://p.test/v2/ep/job-stream/w1/{segment}?isStream=false"
    assert done.isascii() and " " not in done and "#" not in done
    assert done.count("?") == 1 and done.count("&") == 0


async def test_the_fake_platform_decodes_each_path_segment(
    autojump_clock: trio.testing.MockClock,
) -> None:
    platform = FakePlatform()
    ids = [platform.enqueue({}, job_id=job_id) for job_id in ["a", *ODD_IDS]]
    routes = platform_routes()
    async with memory_network(platform) as opener:
        client = HttpPool({}, open_stream=opener)
        # The platform hands the jobs out, then each result is posted to its own URL.
        for _ in ids:
            take = routes.take_url(1, in_progress=False)
            assert (await send_one(client, "GET", take)).status == 200
        for job_id in ODD_IDS:
            url = routes.done_url(job_id, is_stream=False)
            body = b'{"output": "%s"}' % job_path_segment(job_id).encode()
            assert (await send_one(client, "POST", url, body)).status == 200
        await client.aclose()
    for job_id in ODD_IDS:
        assert platform.job(job_id).output == job_path_segment(job_id), job_id
    assert platform.job("a").done_reports == []  # nothing landed on the prefix
    assert platform.statistics().unknown_job_reports == 0


async def echo(job: dict[str, Any]) -> dict[str, Any]:
    return {"id": job["id"], "input": job["input"]}


async def test_odd_ids_complete_end_to_end_over_loopback(nursery: trio.Nursery) -> None:
    platform = FakePlatform(take_hold=0.05)
    plain = platform.enqueue("plain", job_id="a")
    odd = {job_id: platform.enqueue(f"input of {job_id}", job_id=job_id) for job_id in ODD_IDS}
    async with run_platform_server(platform) as base_url:
        env = platform.worker_env(base_url, ping_interval_ms=50)
        await nursery.start(
            functools.partial(
                trio_worker.testing.serve,
                echo,
                environ=env,
                heartbeat="task",
                handle_signals=False,
                capture_logs="off",
            )
        )
        with trio.fail_after(20):
            for job_id in [plain, *odd]:
                record = await platform.wait_for_status(job_id, "COMPLETED")
                assert record.output == {"id": job_id, "input": record.input}, job_id
        nursery.cancel_scope.cancel()
    assert platform.job("a").output == {"id": "a", "input": "plain"}
    stats = platform.statistics()
    assert (stats.unknown_job_reports, stats.duplicate_reports) == (0, 0)

"""The SDK's own HTTP requests never flood the application's log (docs/migration.md).

``import runpod`` calls ``logging.basicConfig(level=INFO)``; httpx then logs an ``HTTP
Request:`` line for every request on a logger inheriting that level. The worker's requests
(heartbeat pings, the httpx backend's takes and reports) are kept out of it, at any root
level, while the user's own httpx requests and an explicit httpx level are respected.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import httpx
import pytest

from trio_worker._platform._heartbeat import HeartbeatThread
from trio_worker._platform._proxy import HttpxHttp
from trio_worker.testing import FakePlatform, ServerThread, run_server_in_thread

from .scripted_server import send_one

PINGS = 10


class PingTarget:
    """The fake platform on a loopback server thread, for the heartbeat's own thread to ping:
    its ping URL and the pings it counted. (The async tests' ``platform`` fixture, in
    tests/conftest.py, serves on the test's trio loop, which a blocking thread cannot wait on.)"""

    def __init__(self, server: ServerThread, platform: FakePlatform) -> None:
        self.server = server
        self.platform = platform
        env = platform.worker_env(server.url)
        self.url = env["RUNPOD_WEBHOOK_PING"].replace("$RUNPOD_POD_ID", "w1")

    def pings(self) -> int:
        return self.server.run_sync(lambda: self.platform.statistics().pings)


@pytest.fixture
def ping_target() -> Iterator[PingTarget]:
    fake = FakePlatform()
    with run_server_in_thread(fake) as server:
        yield PingTarget(server, fake)


@pytest.fixture
def httpx_level() -> Iterator[None]:
    """Restores the httpx logger's own level after a test that sets it."""
    logger = logging.getLogger("httpx")
    before = logger.level
    yield
    logger.setLevel(before)


def _request_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith(("httpx", "httpcore"))]


def _ping(ping_target: PingTarget, times: int) -> None:
    """*times* pings: the thread's first one, then the rest from here."""
    thread = HeartbeatThread(ping_target.url, "key", interval=60.0, held=lambda: ("job-1",))
    thread.start()
    try:
        # The thread's first ping before anything else: stop() does not wait for a ping
        # the thread has not started (nor long for one in flight), so on a busy machine a
        # stop right after the others raced it (CI saw 1 ping of 2).
        deadline = time.monotonic() + 10.0
        while ping_target.pings() < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        for _ in range(times - 1):
            thread.ping_now()
    finally:
        thread.stop()
    assert ping_target.pings() == times


@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO])
def test_ten_pings_log_no_request_line_at_any_root_level(
    ping_target: PingTarget, caplog: pytest.LogCaptureFixture, level: int
) -> None:
    caplog.set_level(level)  # the root logger, as logging.basicConfig(level=...) sets it
    _ping(ping_target, PINGS)
    assert _request_lines(caplog) == []


def test_the_users_own_httpx_requests_still_log(
    ping_target: PingTarget, caplog: pytest.LogCaptureFixture
) -> None:
    # The control: the capture does see httpx's line, so the test above can fail.
    caplog.set_level(logging.INFO)
    _ping(ping_target, 2)
    with httpx.Client() as client:
        client.get(ping_target.url)
    assert len([line for line in _request_lines(caplog) if "HTTP Request" in line]) == 1


async def test_an_explicit_httpx_level_lets_the_sdks_httpx_requests_through(
    caplog: pytest.LogCaptureFixture, httpx_level: None
) -> None:
    # Pings go through the lean client, which logs nothing; httpx carries the SDK's
    # requests only behind a proxy.
    caplog.set_level(logging.INFO)
    logging.getLogger("httpx").setLevel(logging.INFO)  # the user asked for them
    transport = httpx.MockTransport(lambda request: httpx.Response(204))
    backend = HttpxHttp(httpx.AsyncClient(transport=transport))
    try:
        for _ in range(3):
            await send_one(backend, "GET", "http://platform.test/ping")
    finally:
        await backend.aclose()
    assert len([line for line in _request_lines(caplog) if "HTTP Request" in line]) == 3


async def test_the_httpx_backends_requests_log_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    transport = httpx.MockTransport(lambda request: httpx.Response(204))
    backend = HttpxHttp(httpx.AsyncClient(transport=transport))
    try:
        for _ in range(PINGS):
            assert (await send_one(backend, "GET", "http://platform.test/ping")).status == 204
    finally:
        await backend.aclose()
    assert _request_lines(caplog) == []
    # Leaving the SDK's request, the user's requests in the same task log again.
    async with httpx.AsyncClient(transport=transport) as client:
        await client.get("http://platform.test/mine")
    assert len(_request_lines(caplog)) == 1

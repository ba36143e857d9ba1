"""The pings (docs/protocol.md §2.6): their query and URL bound, and heartbeat_task, the same
pings as a trio task, over the lean client on the in-memory network in virtual time."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import pytest
import trio
import trio.testing

from trio_worker._config import MAX_PING_URL_BYTES
from trio_worker._platform._heartbeat import (
    PingUrls,
    heartbeat_task,
    ping_params,
    ping_url,
)
from trio_worker._platform._http import HttpPool
from trio_worker._version import __version__
from trio_worker.testing import memory_network
from trio_worker.testing._http_server import AbortConnection, Receive, Scope, Send

from .test_heartbeat import Flaky, Held, long_ids

KEY = "rpa_ping_key"


# --- ping_params --------------------------------------------------------------------------


def test_ping_params_omit_job_id_when_nothing_is_held() -> None:
    assert ping_params(()) == {"runpod_version": __version__}


def test_ping_params_join_ids_with_commas() -> None:
    assert ping_params(("a",)) == {"job_id": "a", "runpod_version": __version__}
    assert ping_params(("a", "b", "c")) == {"job_id": "a,b,c", "runpod_version": __version__}


def test_ping_params_keep_the_held_order() -> None:
    assert ping_params(("z", "a", "m"))["job_id"] == "z,a,m"


# --- heartbeat_task (virtual time) --------------------------------------------------------


@dataclass
class Seen:
    at: float
    path: str
    query: dict[str, list[str]]
    authorization: str | None
    url_length: int


class PingApp:
    """A platform's ping route as an ASGI app on the in-memory network: records each ping,
    answers with the next status of *statuses* (the last repeating; 0 drops the
    connection without an answer)."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = statuses or (200,)
        self.seen: list[Seen] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = scope["query_string"].decode("latin-1")
        self.seen.append(
            Seen(
                trio.current_time(),
                scope["path"],
                parse_qs(query, keep_blank_values=True),
                headers.get("authorization"),
                len(f"http://{headers['host']}{scope['path']}?{query}"),
            )
        )
        status = self.statuses[min(len(self.seen), len(self.statuses)) - 1]
        if status == 0:
            raise AbortConnection
        # Each ping on its own connection: a dropped one is then never taken for a stale
        # kept-alive connection (and sent again unseen).
        close = [(b"connection", b"close")]
        await send({"type": "http.response.start", "status": status, "headers": close})
        await send({"type": "http.response.body", "body": b""})

    @property
    def times(self) -> list[float]:
        return [seen.at for seen in self.seen]


@contextlib.asynccontextmanager
async def lean_pings(app: PingApp) -> AsyncIterator[HttpPool]:
    """The worker's lean client (as the worker hands it to heartbeat_task) to *app*."""
    async with memory_network(app) as opener:
        client = HttpPool({"Authorization": KEY}, open_stream=opener)
        try:
            yield client
        finally:
            await client.aclose()


async def test_heartbeat_task_pings_every_interval_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = PingApp()
    held = Held("a", "b")
    url = "http://platform.test/v2/ep/ping/w1?gpu=A100"
    async with lean_pings(app) as client:
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(heartbeat_task, client, url, 10.0, held)
            await trio.sleep(15)
            held.ids = ("c",)
            await trio.sleep(10)
            held.ids = ()
            await trio.sleep(10)
            nursery.cancel_scope.cancel()
    assert [t - start for t in app.times] == [0.0, 10.0, 20.0, 30.0]
    assert [seen.query.get("job_id", [None])[0] for seen in app.seen] == ["a,b", "a,b", "c", None]
    for seen in app.seen:
        assert seen.path == "/v2/ep/ping/w1"
        assert seen.query["runpod_version"] == [__version__]
        assert seen.authorization == KEY


async def test_heartbeat_task_survives_failed_pings(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    app = PingApp(200, 0, 0, 503, 200)  # two dropped connections, then a 503
    async with lean_pings(app) as client:
        start = trio.current_time()
        with trio.move_on_after(4.5):
            await heartbeat_task(client, "http://p.test/ping", 1.0, Held())
    assert [t - start for t in app.times] == [0.0, 1.0, 2.0, 3.0, 4.0]
    failures = [r for r in caplog.records if "ping failed" in r.getMessage()]
    assert len(failures) == 2


async def test_heartbeat_task_survives_any_exception_in_a_ping(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    app = PingApp()
    async with lean_pings(app) as client:
        start = trio.current_time()
        with trio.move_on_after(2.5):
            await heartbeat_task(client, "http://p.test/ping", 1.0, Flaky(1))
    assert [t - start for t in app.times] == [1.0, 2.0]
    failures = [r for r in caplog.records if "ping failed: RuntimeError" in r.getMessage()]
    assert len(failures) == 1


async def test_heartbeat_task_keeps_the_ping_templates_query(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = PingApp()
    async with lean_pings(app) as client:
        with trio.move_on_after(0.5):
            await heartbeat_task(client, "http://p.test/ping/w1?gpu=A100", 1.0, Held("a"))
    [seen] = app.seen
    assert seen.query.get("gpu") == ["A100"]
    assert seen.query.get("job_id") == ["a"]


async def test_heartbeat_task_cuts_a_ping_at_its_deadline(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # One deadline for the whole ping, the next one's due time: a ping whose answer
    # never comes whole does not delay the next.
    caplog.set_level(logging.WARNING, logger="trio_worker")
    times: list[float] = []

    async def dripping(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        times.append(trio.current_time())
        headers = [(b"content-length", b"1000")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for _ in range(1000):
            await trio.sleep(1.5)
            await send({"type": "http.response.body", "body": b"x", "more_body": True})

    async with memory_network(dripping) as opener:
        client = HttpPool({}, open_stream=opener)
        start = trio.current_time()
        with trio.move_on_after(30.5):
            await heartbeat_task(client, "http://p.test/ping", 10.0, Held("held"))
        await client.aclose()
    assert [t - start for t in times] == [0.0, 10.0, 20.0, 30.0]
    cut = [r for r in caplog.records if "no whole answer within 10.00s" in r.getMessage()]
    assert len(cut) == 3


def test_ping_urls_list_every_id_when_they_fit() -> None:
    urls = PingUrls("http://p.test/ping?gpu=A100")
    held = ("a b", "café", "w/x", "a,b")
    url = urls(held)
    assert url == ping_url("http://p.test/ping?gpu=A100", held)
    assert parse_qs(urlsplit(url).query)["job_id"] == ["a b,café,w/x,a,b"]


def test_ping_urls_stay_within_the_bound_and_take_turns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    held = long_ids(400)  # about 20 KiB of ids
    urls = PingUrls("http://p.test/ping?gpu=A100")
    listed: list[str] = []
    for _ in range(4):
        url = urls(held)
        assert len(url) <= MAX_PING_URL_BYTES
        assert parse_qs(urlsplit(url).query)["gpu"] == ["A100"]
        listed += parse_qs(urlsplit(url).query)["job_id"][0].split(",")
    # Each ping is nearly full, and after a few every held id was listed.
    assert set(listed) == set(held)
    warnings = [r for r in caplog.records if "do not fit one ping URL" in r.getMessage()]
    assert len(warnings) == 1  # once per episode
    assert urls(held[:3]) == ping_url("http://p.test/ping?gpu=A100", held[:3])
    urls(held)
    assert len([r for r in caplog.records if "do not fit" in r.getMessage()]) == 2


def test_ping_urls_exactly_at_the_bound() -> None:
    template = "http://p.test/ping"
    base = len(ping_url(template, ("",)))
    fits = ("a" * (100 - base), "b")
    urls = PingUrls(template, limit=len(ping_url(template, fits)))
    assert urls(fits) == ping_url(template, fits)
    urls = PingUrls(template, limit=len(ping_url(template, fits)) - 1)
    assert urls(fits) == ping_url(template, fits[:1])


def test_an_id_that_never_fits_is_skipped_not_stuck() -> None:
    template = "http://p.test/ping"
    urls = PingUrls(template, limit=200)
    held = ("x" * 500, "small")
    assert urls(held) == ping_url(template, ())
    assert urls(held) == ping_url(template, ("small",))


async def test_heartbeat_task_bounds_its_url(autojump_clock: trio.testing.MockClock) -> None:
    app = PingApp()
    async with lean_pings(app) as client:
        with trio.move_on_after(2.5):
            await heartbeat_task(client, "http://p.test/ping", 1.0, Held(*long_ids(2000)))
    lengths = [seen.url_length for seen in app.seen]
    assert len(lengths) == 3
    assert all(MAX_PING_URL_BYTES - 100 < n <= MAX_PING_URL_BYTES for n in lengths)

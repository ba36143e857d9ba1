"""The heartbeat thread (docs/protocol.md §2.6, docs/design.md §3) against a real loopback
server: cadence, stop, survival, bounds, a ping's whole deadline. The pings' query and URL,
and the same pings as a trio task in virtual time: tests/test_pings.py."""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from trio_worker import ConfigurationError
from trio_worker._config import MAX_ANSWER_BYTES
from trio_worker._platform._heartbeat import (
    HeartbeatThread,
)
from trio_worker._platform._http import HttpPool
from trio_worker._platform._network import trust_context
from trio_worker._version import __version__

KEY = "rpa_ping_key"
INTERVAL = 0.05
WAIT = 2.0  # a safety bound on waiting for a ping; never reached when the code is right


# --- a tiny loopback platform -------------------------------------------------------------


@dataclass
class Ping:
    at: float
    path: str
    query: dict[str, list[str]]
    authorization: str | None

    @property
    def job_ids(self) -> str | None:
        values = self.query.get("job_id")
        return None if values is None else values[0]


class PingServer:
    """Records every GET it receives; answers 200 with an empty body."""

    def __init__(self, delay: float = 0.0) -> None:
        self.pings: list[Ping] = []
        self.changed = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                ping = Ping(
                    time.monotonic(),
                    parts.path,
                    parse_qs(parts.query, keep_blank_values=True),
                    self.headers.get("Authorization"),
                )
                if delay:
                    time.sleep(delay)  # a slow platform
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                with server.changed:
                    server.pings.append(ping)
                    server.changed.notify_all()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v2/ep/ping/w1?gpu=A100"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    def __enter__(self) -> PingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(WAIT)

    def count(self) -> int:
        with self.changed:
            return len(self.pings)

    def wait_for(self, predicate: Callable[[list[Ping]], bool]) -> list[Ping]:
        with self.changed:
            assert self.changed.wait_for(lambda: predicate(self.pings), timeout=WAIT)
            return list(self.pings)


class Held:
    """The ledger's snapshot, as the supervisor hands it to the heartbeat."""

    def __init__(self, *ids: str) -> None:
        self.ids: tuple[str, ...] = ids

    def __call__(self) -> tuple[str, ...]:
        return self.ids


@contextlib.contextmanager
def pinging(url: str, held: Held, interval: float = INTERVAL) -> Iterator[HeartbeatThread]:
    pinger = HeartbeatThread(url, KEY, interval, held)
    pinger.start()
    try:
        yield pinger
    finally:
        pinger.stop()


def heartbeat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "trio_worker heartbeat"]


# --- HeartbeatThread ----------------------------------------------------------------------


def test_thread_pings_the_current_held_ids() -> None:
    held = Held("a")
    with PingServer() as server, pinging(server.url, held) as pinger:
        first = server.wait_for(lambda pings: len(pings) >= 1)[0]
        held.ids = ("b", "c")
        server.wait_for(lambda pings: pings[-1].job_ids == "b,c")
        held.ids = ()
        pings = server.wait_for(lambda pings: pings[-1].job_ids is None)
    assert first.job_ids == "a"
    assert first.path == "/v2/ep/ping/w1"
    assert first.query["runpod_version"] == [__version__]
    assert first.authorization == KEY
    assert "job_id" not in pings[-1].query
    # Every ping carried one of the snapshots the ledger actually had, in order.
    seen = [p.job_ids for p in pings]
    assert seen == sorted(seen, key=["a", "b,c", None].index)
    assert pinger.sent >= len(pings)


async def test_thread_keeps_pinging_while_the_event_loop_is_blocked() -> None:
    with PingServer() as server, pinging(server.url, Held("busy")):
        server.wait_for(lambda pings: len(pings) >= 1)
        before = server.count()
        start = time.monotonic()
        time.sleep(0.2)  # a sync handler blocking the trio thread
        blocked_for = time.monotonic() - start
        during = server.count() - before
    # About 4 pings are due in 0.2 s; a pinger that needed this loop would send none.
    assert blocked_for >= 0.2
    assert during >= 3
    assert all(p.job_ids == "busy" for p in server.pings)


def test_a_slow_ping_does_not_stretch_the_cadence() -> None:
    # Each ping is due one interval after the previous one was due (fixed rate), so a 40 ms
    # answer does not turn a 50 ms interval into 90 ms.
    with PingServer(delay=0.04) as server, pinging(server.url, Held()):
        pings = server.wait_for(lambda pings: len(pings) >= 4)
    gaps = [b.at - a.at for a, b in itertools.pairwise(pings[:4])]
    assert sum(gaps) / len(gaps) < INTERVAL + 0.025


def test_stop_is_prompt_and_final() -> None:
    with PingServer() as server:
        pinger = HeartbeatThread(server.url, KEY, INTERVAL, Held("x"))
        pinger.start()
        server.wait_for(lambda pings: len(pings) >= 1)
        start = time.monotonic()
        pinger.stop()
        stopped_in = time.monotonic() - start
        after_stop = server.count()
        assert heartbeat_threads() == []
        time.sleep(2 * INTERVAL)
        assert server.count() == after_stop
    assert stopped_in < INTERVAL
    assert pinger.sent == after_stop


def test_stop_is_prompt_even_with_a_long_interval() -> None:
    with PingServer() as server:
        pinger = HeartbeatThread(server.url, KEY, 30.0, Held())
        pinger.start()
        server.wait_for(lambda pings: len(pings) >= 1)
        start = time.monotonic()
        pinger.stop()
        assert time.monotonic() - start < 0.2
        assert heartbeat_threads() == []


def test_thread_is_a_daemon() -> None:
    with PingServer() as server, pinging(server.url, Held()):
        [thread] = heartbeat_threads()
        assert thread.daemon


def test_failed_pings_are_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on that port now: every ping is refused.
    with pinging(f"http://127.0.0.1:{port}/ping", Held("a")) as pinger:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            failures = [r for r in caplog.records if "ping failed" in r.getMessage()]
            if len(failures) >= 2:
                break
            time.sleep(0.005)
    assert len(failures) >= 2
    assert pinger.sent == 0


class Flaky(Held):
    """Held ids whose first reads raise: a failure that is no httpx error at all."""

    def __init__(self, failures: int) -> None:
        super().__init__("a")
        self.failures = failures

    def __call__(self) -> tuple[str, ...]:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("snapshot unavailable")
        return self.ids


def test_any_ping_failure_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    with PingServer() as server, pinging(server.url, Flaky(2)):
        pings = server.wait_for(lambda pings: len(pings) >= 1)
    failures = [r for r in caplog.records if "ping failed: RuntimeError" in r.getMessage()]
    assert len(failures) == 2
    assert pings[0].job_ids == "a"


QUERY_BUG = (
    "BUG: the ping drops the query string of the RUNPOD_WEBHOOK_PING template (e.g. "
    "'?gpu=A100'): httpx's params= replaces the URL's query instead of merging as the "
    "reference's requests does (docs/protocol.md §1.5, §9.2: keep the templates' query strings)"
)


def test_thread_keeps_the_ping_templates_query() -> None:
    with PingServer() as server, pinging(server.url, Held("a")):
        first = server.wait_for(lambda pings: len(pings) >= 1)[0]
    assert first.query.get("gpu") == ["A100"]
    assert first.job_ids == "a"


class DrippingPingServer(PingServer):
    """Answers the first ping with a head, then a byte of its body every 0.2 s (each read
    well within any per-read timeout), for as long as the client listens."""

    def __init__(self) -> None:
        self.ended = threading.Event()
        dripped = self.dripped = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with server.changed:
                    server.pings.append(Ping(time.monotonic(), self.path, {}, None))
                    server.changed.notify_all()
                self.send_response(200)
                if dripped.is_set():
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                dripped.set()
                self.send_header("Content-Length", "1000")
                self.end_headers()
                with contextlib.suppress(OSError):
                    while not server.ended.wait(0.2):
                        self.wfile.write(b"x")
                        self.wfile.flush()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.pings = []
        self.changed = threading.Condition()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/ping/w1"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    def __exit__(self, *exc: object) -> None:
        self.ended.set()
        super().__exit__(*exc)


def test_a_dripping_ping_answer_is_cut_at_its_deadline(caplog: pytest.LogCaptureFixture) -> None:
    # Regression: on httpx, whose timeout is per read, one answer dripping a byte every
    # 1.5 s silenced the heartbeat for 30 s while a job was held. A ping's deadline is for
    # the whole of it: the next ping goes out when due, on a connection of its own.
    caplog.set_level(logging.WARNING, logger="trio_worker")
    dripping = DrippingPingServer()
    with dripping as server, pinging(server.url, Held("held")):
        server.wait_for(lambda pings: len(pings) >= 3)
    assert dripping.dripped.is_set()
    assert any("no whole answer within" in r.getMessage() for r in caplog.records)


# --- bounds: the ping URL, the answer, anything a ping raises ------------------------------


def long_ids(count: int) -> tuple[str, ...]:
    return tuple(f"job-{n:04d}-" + "x" * 40 for n in range(count))


def test_thread_pings_with_more_held_ids_than_fit() -> None:
    held = Held(*long_ids(2000))  # ~100 KiB: past httpx's 64 KiB URL limit
    with PingServer() as server, pinging(server.url, held):
        pings = server.wait_for(lambda pings: len(pings) >= 3)
    assert all(p.job_ids for p in pings[:3])


class Crashing(Held):
    """Held ids whose first read raises a BaseException that is no Exception."""

    def __init__(self) -> None:
        super().__init__("a")
        self.raised = False

    def __call__(self) -> tuple[str, ...]:
        if not self.raised:
            self.raised = True
            raise BaseExceptionGroup("odd", [GeneratorExit()])
        return self.ids


def test_the_thread_survives_a_base_exception(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    with PingServer() as server, pinging(server.url, Crashing()) as pinger:
        pings = server.wait_for(lambda pings: len(pings) >= 1)
        assert pinger._thread.is_alive()
    assert pings[0].job_ids == "a"
    assert any("the next ping still goes out" in r.getMessage() for r in caplog.records)


def test_a_huge_ping_answer_is_not_read(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    answered = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(64 * MAX_ANSWER_BYTES))
            self.end_headers()
            with contextlib.suppress(OSError):
                for _ in range(64 * 16):
                    self.wfile.write(b"x" * (MAX_ANSWER_BYTES // 16))
            answered.set()

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01})
    thread.start()
    try:
        pinger = HeartbeatThread(f"http://127.0.0.1:{httpd.server_address[1]}/p", KEY, 9.0, Held())
        pinger.ping_now()
        pinger.stop()
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(WAIT)
    assert pinger.sent == 0
    assert any("answer over" in r.getMessage() for r in caplog.records)


async def test_the_thread_runs_the_lean_client_with_the_one_trust_store() -> None:
    pinger = HeartbeatThread("https://p.test/ping", KEY, 1.0, Held())
    backend = pinger.make_backend()
    try:
        assert isinstance(backend, HttpPool)
        assert backend.ssl_context is trust_context()
    finally:
        await backend.aclose()


def test_a_key_that_cannot_be_sent_is_refused_without_showing_it() -> None:
    with pytest.raises(ConfigurationError, match="Authorization") as caught:
        HeartbeatThread("http://p.test/ping", "rpa_key\r\nX: y", 1.0, Held())
    assert "rpa_key" not in str(caught.value)

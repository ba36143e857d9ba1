"""start_app's worker over real loopback HTTP, with a real FastAPI app (trio backend).

Each test runs ``trio_worker.testing.serve_app`` (the worker ``start_app`` runs, minus the
process) and talks to it with httpx. Loads and requests wait on events the test sets, so
no test sleeps; the few bounds (``failure_hold``, ``shutdown_grace``) are milliseconds.
"""

from __future__ import annotations

import functools
import json
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
from fastapi import FastAPI, Request

import trio_worker
from trio_worker.testing import AppHandle, serve_app

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

FAST = trio_worker.Timings(failure_hold=0.01, shutdown_grace=5.0)


class Probe:
    """What the app saw: the routes it ran, and events the test releases."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.loaded = trio.Event()
        self.release = trio.Event()
        self.entered = trio.Event()
        self.lifespan_ended = False


def make_app(probe: Probe, *, lifespan_load: bool = False, own_ping: bool = False) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        if lifespan_load:
            await probe.loaded.wait()
        yield {"model": "loaded-in-lifespan"}
        probe.lifespan_ended = True

    app = FastAPI(lifespan=lifespan)

    @app.get("/hello")
    async def hello(request: Request) -> dict[str, Any]:
        probe.calls.append("hello")
        return {"hello": True, "model": getattr(request.state, "model", None)}

    @app.get("/slow")
    async def slow() -> dict[str, bool]:
        probe.calls.append("slow")
        probe.entered.set()
        await probe.release.wait()
        return {"slow": True}

    if own_ping:

        @app.get("/ping")
        async def ping() -> dict[str, bool]:
            probe.calls.append("ping")
            return {"mine": True}

    return app


async def start(nursery: trio.Nursery, app: FastAPI, **kwargs: Any) -> AppHandle:
    kwargs.setdefault("timings", FAST)
    handle: AppHandle = await nursery.start(functools.partial(serve_app, app, **kwargs))
    return handle


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


async def test_ping_is_204_and_routes_503_while_loading_then_200(
    nursery: trio.Nursery, client: httpx.AsyncClient
) -> None:
    probe = Probe()
    worker = await start(nursery, make_app(probe), initializer=probe.loaded.wait)
    ping = await client.get(worker.url + "/ping")
    assert ping.status_code == 204 and ping.content == b""
    refused = await client.get(worker.url + "/hello")
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "5"
    assert refused.json()["status"] == "loading"
    assert "loading" in refused.json()["error"]
    assert probe.calls == []  # the app never ran before it was ready
    probe.loaded.set()
    await worker.wait_phase("ready")
    assert (await client.get(worker.url + "/ping")).status_code == 200
    served = await client.get(worker.url + "/hello")
    assert served.json() == {"hello": True, "model": "loaded-in-lifespan"}
    assert probe.calls == ["hello"]
    worker.shutdown()


async def test_the_apps_own_ping_is_consulted_only_once_ready(
    nursery: trio.Nursery, client: httpx.AsyncClient
) -> None:
    probe = Probe()
    worker = await start(nursery, make_app(probe, own_ping=True), initializer=probe.loaded.wait)
    assert (await client.get(worker.url + "/ping")).status_code == 204
    assert probe.calls == []
    probe.loaded.set()
    await worker.wait_phase("ready")
    answer = await client.get(worker.url + "/ping")
    assert (answer.status_code, answer.json()) == (200, {"mine": True})
    assert probe.calls == ["ping"]
    worker.shutdown()


async def test_without_an_initializer_the_lifespan_startup_is_the_load(
    nursery: trio.Nursery, client: httpx.AsyncClient
) -> None:
    probe = Probe()
    worker = await start(nursery, make_app(probe, lifespan_load=True))
    assert (await client.get(worker.url + "/ping")).status_code == 204
    assert (await client.get(worker.url + "/hello")).status_code == 503
    probe.loaded.set()
    await worker.wait_phase("ready")
    assert (await client.get(worker.url + "/ping")).status_code == 200
    assert (await client.get(worker.url + "/hello")).json()["model"] == "loaded-in-lifespan"
    worker.shutdown()
    await worker.wait_ended()
    assert worker.status == 0 and probe.lifespan_ended


async def test_a_failed_load_answers_its_reason_without_secrets_then_exits_1(
    nursery: trio.Nursery, client: httpx.AsyncClient
) -> None:
    secret = "sk-live-0123456789abcdef"

    def load() -> None:
        raise RuntimeError(f"CUDA out of memory. Tried to allocate 2 GiB (key {secret})")

    probe = Probe()
    hold = trio_worker.Timings(failure_hold=30.0)
    worker = await start(
        nursery,
        make_app(probe),
        initializer=load,
        timings=hold,
        environ={"RUNPOD_AI_API_KEY": secret},
    )
    await worker.wait_phase("failed")
    for path in ("/ping", "/hello"):
        answer = await client.get(worker.url + path)
        assert answer.status_code == 503
        body = answer.json()
        assert body["error_category"] == "out_of_memory"
        assert body["error_type"] == "RuntimeError"
        assert "CUDA out of memory" in body["error"]
        assert secret not in answer.text and "[REDACTED]" in body["error"]
        assert "traceback" not in answer.text.lower() and "logs" not in body
    assert probe.calls == []
    worker.shutdown()  # a SIGTERM during the hold ends it at once, still with status 1
    await worker.wait_ended()
    assert worker.status == 1


async def test_a_failed_load_is_held_for_failure_hold_then_status_1(
    nursery: trio.Nursery, client: httpx.AsyncClient
) -> None:
    def load() -> None:
        raise FileNotFoundError("/models/llama.safetensors")

    worker = await start(nursery, make_app(Probe()), initializer=load)
    await worker.wait_ended()
    assert worker.status == 1


@pytest.mark.parametrize(
    ("error", "category", "error_type"),
    [(None, "timeout", "InitTimeout"), (TimeoutError("the hub timed out"), None, "TimeoutError")],
)
async def test_only_the_sdks_deadline_is_a_timeout(
    nursery: trio.Nursery,
    client: httpx.AsyncClient,
    error: BaseException | None,
    category: str | None,
    error_type: str,
) -> None:
    async def load() -> None:
        if error is not None:
            raise error
        await trio.sleep_forever()

    hold = trio_worker.Timings(failure_hold=30.0)
    worker = await start(
        nursery, make_app(Probe()), initializer=load, init_timeout=0.005, timings=hold
    )
    await worker.wait_phase("failed")
    body = (await client.get(worker.url + "/ping")).json()
    assert body["error_type"] == error_type
    if category is None:
        assert body["error_category"] != "timeout"
    else:
        assert body["error_category"] == category
    worker.shutdown()


async def test_sigterm_stops_200_at_once_and_lets_requests_in_flight_finish(
    nursery: trio.Nursery, client: httpx.AsyncClient
) -> None:
    probe = Probe()
    worker = await start(nursery, make_app(probe))
    await worker.wait_phase("ready")
    answers: list[httpx.Response] = []

    async def slow() -> None:
        answers.append(await client.get(worker.url + "/slow"))

    nursery.start_soon(slow)
    await probe.entered.wait()
    worker.shutdown()
    ping = await client.get(worker.url + "/ping")
    assert ping.status_code == 503 and ping.json()["status"] == "draining"
    late = await client.get(worker.url + "/hello")
    assert late.status_code == 503
    assert probe.calls == ["slow"]  # the late request never reached the app
    probe.release.set()
    await worker.wait_ended()
    assert [a.status_code for a in answers] == [200]
    assert worker.status == 0 and probe.lifespan_ended


async def test_requests_still_running_when_the_grace_ends_get_503(
    nursery: trio.Nursery, client: httpx.AsyncClient
) -> None:
    probe = Probe()
    worker = await start(nursery, make_app(probe), timings=trio_worker.Timings(shutdown_grace=0.01))
    await worker.wait_phase("ready")
    answers: list[httpx.Response] = []
    answered = trio.Event()

    async def slow() -> None:
        answers.append(await client.get(worker.url + "/slow"))
        answered.set()

    nursery.start_soon(slow)
    await probe.entered.wait()
    worker.shutdown()
    await worker.wait_ended()
    await answered.wait()
    assert answers[0].status_code == 503
    assert "shut down" in json.loads(answers[0].content)["error"]
    assert worker.status == 0


async def test_a_separate_health_port_serves_ping_alone(
    nursery: trio.Nursery, client: httpx.AsyncClient
) -> None:
    probe = Probe()
    worker = await start(nursery, make_app(probe, own_ping=True), health_port=0)
    assert worker.url != worker.health_url
    await worker.wait_phase("ready")
    assert (await client.get(worker.health_url + "/ping")).json() == {"mine": True}
    assert (await client.get(worker.health_url + "/hello")).status_code == 404
    assert (await client.get(worker.url + "/hello")).status_code == 200
    worker.shutdown()


@pytest.mark.parametrize(
    "app",
    [
        42,
        lambda environ, start_response: [b"a WSGI app"],  # Flask's shape
        lambda scope: None,  # an ASGI 2 app's outer callable
    ],
)
async def test_what_is_not_an_asgi_3_app_is_refused_in_one_line(app: Any) -> None:
    with pytest.raises(trio_worker.ConfigurationError, match="must be an ASGI 3 application"):
        await serve_app(app)

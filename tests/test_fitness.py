"""Fitness checks: the registry, the runner and the gate (docs/reference.md, Fitness checks).

The gate runs here in process against the fake platform over the lean client's in-memory
streams, in virtual time; the real worker process, the GPU checks' child processes and a
fake ``nvidia-smi`` are in tests/integration/test_fitness.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import threading
import types
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import sniffio
import trio
import trio.lowlevel

import trio_worker
from trio_worker import ConfigurationError
from trio_worker._backends import BACKENDS
from trio_worker._fitness import FitnessCheckFailed, check_fitness, check_then_serve
from trio_worker._fitness import _gate as gate_module
from trio_worker._fitness import _registry as registry
from trio_worker._fitness._reach import unhealthy_ping_url
from trio_worker.testing import FakePlatform, Fault

from .backends import BOTH_BACKENDS
from .fitness_gate import (
    BASE,
    ENV,
    empty_registry_fixture,  # noqa: F401 (a fixture)
    gate,
    memory_platform_fixture,  # noqa: F401 (a fixture)
    settings,
    unhealthy,
)

# -- the decorator ------------------------------------------------------------------------


def test_decorator_returns_the_function_and_keeps_registration_order(
    empty_registry: list[Callable[[], Any]],
) -> None:
    def first() -> None: ...

    async def second() -> None: ...

    assert trio_worker.register_fitness_check(first) is first
    assert trio_worker.register_fitness_check(second) is second
    assert empty_registry == [first, second]
    assert "register_fitness_check" in trio_worker.__all__


def test_a_check_is_named_as_the_reference_names_it() -> None:
    class DiskProbe:
        def __call__(self) -> None: ...

    def gpu_ok(minimum: int) -> None: ...

    assert registry.check_name(gpu_ok) == "gpu_ok"
    assert registry.check_name(functools.partial(gpu_ok, 1)) == "gpu_ok"
    assert registry.check_name(DiskProbe()) == "DiskProbe"


def test_decorator_refuses_what_cannot_be_called() -> None:
    with pytest.raises(TypeError, match="expects a callable"):
        trio_worker.register_fitness_check(42)  # type: ignore[type-var]


# -- running them -------------------------------------------------------------------------


@BOTH_BACKENDS
async def test_sync_and_async_checks_run_in_order_on_the_backend(
    backend: str, memory_platform: tuple[FakePlatform, Any]
) -> None:
    # Real time: a thread's work is invisible to an autojumping clock.
    ran: list[str] = []

    @trio_worker.register_fitness_check
    def sync_check() -> None:
        ran.append(f"sync in {threading.current_thread().name}")

    @trio_worker.register_fitness_check
    async def async_check() -> None:
        if backend == "asyncio":
            await asyncio.sleep(0)  # asyncio code, as a check written for runpod is
        ran.append(f"async on {sniffio.current_async_library()}")

    await gate(memory_platform, backend=backend)
    assert ran == ["sync in trio_worker fitness check sync_check", f"async on {backend}"]
    assert unhealthy(memory_platform[0]) == []


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_failing_check_is_pinged_as_unhealthy_and_stops_the_rest(
    kind: str, memory_platform: tuple[FakePlatform, Any], caplog: pytest.LogCaptureFixture
) -> None:
    later: list[str] = []

    def sync_fail() -> None:
        raise RuntimeError("GPU not available")

    async def async_fail() -> None:
        await trio.lowlevel.checkpoint()
        raise RuntimeError("GPU not available")

    trio_worker.register_fitness_check(sync_fail if kind == "sync" else async_fail)
    trio_worker.register_fitness_check(lambda: later.append("ran"))
    with pytest.raises(FitnessCheckFailed) as failed:
        await gate(memory_platform)
    name = f"{kind}_fail"
    assert failed.value.check == name
    assert later == []
    (query,) = unhealthy(memory_platform[0])
    assert query["check"] == name
    assert query["reason"] == "RuntimeError: GPU not available"
    assert "job_id" not in query
    assert f"fitness check {name} failed: RuntimeError: GPU not available" in caplog.text


async def test_the_reason_is_redacted_then_clipped_to_256_characters(
    memory_platform: tuple[FakePlatform, Any],
) -> None:
    secret = "s3cr3t-value-of-the-token"

    @trio_worker.register_fitness_check
    def leaky() -> None:
        raise ValueError(f"cannot log in with {secret} " + "x" * 600)

    with pytest.raises(FitnessCheckFailed):
        await gate(memory_platform, {"HF_TOKEN": secret})
    (query,) = unhealthy(memory_platform[0])
    assert secret not in query["reason"]
    assert query["reason"].startswith("ValueError: cannot log in with [REDACTED] xxx")
    assert len(query["reason"]) == 256


async def test_the_ping_keeps_the_templates_query_and_the_worker_id() -> None:
    url = unhealthy_ping_url(f"{BASE}/ping/w1?gpu=g", "_disk_check", "a&b=c")
    parts = urlsplit(url)
    assert parts.path == "/v2/ep/ping/w1"
    query = parse_qs(parts.query)
    assert query["gpu"] == ["g"]
    assert query["status"] == ["unhealthy"]
    assert query["check"] == ["_disk_check"]
    assert query["reason"] == ["a&b=c"]
    assert parts.query.index("status=") < parts.query.index("check=") < parts.query.index("reason=")


async def test_a_hanging_sync_check_fails_after_its_bound_and_its_thread_is_left(
    memory_platform: tuple[FakePlatform, Any], virtual_clock: trio.abc.Clock
) -> None:
    release = threading.Event()

    @trio_worker.register_fitness_check
    def stuck_driver() -> None:
        release.wait()

    try:
        started = trio.current_time()
        with pytest.raises(FitnessCheckFailed) as failed:
            await gate(memory_platform, fitness_check_timeout=30.0)
        assert trio.current_time() - started == pytest.approx(30.0, abs=2.5)
    finally:
        release.set()
    assert failed.value.reason == "FitnessCheckTimeout: did not finish within 30s"
    (query,) = unhealthy(memory_platform[0])
    assert query["check"] == "stuck_driver"


@BOTH_BACKENDS
async def test_a_hanging_async_check_fails_after_its_bound(
    backend: str, memory_platform: tuple[FakePlatform, Any], virtual_clock: trio.abc.Clock
) -> None:
    @trio_worker.register_fitness_check
    async def never() -> None:
        if backend == "asyncio":
            await asyncio.Event().wait()
        await trio.sleep_forever()

    with pytest.raises(FitnessCheckFailed) as failed:
        await gate(memory_platform, backend=backend, fitness_check_timeout=7.0)
    assert failed.value.reason == "FitnessCheckTimeout: did not finish within 7s"


async def test_a_timeout_the_check_raises_itself_is_its_own_failure(
    memory_platform: tuple[FakePlatform, Any],
) -> None:
    # Real time: on trio an async check has a run (and a clock) of its own.
    @trio_worker.register_fitness_check
    async def impatient() -> None:
        with trio.fail_after(0.01):
            await trio.sleep_forever()

    with pytest.raises(FitnessCheckFailed) as failed:
        await gate(memory_platform)
    assert failed.value.reason.startswith("TooSlowError")


async def test_asyncio_code_on_trio_is_a_configuration_error_not_an_unhealthy_host(
    memory_platform: tuple[FakePlatform, Any],
) -> None:
    @trio_worker.register_fitness_check
    async def written_for_runpod() -> None:
        await asyncio.sleep(0)

    with pytest.raises(ConfigurationError, match=r'async_backend="asyncio"'):
        await gate(memory_platform, backend="trio")
    assert memory_platform[0].requests == []


async def test_the_ping_cannot_delay_the_exit_more_than_two_seconds(
    memory_platform: tuple[FakePlatform, Any], virtual_clock: trio.abc.Clock
) -> None:
    fake, _ = memory_platform
    fake.inject(Fault("ping", delay=600.0))
    # A built-in check fails on the worker's own run, where virtual time holds (a user's
    # check runs in a thread, or on trio in a run of its own, both on the real clock).
    too_little_memory = {"RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": "false", "RUNPOD_MIN_MEMORY_GB": "1e9"}

    started = trio.current_time()
    with pytest.raises(FitnessCheckFailed, match="_memory_check"):
        await gate(memory_platform, too_little_memory)
    assert trio.current_time() - started <= 2.5
    assert [r.route for r in fake.requests] == ["ping"]


async def test_no_ping_without_a_ping_url(memory_platform: tuple[FakePlatform, Any]) -> None:
    @trio_worker.register_fitness_check
    def broken() -> None:
        raise RuntimeError("no")

    env = {k: v for k, v in ENV.items() if k != "RUNPOD_WEBHOOK_PING"}
    _, opener = memory_platform
    with pytest.raises(FitnessCheckFailed):
        await check_fitness(settings(env), BACKENDS["trio"], env, open_stream=opener)
    assert memory_platform[0].requests == []


async def test_passing_checks_send_nothing(memory_platform: tuple[FakePlatform, Any]) -> None:
    trio_worker.register_fitness_check(lambda: None)
    await gate(memory_platform)
    assert memory_platform[0].requests == []


# -- runpod's own registry ----------------------------------------------------------------


@pytest.fixture
def runpod_checks(monkeypatch: pytest.MonkeyPatch) -> list[Callable[[], None]]:
    """What ``import runpod`` and its decorator leave behind (runpod itself is not used)."""

    def check_gpu() -> None: ...

    module = types.ModuleType("runpod.serverless.modules.rp_fitness")
    module._fitness_checks = [check_gpu]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "runpod", types.ModuleType("runpod"))
    monkeypatch.setitem(sys.modules, "runpod.serverless.modules.rp_fitness", module)
    return module._fitness_checks  # type: ignore[no-any-return]


async def test_checks_registered_with_runpod_are_named_in_one_warning(
    runpod_checks: list[Callable[[], None]],
    memory_platform: tuple[FakePlatform, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    await gate(memory_platform)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "runpod's register_fitness_check will not run (check_gpu)" in warnings[0].message


async def test_no_warning_when_runpods_registry_is_empty(
    runpod_checks: list[Callable[[], None]],
    memory_platform: tuple[FakePlatform, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    runpod_checks.clear()
    await gate(memory_platform)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


async def test_the_worker_starts_only_once_every_check_passed(
    memory_platform: tuple[FakePlatform, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    # The gate as start() runs it, with the fake's in-memory network for the ping.
    _, opener = memory_platform
    real = gate_module.check_fitness
    monkeypatch.setattr(
        gate_module,
        "check_fitness",
        lambda *args, **kwargs: real(*args, **kwargs, open_stream=opener),
    )

    async def serve() -> None:
        events.append("worker started")

    @trio_worker.register_fitness_check
    async def slow_but_fine() -> None:
        await trio.sleep(0.001)
        events.append("check passed")

    await check_then_serve(settings(ENV), BACKENDS["trio"], ENV, serve)
    assert events == ["check passed", "worker started"]

    @trio_worker.register_fitness_check
    def broken() -> None:
        raise RuntimeError("no")

    events.clear()
    with pytest.raises(FitnessCheckFailed):
        await check_then_serve(settings(ENV), BACKENDS["trio"], ENV, serve)
    assert events == ["check passed"]

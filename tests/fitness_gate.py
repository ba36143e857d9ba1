"""The fitness gate in process: a fake platform over in-memory streams, an empty registry
(the tests register their own checks), and the gate run as ``start()`` runs it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from trio_worker import Timings
from trio_worker._backends import BACKENDS
from trio_worker._config import Settings
from trio_worker._fitness import _registry as registry
from trio_worker._fitness import check_fitness
from trio_worker.testing import FakePlatform, memory_network

BASE = "http://platform.test/v2/ep"
ENV = {
    "RUNPOD_WEBHOOK_GET_JOB": f"{BASE}/job-take/$ID?gpu=g",
    "RUNPOD_WEBHOOK_POST_OUTPUT": f"{BASE}/job-done/$RUNPOD_POD_ID/$ID",
    "RUNPOD_WEBHOOK_PING": f"{BASE}/ping/$RUNPOD_POD_ID?gpu=g",
    "RUNPOD_AI_API_KEY": "fake-key",
    "RUNPOD_POD_ID": "w1",
    # The built-in checks have tests of their own below; these cases are about the user's.
    "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": "true",
    "RUNPOD_SKIP_GPU_CHECK": "true",
}


@pytest.fixture(name="empty_registry", autouse=True)
def empty_registry_fixture() -> Iterator[list[Callable[[], Any]]]:
    saved = list(registry._registered)
    registry._registered.clear()
    try:
        yield registry._registered
    finally:
        registry._registered[:] = saved


@pytest.fixture(name="memory_platform")
async def memory_platform_fixture() -> AsyncIterator[tuple[FakePlatform, Any]]:
    """A fake platform and the opener of in-memory streams to it (no sockets), unlike the
    ``platform`` fixture of tests/conftest.py, which serves one over loopback."""
    fake = FakePlatform()
    async with memory_network(fake) as opener:
        yield fake, opener


def settings(env: dict[str, str], fitness_check_timeout: float = 120.0) -> Settings:
    return Settings.from_environ(env, timings=Timings(fitness_check_timeout=fitness_check_timeout))


def unhealthy(fake: FakePlatform) -> list[dict[str, str]]:
    return [p.query for p in fake.pings if p.query.get("status") == "unhealthy"]


async def gate(
    platform: tuple[FakePlatform, Any],
    env: dict[str, str] | None = None,
    backend: str = "trio",
    fitness_check_timeout: float = 120.0,
) -> None:
    environ = {**ENV, **(env or {})}
    _, opener = platform
    await check_fitness(
        settings(environ, fitness_check_timeout),
        BACKENDS[backend],
        environ,
        open_stream=opener,
    )

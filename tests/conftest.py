"""Fixtures every test module may use."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

import trio_worker.testing
from tests.backends import HostLoopClock
from tests.installs import Install, install_by_pth, install_editable, install_wheel
from trio_worker.testing import FakePlatform, run_platform_server

if TYPE_CHECKING:
    from tests.supervisor_harness import Harness


def serve_in_process(
    platform: FakePlatform,
    handler: Any,
    *,
    backend: str | None = None,
    env: Mapping[str, str] | None = None,
    worker_id: str = "w1",
    **options: Any,
) -> functools.partial[Any]:
    """``trio_worker.testing.serve(handler, ...)`` against *platform* in this process, ready
    for ``nursery.start``: the platform is the worker's network (its ``app``, unless
    *options* give an ``open_stream``), wired by the platform's ``worker_env`` and *env*;
    the heartbeat is a task on trio's clock, no signal handler is installed, no log
    captured. *backend* is the ``async_backend`` (left to the worker's own choice when
    None), *worker_id* its ``RUNPOD_POD_ID``; *options* override the rest and pass any
    other argument of ``serve``."""
    options.setdefault("heartbeat", "task")
    options.setdefault("handle_signals", False)
    options.setdefault("capture_logs", "off")
    if "open_stream" not in options:
        options.setdefault("app", platform)
    if backend is not None:
        options["async_backend"] = backend
    environ = {**platform.worker_env("http://platform", worker_id=worker_id), **(env or {})}
    return functools.partial(trio_worker.testing.serve, handler, environ=environ, **options)


@pytest.fixture
def virtual_clock(request: pytest.FixtureRequest) -> trio.abc.Clock:
    """Virtual time with autojump on the backend the test runs: ``MockClock`` on trio, a
    :class:`HostLoopClock` shared with the loop on the asyncio host (``tests/backends.py``).

    pytest-trio runs a test on the clock found among its own arguments, so a test asks for
    this fixture by name.
    """
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("backend") == "asyncio":
        return HostLoopClock()
    return trio.testing.MockClock(autojump_threshold=0)


@dataclass
class Platform:
    """A fake platform served over loopback, and the environment a worker process needs to
    reach it."""

    fake: FakePlatform
    url: str
    ping_interval_ms: int = 200

    def env(self, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "TW_"))}
        env.update(self.fake.worker_env(self.url, ping_interval_ms=self.ping_interval_ms))
        # No PYTHONPATH: the worker imports the package as installed, as a user's does.
        env.pop("PYTHONPATH", None)
        env.update(overrides)
        return env


@pytest.fixture
def ping_interval_ms() -> int:
    """The heartbeat interval ``platform``'s worker environment asks for (a directory's
    conftest may override it)."""
    return 200


@pytest.fixture
async def platform(ping_interval_ms: int) -> AsyncIterator[Platform]:
    """A :class:`FakePlatform` served over real loopback HTTP (long-polls held 1 s)."""
    fake = FakePlatform(take_hold=1.0, stop_hold=1.0)
    async with run_platform_server(fake) as url:
        yield Platform(fake, url, ping_interval_ms)


@pytest.fixture
def harness(backend: str) -> Harness:
    """The worker on the test's ``backend`` against a fake platform whose long-polls hold
    5 s (``tests/supervisor_harness.py``).

    The test requests ``virtual_clock`` itself: pytest-trio picks the run's clock from the
    test's own arguments, not from fixtures' dependencies.
    """
    # Imported here: tests/supervisor_harness.py serves through serve_in_process above.
    from tests.supervisor_harness import Harness

    return Harness(FakePlatform(take_hold=5.0, stop_hold=5.0), backend)


class _Keeper(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def worker_log() -> Iterator[list[logging.LogRecord]]:
    """What the ``trio_worker`` logger hands its handlers, whatever logging tests before
    this one configured: the logger gets this one handler, and its level stays INFO."""
    logger = logging.getLogger("trio_worker")
    saved = (logger.handlers, logger.level, logger.propagate)
    keeper = _Keeper()
    logger.handlers, logger.propagate = [keeper], False
    logger.setLevel(logging.INFO)
    try:
        yield keeper.records
    finally:
        logger.handlers, logger.propagate = saved[0], saved[2]
        logger.setLevel(saved[1])


# The project installed for real, once per session (tests/installs.py): each fixture
# builds its environment the first time a test asks for it.


@pytest.fixture(scope="session")
def wheel_install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    """A virtual environment with the project installed from its wheel."""
    return install_wheel(tmp_path_factory.mktemp("wheel-install"))


@pytest.fixture(scope="session")
def editable_install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    """A virtual environment with the project installed by ``pip install -e``."""
    return install_editable(tmp_path_factory.mktemp("editable-install"))


@pytest.fixture(scope="session")
def pth_install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    """A virtual environment with the dependencies, and the package through a ``.pth``."""
    return install_by_pth(tmp_path_factory.mktemp("pth-install"))

"""Fixtures every test module may use."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import trio
import trio.testing

from tests.backends import HostLoopClock
from tests.installs import Install, install_by_pth, install_editable, install_wheel
from tests.supervisor_harness import Harness
from trio_worker.testing import FakePlatform


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


@pytest.fixture
def harness(backend: str) -> Harness:
    """The worker on the test's ``backend`` against a fake platform whose long-polls hold
    5 s (``tests/supervisor_harness.py``).

    The test requests ``virtual_clock`` itself: pytest-trio picks the run's clock from the
    test's own arguments, not from fixtures' dependencies.
    """
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

"""Fixtures every test module may use."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from tests.backends import HostLoopClock


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

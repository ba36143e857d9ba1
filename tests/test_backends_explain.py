"""``Backend.explain`` (trio_worker/_backends/): an error of asyncio code run on trio becomes
``AsyncioUnderTrio``, naming ``async_backend``; every other error is returned unchanged
(docs/design.md §2). The errors as a worker reports them are in tests/test_backend_choice.py.
"""

from __future__ import annotations

import asyncio

import pytest
import trio

import trio_worker
from trio_worker._backends import BACKENDS


async def test_a_missing_event_loop_on_trio_is_explained_with_the_cause_chained() -> None:
    with pytest.raises(RuntimeError) as info:
        asyncio.get_running_loop()
    original = info.value
    hinted = BACKENDS["trio"].explain(original)
    assert isinstance(hinted, trio_worker.AsyncioUnderTrio)
    assert isinstance(hinted, RuntimeError)
    assert 'async_backend="asyncio"' in str(hinted)
    assert str(original) in str(hinted)
    assert hinted.__cause__ is original
    assert hinted.__traceback__ is original.__traceback__
    # On asyncio the same error is the user's own.
    assert BACKENDS["asyncio"].explain(original) is original


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("There is no current event loop in thread 'x'."),
        ValueError("No running event loop"),
    ],
)
def test_other_event_loop_messages_are_explained_on_trio(exc: BaseException) -> None:
    assert isinstance(BACKENDS["trio"].explain(exc), trio_worker.AsyncioUnderTrio)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("CUDA error"),
        ValueError("event loop"),
        KeyError("loop"),
        AttributeError("'NoneType' object has no attribute 'create_future'"),  # not asyncio's
        trio.TooSlowError(),
    ],
)
@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_unrelated_errors_are_returned_unchanged(backend: str, exc: BaseException) -> None:
    assert BACKENDS[backend].explain(exc) is exc

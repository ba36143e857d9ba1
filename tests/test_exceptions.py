"""``_exceptions``: the one module that defines the public exceptions, and
``exception_leaves``, the package's one reading of an ExceptionGroup."""

from __future__ import annotations

import inspect

import trio

import trio_worker
from trio_worker import _exceptions
from trio_worker._exceptions import exception_leaves


def test_leaves_are_read_at_every_depth_in_order() -> None:
    first, second, third = ValueError("1"), KeyError("2"), SystemExit(3)
    group = BaseExceptionGroup("outer", [first, BaseExceptionGroup("inner", [second, third])])
    assert exception_leaves(group) == [first, second, third]
    assert exception_leaves(first) == [first]


def _cancelled() -> trio.Cancelled:
    async def caught() -> trio.Cancelled:
        with trio.CancelScope() as scope:
            scope.cancel()
            try:
                await trio.lowlevel.checkpoint()
            except trio.Cancelled as exc:
                return exc
        raise AssertionError("not cancelled")

    return trio.run(caught)


def test_ignored_types_are_left_out_at_every_depth() -> None:
    cancelled = _cancelled()
    error = RuntimeError("x")
    group = BaseExceptionGroup("g", [cancelled, BaseExceptionGroup("h", [cancelled, error])])
    assert exception_leaves(group, ignore=trio.Cancelled) == [error]
    assert exception_leaves(cancelled, ignore=trio.Cancelled) == []
    only_cancelled = BaseExceptionGroup("g", [cancelled, BaseExceptionGroup("h", [cancelled])])
    assert exception_leaves(only_cancelled, ignore=trio.Cancelled) == []
    assert exception_leaves(group, ignore=(trio.Cancelled, RuntimeError)) == []


def test_every_public_exception_is_defined_in_one_module() -> None:
    for name in trio_worker.__all__:
        obj = getattr(trio_worker, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            assert getattr(_exceptions, name) is obj, name

"""The backend rule as ``_options.worker_options`` applies it (docs/design.md §2, "Which
backend by default"): async user code (a handler, an initializer, a concurrency callable,
in either form of ``start()``) runs on asyncio unless the caller names ``async_backend``;
all-sync user code runs on trio. The rule through real workers is in
tests/test_backend_choice.py.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import pytest

from trio_worker._backends import BACKENDS
from trio_worker._options import worker_options


def sync_handler(job: dict[str, Any]) -> object:
    return job["input"]


async def async_handler(job: dict[str, Any]) -> object:
    return job["input"]


async def async_gen_handler(job: dict[str, Any]) -> AsyncIterator[object]:
    yield job["input"]


class AsyncModel:
    """A class-based handler holding its model in ``self``, called with ``async def``."""

    async def __call__(self, job: dict[str, Any]) -> object:
        return job["input"]


class AsyncStreamingModel:
    async def __call__(self, job: dict[str, Any]) -> AsyncIterator[object]:
        yield job["input"]


class SyncModel:
    def __call__(self, job: dict[str, Any]) -> object:
        return job["input"]


def sync_init() -> None:
    pass


async def async_init() -> None:
    pass


# --- the rule -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("handler", "options", "backend"),
    [
        (sync_handler, {}, "trio"),
        (sync_handler, {"initializer": sync_init}, "trio"),
        (sync_handler, {"concurrency": lambda n: 2}, "trio"),
        (async_handler, {}, "asyncio"),
        (async_gen_handler, {}, "asyncio"),
        (functools.partial(async_handler), {}, "asyncio"),
        (AsyncModel(), {}, "asyncio"),
        (functools.partial(AsyncModel()), {}, "asyncio"),
        (AsyncStreamingModel(), {}, "asyncio"),
        (SyncModel(), {}, "trio"),
        (async_handler, {"initializer": sync_init, "init_timeout": 5}, "asyncio"),
        (sync_handler, {"initializer": async_init}, "asyncio"),
        (sync_handler, {"initializer": functools.partial(async_init)}, "asyncio"),
        (async_handler, {"async_backend": "trio"}, "trio"),
        (sync_handler, {"async_backend": "asyncio"}, "asyncio"),
    ],
)
def test_the_default_backend_follows_the_users_code_in_both_forms(
    handler: Any, options: dict[str, Any], backend: str
) -> None:
    keyword = worker_options(handler, **options)
    named = options.pop("async_backend", None)
    config = {"handler": handler, **options}
    one_dict = worker_options(config, async_backend=named)
    assert keyword.async_backend == one_dict.async_backend == backend
    assert keyword.backend is BACKENDS[backend]


def test_an_async_concurrency_callable_counts_as_async_code() -> None:
    async def modifier(current: int) -> int:
        return current

    assert worker_options(sync_handler, concurrency=modifier).async_backend == "asyncio"  # type: ignore[arg-type]
    config = {"handler": sync_handler, "concurrency_modifier": modifier}
    assert worker_options(config).async_backend == "asyncio"

"""The public surface: what ``import trio_worker`` offers, and nothing private leaking."""

from __future__ import annotations

import inspect

import pytest

import trio_worker
import trio_worker.testing


@pytest.mark.parametrize("module", [trio_worker, trio_worker.testing])
def test_all_is_exactly_the_public_names(module: object) -> None:
    public = {name for name in vars(module) if not name.startswith("_")}
    public -= {"annotations"}  # from __future__
    submodules = {n for n in public if inspect.ismodule(getattr(module, n))}
    exported = set(module.__all__) - {"__version__"}  # type: ignore[attr-defined]
    assert exported == public - submodules


def test_public_names_report_the_public_module() -> None:
    for name in trio_worker.__all__:
        obj = getattr(trio_worker, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__module__ == "trio_worker", name


def test_root_exception_is_abstract() -> None:
    with pytest.raises(TypeError):
        trio_worker.TrioWorkerError("x")
    assert issubclass(trio_worker.ConfigurationError, ValueError)
    assert issubclass(trio_worker.RateLimited, trio_worker.PlatformError)


def test_start_and_serve_take_the_documented_arguments() -> None:
    for fn in (trio_worker.start, trio_worker.serve):
        params = inspect.signature(fn).parameters
        for name in (
            "initializer",
            "init_timeout",
            "concurrency",
            "return_aggregate_stream",
            "refresh_worker",
            "async_backend",
            "capture_logs",
        ):
            assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, (fn, name)


def test_package_ships_py_typed() -> None:
    from importlib.resources import files

    assert files("trio_worker").joinpath("py.typed").is_file()


async def test_serve_rejects_bad_arguments_before_anything_runs() -> None:
    env = {"RUNPOD_WEBHOOK_GET_JOB": "http://127.0.0.1:9/v2/e/job-take/$ID?gpu=x"}

    async def handler(job: object) -> None:
        return None

    with pytest.raises(trio_worker.ConfigurationError, match="concurrency"):
        await trio_worker.serve(handler, concurrency=0, environ=env, capture_logs="off")
    with pytest.raises(trio_worker.ConfigurationError, match="init_timeout"):
        await trio_worker.serve(handler, init_timeout=-1, environ=env, capture_logs="off")
    with pytest.raises(trio_worker.ConfigurationError, match='async_backend="asyncio"'):
        await trio_worker.serve(handler, async_backend="asyncio", environ=env)
    with pytest.raises(trio_worker.ConfigurationError, match="RUNPOD_WEBHOOK_GET_JOB"):
        await trio_worker.serve(handler, environ={}, capture_logs="off")
    with pytest.raises(trio_worker.ConfigurationError, match="capture_logs"):
        await trio_worker.serve(handler, environ=env, capture_logs="maybe")  # type: ignore[arg-type]

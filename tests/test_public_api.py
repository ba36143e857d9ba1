"""The public surface: what ``import trio_worker`` offers, and nothing private leaking."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import trio_worker
import trio_worker.testing


@pytest.mark.parametrize("module", [trio_worker, trio_worker.testing])
def test_all_is_exactly_the_public_names(module: object) -> None:
    for name in module.__all__:  # type: ignore[attr-defined]
        getattr(module, name)  # trio_worker imports its names on first use (PEP 562)
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


ENTRY_POINTS = [
    trio_worker.start,
    trio_worker.serve,
    trio_worker.start_app,
    trio_worker.testing.serve,
]
OWN_PARAMETERS = {"handler", "app", "task_status"} | {
    "open_stream",
    "wrap_backend",
    "heartbeat",
    "observers",
    "capture",
}


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda fn: fn.__qualname__)
def test_help_documents_every_keyword_of_every_entry_point(entry: Any) -> None:
    """The options are spelled out once (``_options.py``); ``help()`` still lists each."""
    doc = inspect.getdoc(entry)
    assert doc is not None
    keywords = doc.split("Keyword arguments:", 1)[1]
    params = inspect.signature(entry).parameters
    options = [name for name in params if name not in OWN_PARAMETERS]
    assert options, entry
    for name in options:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert f"\n    {name} (" in keywords, name


@pytest.mark.parametrize(
    ("entry", "keyword"),
    [
        (trio_worker.start, "concurency"),
        (trio_worker.start_app, "concurrency"),  # an app takes no jobs
        (trio_worker.start_app, "refresh_worker"),
    ],
)
def test_a_process_entry_point_refuses_a_keyword_it_does_not_take(entry: Any, keyword: str) -> None:
    """As Python refuses it, before anything runs (nothing parsed, logged or exited)."""
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
        entry(lambda job: None, **{keyword: 2})


@pytest.mark.parametrize("serve", [trio_worker.serve, trio_worker.testing.serve])
@pytest.mark.parametrize("keyword", ["crash_watch", "argv", "timing"])
async def test_serve_refuses_a_keyword_it_does_not_take(serve: Any, keyword: str) -> None:
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
        await serve(lambda job: None, environ={}, **{keyword: None})


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


def test_serve_carries_no_test_seams_and_testing_serve_has_them() -> None:
    import trio_worker.testing

    public = inspect.signature(trio_worker.serve).parameters
    testing = inspect.signature(trio_worker.testing.serve).parameters
    seams = {"open_stream", "wrap_backend", "app", "heartbeat", "observers", "capture"}
    assert not seams & set(public)
    assert set(testing) == set(public) | seams
    for name in public:
        assert testing[name].default == public[name].default, name


def test_internal_plumbing_is_not_exported() -> None:
    assert "serve_asgi" not in trio_worker.testing.__all__
    assert not {"Supervisor", "JobRunner", "Settings", "WorkerOptions"} & set(trio_worker.__all__)


SECOND_SIGINT = """
import functools, os, signal
import trio, trio_worker
from trio_worker.testing import FakePlatform, run_platform_server

async def main():
    platform = FakePlatform(take_hold=0.2, stop_hold=0.2)
    async with run_platform_server(platform) as url:
        platform.enqueue({})
        running = trio.Event()

        async def handler(job):
            running.set()
            await trio.sleep_forever()

        async def worker(task_status):
            try:
                await trio_worker.serve(
                    handler,
                    environ=platform.worker_env(url),
                    capture_logs="off",
                    timings=trio_worker.Timings(shutdown_grace=60.0),
                    task_status=task_status,
                )
            except BaseException as exc:
                print("raised", type(exc).__name__, flush=True)
                return
            print("returned", flush=True)

        async with trio.open_nursery() as nursery:
            handle = await nursery.start(worker)
            with trio.fail_after(20):
                await running.wait()
                os.kill(os.getpid(), signal.SIGINT)
                # trio merges a signal that arrives again before it is read: wait for the first.
                while not handle.statistics()["shutting_down"]:
                    await trio.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

trio.run(main)
"""


def test_second_sigint_raises_a_plain_keyboard_interrupt_from_serve(tmp_path: Path) -> None:
    script = tmp_path / "second_sigint.py"
    script.write_text(SECOND_SIGINT)
    # The installed package, as a user runs it: no PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "PYTHONPATH"))}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["raised", "KeyboardInterrupt"], done.stderr

"""A worker process for the integration tests: ``python worker_app.py SCENARIO [flags]``.

Each scenario is a handler/initializer pair that behaves the way real model code does
(prints from Python, writes to the file descriptors, starts child processes, raises the
real error texts of PyTorch and CUDA, hangs). Knobs come from ``TW_*`` variables so the
test decides timings without editing this file.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import sniffio
import trio
import trio.lowlevel

import trio_worker

MODEL: dict[str, Any] = {}
CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 23.65 GiB"
    " of which 3.06 MiB is free. Process 4242 has 23.64 GiB memory in use."
)


def _env_float(name: str) -> float | None:
    raw = os.environ.get(name)
    return None if raw in (None, "", "none") else float(raw)


def _loud(tag: str) -> None:
    """Write the way native code and child processes do, not only through sys.stdout."""
    print(f"python stdout {tag}", flush=True)
    print(f"python stderr {tag}", file=sys.stderr, flush=True)
    os.write(1, f"fd1 raw write {tag}\n".encode())
    os.write(2, f"fd2 raw write {tag}\n".encode())
    subprocess.run(
        ["sh", "-c", f"echo child stdout {tag}; echo child stderr {tag} >&2"], check=True
    )


async def _sleep(seconds: float) -> None:
    """Sleep on whichever loop runs the handler (TW_BACKEND picks it)."""
    if sniffio.current_async_library() == "asyncio":
        await asyncio.sleep(seconds)
    else:
        await trio.sleep(seconds)


# -- initializers -------------------------------------------------------------------------


def init_ok() -> None:
    time.sleep(float(os.environ.get("TW_INIT_SECONDS", "0.3")))
    MODEL["ready"] = True


def init_oom() -> None:
    _loud("init")
    time.sleep(float(os.environ.get("TW_INIT_SECONDS", "1.0")))
    raise RuntimeError(CUDA_OOM)


async def init_async_raise_now() -> None:
    raise ValueError("model config missing: set MODEL_NAME")


def init_hang() -> None:
    print("loading weights...", flush=True)
    time.sleep(3600)


def init_cuda_fault() -> None:
    # A child that dies the way a CUDA fault kills a process: the message on fd 2, then abort.
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal; os.write(2, b'CUDA error: an illegal memory access was "
            "encountered\\nCompile with TORCH_USE_CUDA_DSA to enable device-side assertions."
            "\\n'); os.kill(os.getpid(), signal.SIGABRT)",
        ],
        check=False,
    )
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def init_user_timeout() -> None:
    raise TimeoutError("download of model.safetensors timed out")


def init_leaves_thread_then_raises() -> None:
    # A framework's non-daemon thread: sys.exit would wait for it for ever.
    threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
    raise RuntimeError("engine failed to start")


INITIALIZERS: dict[str, Callable[[], Any]] = {
    "ok": init_ok,
    "oom": init_oom,
    "async_raise_now": init_async_raise_now,
    "hang": init_hang,
    "cuda_fault": init_cuda_fault,
    "user_timeout": init_user_timeout,
    "leaves_thread": init_leaves_thread_then_raises,
}

# -- handlers -----------------------------------------------------------------------------


def echo(job: dict[str, Any]) -> Any:
    return {"echo": job["input"], "model_ready": MODEL.get("ready", False)}


async def async_echo(job: dict[str, Any]) -> Any:
    await _sleep(0)
    return {"echo": job["input"]}


def raises(job: dict[str, Any]) -> Any:
    _loud(job["id"])
    raise ValueError(f"bad input {job['input']!r}")


def sync_gen(job: dict[str, Any]) -> Iterator[Any]:
    for i in range(3):
        yield {"chunk": i}


async def async_gen(job: dict[str, Any]) -> AsyncIterator[Any]:
    for i in range(3):
        await _sleep(0)
        yield f"token-{i}"


async def gen_raises(job: dict[str, Any]) -> AsyncIterator[Any]:
    yield "first"
    print("about to fail mid-stream", flush=True)
    raise RuntimeError("decoder crashed mid-stream")


def non_json(job: dict[str, Any]) -> Any:
    return {"tags": {"a", "b"}}


def huge(job: dict[str, Any]) -> Any:
    return {"blob": "x" * (21 * 1024 * 1024)}


async def slow_async(job: dict[str, Any]) -> Any:
    await _sleep(float(job["input"].get("seconds", 60)))
    return {"slept": True}


async def swallows_cancel(job: dict[str, Any]) -> Any:
    # Catches the cancellation and keeps awaiting, shielded: it never returns.
    try:
        await trio.sleep(3600)
    except trio.Cancelled:
        print("handler swallowed the cancellation", flush=True)
        with trio.CancelScope(shield=True):
            await trio.sleep(3600)
    return {"never": True}


def slow_sync(job: dict[str, Any]) -> Any:
    deadline = time.monotonic() + float(job["input"].get("seconds", 60))
    while time.monotonic() < deadline:
        trio_worker.check_cancelled()
        time.sleep(0.005)
    return {"slept": True}


async def blocks_loop(job: dict[str, Any]) -> Any:
    time.sleep(float(job["input"].get("seconds", 2.5)))  # deliberately blocks the event loop
    return {"blocked": True}


async def progress(job: dict[str, Any]) -> Any:
    trio_worker.progress_update(job, {"step": 1})
    trio_worker.progress_update(job, {"step": 2})
    return {"done": True}


def uses_asyncio(job: dict[str, Any]) -> Any:
    return asyncio.get_running_loop()


async def async_uses_asyncio(job: dict[str, Any]) -> Any:
    asyncio.get_running_loop()
    return None


def exits(job: dict[str, Any]) -> Any:
    """worker-vllm on a CUDA error: sys.exit so the platform replaces the GPU; or sleeps."""
    if "seconds" in job["input"]:
        return slow_sync(job)
    if job["input"].get("interrupt"):
        raise KeyboardInterrupt
    sys.exit(job["input"]["code"])


async def async_exits(job: dict[str, Any]) -> Any:
    await _sleep(0)
    sys.exit(job["input"]["code"])


HANDLERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "exits": exits,
    "async_exits": async_exits,
    "echo": echo,
    "async_echo": async_echo,
    "raises": raises,
    "sync_gen": sync_gen,
    "async_gen": async_gen,
    "gen_raises": gen_raises,
    "non_json": non_json,
    "huge": huge,
    "slow_async": slow_async,
    "slow_sync": slow_sync,
    "swallows_cancel": swallows_cancel,
    "blocks_loop": blocks_loop,
    "progress": progress,
    "async_uses_asyncio": async_uses_asyncio,
}


def main() -> None:
    handler = HANDLERS[os.environ.get("TW_HANDLER", "echo")]
    init_name = os.environ.get("TW_INIT")
    timings = trio_worker.Timings(
        claim_grace=_env_float("TW_CLAIM_GRACE") or 10.0,
        report_deadline=_env_float("TW_REPORT_DEADLINE") or 10.0,
        shutdown_grace=_env_float("TW_SHUTDOWN_GRACE") or 20.0,
        exit_watchdog=_env_float("TW_EXIT_WATCHDOG") or 5.0,
    )
    trio_worker.start(
        handler,
        initializer=INITIALIZERS[init_name] if init_name else None,
        init_timeout=_env_float("TW_INIT_TIMEOUT"),
        concurrency=int(os.environ.get("TW_CONCURRENCY", "1")),
        return_aggregate_stream=os.environ.get("TW_AGGREGATE") == "1",
        refresh_worker=os.environ.get("TW_REFRESH") == "1",
        capture_logs="off" if os.environ.get("TW_CAPTURE") == "off" else "on",
        timings=timings,
        async_backend="asyncio" if os.environ.get("TW_BACKEND") == "asyncio" else "trio",
    )


if __name__ == "__main__":
    main()

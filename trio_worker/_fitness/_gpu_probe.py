"""The GPU probe: a child process that asks torch (or CuPy) whether the GPU works.

Run by :class:`trio_worker._fitness._gpu.GpuProbe` as ``python -P this_file.py``, never
imported by the worker, so a driver that hangs or crashes takes this process down, not the
worker. It imports nothing from trio_worker (nor trio), so it starts fast and does not
depend on how the package was installed.

Protocol: one step name per line on stdin (``devices``, ``init``, ``benchmark``); one answer
line per step on stdout, ``MARKER {"step", "status": "pass"|"fail"|"skip", "detail"}``.
Anything else on stdout or stderr (library warnings) is noise the parent keeps only to
explain a crash. End of stdin ends the process. ``argv[1]``: the benchmark's bound in
seconds (``RUNPOD_GPU_BENCHMARK_TIMEOUT``).
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from typing import Any

MARKER = "\x1etrio_worker-gpu-probe"


class Skip(Exception):
    """Nothing here can test this step (neither torch nor CuPy is installed)."""


def _library(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def devices(_: float) -> str:
    torch = _library("torch")
    if torch is not None:
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        count = torch.cuda.device_count()
        if count == 0:
            raise RuntimeError("torch sees no CUDA device")
        return f"{count} device(s) visible to torch"
    cupy = _library("cupy")
    if cupy is not None:
        count = cupy.cuda.runtime.getDeviceCount()
        if count == 0:
            raise RuntimeError("CuPy sees no CUDA device")
        return f"{count} device(s) visible to CuPy"
    raise Skip("neither torch nor CuPy is installed")


def init(_: float) -> str:
    torch = _library("torch")
    if torch is not None:
        # The reference skips when torch says no CUDA; a GPU is expected here, so that fails.
        if not torch.cuda.is_available():
            raise RuntimeError(
                "CUDA is not available to torch (torch.cuda.is_available() is False)"
            )
        count = torch.cuda.device_count()
        if count == 0:
            raise RuntimeError("No CUDA devices available despite cuda.is_available() being True")
        for index in range(count):
            if torch.cuda.get_device_properties(index).total_memory == 0:
                raise RuntimeError(f"GPU {index} reports zero memory")
            torch.zeros(1024, device=f"cuda:{index}")
            torch.cuda.synchronize(index)
        return f"{count} device(s) initialized"
    cupy = _library("cupy")
    if cupy is not None:
        count = cupy.cuda.runtime.getDeviceCount()
        if count == 0:
            raise RuntimeError("No CUDA devices available via CuPy")
        for index in range(count):
            with cupy.cuda.Device(index):
                cupy.zeros(1024)
                cupy.cuda.Device(index).synchronize()
        return f"{count} device(s) initialized"
    raise Skip("neither torch nor CuPy is installed")


def benchmark(bound: float) -> str:
    torch = _library("torch")
    cupy: Any = _library("cupy") if torch is None else None
    if torch is None and cupy is None:
        raise Skip("neither torch nor CuPy is installed")
    size = 1024
    started = time.perf_counter()
    if torch is not None:
        a = torch.randn(size, size, device="cuda")
        b = torch.randn(size, size, device="cuda")
        torch.matmul(a, b)
        torch.cuda.synchronize()
    else:
        a = cupy.random.randn(size, size)
        b = cupy.random.randn(size, size)
        cupy.matmul(a, b)
        cupy.cuda.Device().synchronize()
    elapsed_ms = (time.perf_counter() - started) * 1000
    if elapsed_ms > bound * 1000:
        raise RuntimeError(
            f"GPU compute too slow: Matrix multiply took {elapsed_ms:.0f}ms "
            f"(max: {bound * 1000:.0f}ms)"
        )
    return f"matrix multiply in {elapsed_ms:.0f} ms"


STEPS = {"devices": devices, "init": init, "benchmark": benchmark}


def answer(step: str, bound: float) -> dict[str, str]:
    run = STEPS.get(step)
    if run is None:
        return {"step": step, "status": "fail", "detail": f"unknown step {step!r}"}
    try:
        return {"step": step, "status": "pass", "detail": run(bound)}
    except Skip as skip:
        return {"step": step, "status": "skip", "detail": str(skip)}
    except Exception as exc:
        # The worker reports it as a RuntimeError; another type keeps its name in the text.
        text = str(exc) if type(exc) is RuntimeError else f"{type(exc).__name__}: {exc}"
        return {"step": step, "status": "fail", "detail": text}


def main() -> None:
    bound = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    for line in sys.stdin:
        step = line.strip()
        if step:
            sys.stdout.write(f"{MARKER} {json.dumps(answer(step, bound))}\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()

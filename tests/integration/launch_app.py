"""A handler file in the shapes published workers have, for the watchdog's two forms:
``python launch_app.py`` (fork at ``start()``) and ``trio-worker run launch_app.py``.

What it does before ``start()`` comes from ``TW_BEFORE`` (comma-separated):

* ``server``: ``subprocess.Popen`` a server, as worker-vllm's ``main.py`` starts
  ``vllm serve``; every job first checks ``poll()``, as that file does;
* ``numpy``: ``import numpy`` and a matrix product (OpenBLAS starts its thread pool);
* ``native_thread``: a thread started by C code (``pthread_create``), which no
  ``pthread_atfork`` handler stops: what GNU OpenMP's pool is after a parallel region;
* ``opt_out``: ``TRIO_WORKER_CRASH_WATCH=0`` set by the file itself.

A job's input says what it does: ``{"crash": true}`` dies by SIGSEGV; ``{"matmul": n}``
returns a numpy product's sum; ``{"orphan": true}`` leaves a grandchild to be re-parented
and returns its pid; ``{"reaped": pid}`` says whether that pid was reaped; ``{"fail":
text}`` prints *text* and raises; ``{"seconds": s}`` sleeps.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio_worker

BEFORE = set(filter(None, os.environ.get("TW_BEFORE", "").split(",")))
print(f"app pid {os.getpid()}", flush=True)

SERVER: subprocess.Popen[bytes] | None = None
if "server" in BEFORE:
    # Reads until its stdin closes: it goes when the worker does, whoever reaps it.
    code = "import sys; sys.stdin.read()"
    SERVER = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)

if "numpy" in BEFORE:
    import numpy

    numpy.ones((64, 64)) @ numpy.ones((64, 64))

if "native_thread" in BEFORE:
    libc = ctypes.CDLL(None)
    thread = ctypes.c_ulong()
    # pause() as the thread's body: it blocks until a signal, for the process's life.
    libc.pthread_create(ctypes.byref(thread), None, libc.pause, None)


if "opt_out" in BEFORE:
    os.environ["TRIO_WORKER_CRASH_WATCH"] = "0"


def _state(pid: int) -> str:
    """``R``, ``S``, ``Z``... from /proc; ``gone`` once the pid was reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rpartition(")")[2].split()[0]


def handler(job: dict[str, Any]) -> Any:
    work = job["input"]
    if SERVER is not None and SERVER.poll() is not None:
        raise RuntimeError(f"server process is not running (poll() = {SERVER.poll()})")
    print(f"job {job['id']} started", flush=True)
    if work.get("crash"):
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    if "matmul" in work:
        import numpy

        n = int(work["matmul"])
        return {"sum": float((numpy.ones((n, n)) @ numpy.ones((n, n))).sum())}
    if work.get("orphan"):
        # sh starts sleep and exits at once: sleep's parent is then PID 1 (or a subreaper).
        done = subprocess.run(["sh", "-c", "sleep 0.2 & echo $!"], capture_output=True)
        return {"orphan": int(done.stdout)}
    if "reaped" in work:
        deadline = time.monotonic() + 5
        while _state(work["reaped"]) != "gone" and time.monotonic() < deadline:
            time.sleep(0.02)
        return {"state": _state(work["reaped"])}
    if "fail" in work:
        print(work["fail"], flush=True)
        raise ValueError("the handler failed")
    time.sleep(float(work.get("seconds", 0)))
    return {"ok": True}


trio_worker.start(
    handler,
    capture_logs="off" if os.environ.get("TW_CAPTURE") == "off" else "on",
    crash_watch=os.environ.get("TW_CRASH_WATCH", "1") == "1",
    timings=trio_worker.Timings(shutdown_grace=float(os.environ.get("TW_GRACE", "5"))),
)

"""Scenarios for tests/test_capture.py, each run in its own process.

fd-level capture can't be tested inside pytest, which has dup2'ed fds 1/2 itself (see
https://docs.pytest.org/en/stable/how-to/capture-stdout-stderr.html).
Usage: ``python capture_child.py SCENARIO RESULT_JSON``; the scenario writes what it
observed to RESULT_JSON, and the parent test also checks the
child's real stdout/stderr (what passed through).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trio_worker._capture import (
    OutputCapture,
    install_python_stream_attribution,
    job_output,
    logs_for_job,
)
from trio_worker._capture._fd import READER_THREAD_NAME
from trio_worker._capture._redact import Redactor

if TYPE_CHECKING:
    from collections.abc import Callable

Result = dict[str, Any]

GIL_HELD_BYTES = 768 * 1024


def _install(tail_bytes: int = 1 << 20) -> OutputCapture:
    return OutputCapture.install(redactor=Redactor.from_environ(os.environ), tail_bytes=tail_bytes)


def _identity(fd: int) -> list[int]:
    st = os.fstat(fd)
    return [st.st_dev, st.st_ino]


def _reader_threads() -> int:
    return sum(t.name == READER_THREAD_NAME for t in threading.enumerate())


def catches() -> Result:
    cap = _install()
    print("before-mark", flush=True)
    mark = cap.mark()
    # Nothing below flushes: mark/text_since must flush Python and C stdio themselves.
    print("py-stdout")
    print("py-stderr", file=sys.stderr)
    os.write(1, b"raw-fd1\n")
    os.write(2, b"raw-fd2\n")
    ctypes.CDLL(None).printf(b"c-printf %d\n", ctypes.c_int(42))
    subprocess.run(["sh", "-c", "echo child-out; echo child-err >&2"], check=True)
    print("py-unflushed-last", end="")
    return {"text": cap.text_since(mark)}


def order() -> Result:
    cap = _install()
    for i in range(300):
        print(f"py {i}", flush=True)
        os.write(1, f"raw {i}\n".encode())
        print(f"err {i}", file=sys.stderr, flush=True)
        os.write(2, f"rawerr {i}\n".encode())
        if i % 30 == 0:
            subprocess.run(["sh", "-c", f"echo child {i}; echo childerr {i} >&2"], check=True)
    return {"captured": cap.tail(1 << 20)}


def volume() -> Result:
    cap = _install()
    sent = hashlib.sha256()
    line = "v" * 999 + "\n"
    for _ in range(15_000):  # 15 MB through print (block-buffered: no PYTHONUNBUFFERED)
        print(line, end="")
        sent.update(line.encode())
    sys.stdout.flush()  # or its last buffered block would land after the os.write()s
    block = (b"w" * 999 + b"\n") * 1000
    for _ in range(15):  # 15 MB through os.write, 1 MB a call
        view = memoryview(block)
        while view:
            view = view[os.write(1, view) :]
        sent.update(block)
    tail = cap.tail(1 << 30)
    return {
        "sent_sha256": sent.hexdigest(),
        "tail_bytes": len(tail.encode()),
        "tail_end": tail[-2000:],
        "mark": cap.mark(),
    }


def gil_held_write() -> Result:
    cap = _install()
    pipe_size = fcntl.fcntl(1, fcntl.F_GETPIPE_SZ)
    # A C call that writes while holding the GIL: the reader can't run until it returns,
    # so the write must fit in the (emptied) pipe. This is why the pipe is grown to 1 MiB.
    cap.flush()
    gil_holder = ctypes.PyDLL(None).write
    gil_holder.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    written = gil_holder(1, b"g" * (GIL_HELD_BYTES - 1) + b"\n", GIL_HELD_BYTES)
    return {"pipe_size": pipe_size, "written": written, "mark": cap.mark()}


def marks() -> Result:
    cap = _install()
    start = cap.mark()
    # Each mark must count every byte written before it, even while the reader is between
    # reading a chunk and recording it.
    wrong = []
    for i in range(1, 3001):
        os.write(1, b"m" * 99 + b"\n")
        if cap.mark() != start + 100 * i:
            wrong.append(i)
    return {"wrong": wrong}


def exit_without_stop() -> Result:
    _install()
    # Left in Python's and libc's buffers; flushed at interpreter exit, which must find
    # the real fds 1/2 again (atexit) or the output is lost in an unread pipe.
    print("py-last-words", end="")
    ctypes.CDLL(None).printf(b"c-last-words\n")
    return {}


def redact() -> Result:
    secret = os.environ["HF_TOKEN"].encode()
    cap = _install()
    print(f"token is {secret.decode()}", flush=True)
    # The secret split over two writes, with a mark between them.
    os.write(1, b"head " + secret[:7])
    mark = cap.mark()
    os.write(1, secret[7:] + b" tail\n")
    result: Result = {"printed": cap.tail(), "since": cap.text_since(mark)}
    cap.stop()
    # The window's start at every offset inside the secret (tail_bytes=64).
    edges = []
    for k in range(len(secret) + 1):
        cap = _install(tail_bytes=64)
        os.write(1, b"." * 100 + secret + b"." * (63 - k) + b"\n")
        edges.append([cap.tail(), cap.text_since(0, limit=1 << 20)])
        cap.stop()
    result["edges"] = edges
    # A cut inside a two-byte character moves back to its start instead of showing U+FFFD.
    cap = _install(tail_bytes=64)
    os.write(1, "é".encode() * 40 + b"\n")
    result["multibyte"] = cap.tail()
    cap.stop()
    return result


def stop() -> Result:
    before = [_identity(1), _identity(2)]
    fds_before = sorted(os.listdir("/proc/self/fd"))
    cap = _install()
    print("captured", flush=True)
    during = [_identity(1), _identity(2)]
    cap.stop()
    cap.stop()  # idempotent
    os.write(1, b"after-stop\n")
    return {
        "before": before,
        "during": during,
        "after": [_identity(1), _identity(2)],
        "active": cap.active,
        "readers": _reader_threads(),
        "tail": cap.tail(),
        "fds_leaked": sorted(set(os.listdir("/proc/self/fd")) - set(fds_before)),
    }


def stop_with_child() -> Result:
    cap = _install()
    # The child inherits the pipe as its stdout and holds it until it has read a line.
    child = subprocess.Popen(["sh", "-c", "read word; echo late-$word"], stdin=subprocess.PIPE)
    assert child.stdin is not None
    started = time.monotonic()
    cap.stop()
    stop_seconds = time.monotonic() - started
    readers_while_child = _reader_threads()
    child.stdin.write(b"child\n")
    child.stdin.close()
    returncode = child.wait(timeout=10)
    for thread in threading.enumerate():
        if thread.name == READER_THREAD_NAME:
            thread.join(timeout=10)
    return {
        "stop_seconds": stop_seconds,
        "returncode": returncode,
        "readers_while_child": readers_while_child,
        "readers_after_child": _reader_threads(),
        "tail": cap.tail(),
    }


def nested() -> Result:
    original = _identity(1)
    outer = _install()
    inner = _install()
    print("in-both", flush=True)
    inner.stop()
    print("outer-only", flush=True)
    outer.stop()
    print("in-neither", flush=True)
    result: Result = {
        "inner": inner.tail(),
        "outer": outer.tail(),
        "restored": _identity(1) == original,
        "readers": _reader_threads(),
    }
    # Someone else (pytest's capfd, another library) redirects fd 1 after us: stop() must
    # leave their redirection alone rather than clobber it with our saved fd.
    real_stdout = os.dup(1)
    mine = _install()
    with open("foreign.txt", "wb") as foreign:
        os.dup2(foreign.fileno(), 1)
        mine.stop()
        result["foreign_kept"] = _identity(1) == _identity(foreign.fileno())
    os.dup2(real_stdout, 1)
    os.close(real_stdout)
    return result


def logs() -> Result:
    secret = os.environ["HF_TOKEN"]
    cap = _install()
    install_python_stream_attribution()
    print("setup noise", flush=True)
    mark = cap.mark()
    with job_output("job-a") as job_a:
        print("job-a says hi")
        print(f"job-a token {secret}")
        os.write(1, b"c-level line\n")
        subprocess.run(["sh", "-c", "echo from-child >&2"], check=True)
    with job_output("job-b"):
        print("job-b says hi", file=sys.stderr)
    result: Result = {
        "single": logs_for_job(cap, job_a, mark, shared_process=False),
        "shared": logs_for_job(cap, job_a, mark, shared_process=True),
        "no_job": logs_for_job(cap, None, mark, shared_process=True),
        "off": logs_for_job(None, job_a, mark, shared_process=True),
    }
    mark = cap.mark()
    with job_output("job-c") as job_c:
        for i in range(200):
            print(f"own {i:03}")
        sys.stdout.flush()
    for i in range(200):
        os.write(1, f"proc {i:03}\n".encode())
    result["bounded"] = logs_for_job(cap, job_c, mark, shared_process=True, limit=300)
    return result


SCENARIOS: dict[str, Callable[[], Result]] = {
    f.__name__: f
    for f in (
        catches,
        order,
        volume,
        gil_held_write,
        marks,
        redact,
        stop,
        stop_with_child,
        nested,
        logs,
        exit_without_stop,
    )
}

if __name__ == "__main__":
    outcome = SCENARIOS[sys.argv[1]]()
    Path(sys.argv[2]).write_text(json.dumps(outcome), encoding="utf-8")

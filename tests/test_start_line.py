"""The "worker starting" line shows the wiring, never a password in a URL (docs/security.md)."""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER = "import trio_worker\ntrio_worker.start(lambda job: job)\n"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _first_line_with(text: str, proc: subprocess.Popen[str], seconds: float = 30.0) -> str:
    assert proc.stderr is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if selector.select(timeout=deadline - time.monotonic()):
            line = proc.stderr.readline()
            if not line:
                break
            if text in line:
                return line
    raise AssertionError(f"no line with {text!r} in the worker's log")


def test_the_starting_line_hides_passwords_in_the_take_and_ping_urls(tmp_path: Path) -> None:
    # Before: {"take": "http://user:s3cret@127.0.0.1:.../job-take/w1", "ping": ...} verbatim.
    base = f"http://user:s3cret@127.0.0.1:{_closed_port()}/v2/ep"
    not_ours = ("RUNPOD_", "TW_", "PYTHONPATH")  # the installed package, as a user runs it
    env = {k: v for k, v in os.environ.items() if not k.startswith(not_ours)}
    env.update(
        RUNPOD_WEBHOOK_GET_JOB=f"{base}/job-take/$ID",
        RUNPOD_WEBHOOK_POST_OUTPUT=f"{base}/job-done/$RUNPOD_POD_ID/$ID",
        RUNPOD_WEBHOOK_PING=f"{base}/ping/$RUNPOD_POD_ID",
        RUNPOD_AI_API_KEY="rpa_key",
        RUNPOD_POD_ID="w1",
    )
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with subprocess.Popen(
        [sys.executable, str(script)], env=env, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            line = _first_line_with("worker starting", proc)
        finally:
            proc.kill()
    assert "s3cret" not in line
    assert "rpa_key" not in line
    assert f"***@127.0.0.1:{base.rsplit(':', 1)[1].split('/')[0]}/v2/ep/job-take/w1" in line
    assert "/v2/ep/ping/w1" in line

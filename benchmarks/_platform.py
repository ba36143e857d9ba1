"""The fake platform as a process of its own, and a small client for its routes."""

from __future__ import annotations

import http.client
import json
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks._procs import cpu_seconds

SERVER = Path(__file__).with_name("platform_server.py")


class PlatformProcess:
    """``benchmarks/platform_server.py`` on loopback, started with this interpreter.

    The harness talks to it over one keep-alive connection; every worker process gets its
    own connections. Use as a context manager: leaving it stops the server.
    """

    def __init__(self, workdir: Path, python: str = sys.executable) -> None:
        self._conn: http.client.HTTPConnection | None = None
        self._log = (workdir / "platform.log").open("wb")
        self.popen = subprocess.Popen(
            [python, str(SERVER), "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,
        )
        try:
            self.url = self._read_url(timeout=30.0)
        except BaseException:
            self.close()
            raise
        parts = urlsplit(self.url)
        assert parts.hostname is not None
        assert parts.port is not None
        self._host, self._port = parts.hostname, parts.port

    def _read_url(self, timeout: float) -> str:
        stdout = self.popen.stdout
        assert stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            if not selector.select(timeout):
                raise RuntimeError(f"the fake platform printed no URL within {timeout:g} s")
        line = stdout.readline().decode().strip()
        if not line.startswith("http://"):
            raise RuntimeError(f"the fake platform did not start: {line!r}")
        return line

    def __enter__(self) -> PlatformProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        self._log.close()

    # -- requests ---------------------------------------------------------------------------

    def request(self, method: str, path: str) -> Any:
        """One request; the answer's JSON (None for an empty body). Reconnects once."""
        for attempt in range(2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=30)
            try:
                self._conn.request(method, path, body=b"" if method == "POST" else None)
                response = self._conn.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException):
                self._conn.close()
                self._conn = None
                if attempt:
                    raise
                continue
            if response.status >= 400:
                raise RuntimeError(f"{method} {path}: HTTP {response.status} {body[:200]!r}")
            return json.loads(body) if body else None
        raise AssertionError("unreachable")

    def reset(self, preload: int, *, take_hold: float = 5.0, stop_hold: float = 5.0) -> None:
        """A fresh platform with *preload* queued jobs (ids job-1, job-2, ...)."""
        self.request(
            "POST", f"/_bench/reset?preload={preload}&take_hold={take_hold}&stop_hold={stop_hold}"
        )

    def progress(self) -> dict[str, int]:
        answer: dict[str, int] = self.request("GET", "/_bench/progress")
        return answer

    def report(self) -> dict[str, Any]:
        answer: dict[str, Any] = self.request("GET", "/_bench/report")
        return answer

    def worker_env(self) -> dict[str, str]:
        """The RUNPOD_* wiring of docs/protocol.md §1.5 (from the platform's ``/_env``)."""
        answer: dict[str, str] = self.request("GET", "/_env")
        return answer

    def cancel(self, job_id: str) -> None:
        """Cancel a held job as the endpoint API does: a stop signal for its worker."""
        self.request("POST", f"/cancel/{job_id}")

    def cpu_seconds(self) -> float:
        """CPU time the platform process has used so far."""
        return cpu_seconds(self.popen.pid) or 0.0

    def wait_for(
        self, predicate_key: str, target: int, timeout: float, poll: float = 0.05
    ) -> dict[str, int]:
        """Poll ``/_bench/progress`` until ``progress[predicate_key] >= target`` or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            progress = self.progress()
            if progress[predicate_key] >= target or time.monotonic() >= deadline:
                return progress
            time.sleep(poll)

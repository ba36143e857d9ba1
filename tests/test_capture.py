"""Tests for trio_worker._capture._fd (docs/design.md §8).

fd-level behaviour is tested in child processes (tests/capture_child.py), because pytest
has already redirected fds 1/2 of this process. Per-job attribution and the pure helpers
are tested in-process.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from trio_worker._capture import (
    SHARED_OUTPUT_HEADER,
    JobOutput,
    install_python_stream_attribution,
    job_output,
    logs_for_job,
)
from trio_worker._capture._redact import EDGE_CONTEXT, Redactor, redact_from

if TYPE_CHECKING:
    import pytest

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).resolve().with_name("capture_child.py")
SECRET = "sekrit-value-123"
REDACTED = "[REDACTED]"


def run_child(
    scenario: str, tmp_path: Path, *, timeout: float = 30, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[bytes], dict[str, Any]]:
    """Run a capture_child scenario; its real stdout/stderr and what it recorded."""
    result_file = tmp_path / f"{scenario}.json"
    # A clean environment: no PYTHONUNBUFFERED (so flushing is really exercised) and no
    # secret-looking variables from the outside world feeding the redactor.
    child_env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "LC_ALL": "C.UTF-8"}
    child_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, str(CHILD), scenario, str(result_file)],
        capture_output=True,
        timeout=timeout,
        env=child_env,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    recorded: dict[str, Any] = json.loads(result_file.read_text(encoding="utf-8"))
    return proc, recorded


def secret_fragments(secret: str, size: int = 3) -> list[str]:
    return [secret[i : i + size] for i in range(len(secret) - size + 1)]


# --- what the capture catches ---------------------------------------------------------


def test_catches_python_c_level_and_child_output(tmp_path: Path) -> None:
    proc, recorded = run_child("catches", tmp_path)
    text = recorded["text"]
    for expected in (
        "py-stdout",
        "py-stderr",
        "raw-fd1",
        "raw-fd2",
        "c-printf 42",  # in libc's buffer until mark/text_since call fflush(NULL)
        "child-out",
        "child-err",
        "py-unflushed-last",  # in Python's buffer until text_since flushes
    ):
        assert expected in text
    assert "before-mark" not in text
    out, err = proc.stdout.decode(), proc.stderr.decode()
    for expected in ("before-mark", "py-stdout", "raw-fd1", "c-printf 42", "child-out"):
        assert expected in out
    for expected in ("py-stderr", "raw-fd2", "child-err"):
        assert expected in err


# --- pass-through keeps everything, in order per fd -----------------------------------


def test_pass_through_keeps_all_output_in_order_per_fd(tmp_path: Path) -> None:
    proc, recorded = run_child("order", tmp_path)
    expected_out: list[str] = []
    expected_err: list[str] = []
    for i in range(300):
        expected_out += [f"py {i}", f"raw {i}"]
        expected_err += [f"err {i}", f"rawerr {i}"]
        if i % 30 == 0:
            expected_out.append(f"child {i}")
            expected_err.append(f"childerr {i}")
    assert proc.stdout.decode().splitlines() == expected_out
    assert proc.stderr.decode().splitlines() == expected_err
    # The ring interleaves the two fds, but keeps each one's order.
    captured = recorded["captured"].splitlines()
    err_prefixes = ("err ", "rawerr ", "childerr ")
    assert [line for line in captured if not line.startswith(err_prefixes)] == expected_out
    assert [line for line in captured if line.startswith(err_prefixes)] == expected_err


# --- tens of MB, no deadlock, bounded tail --------------------------------------------


def test_thirty_megabytes_pass_through_without_deadlock(tmp_path: Path) -> None:
    proc, recorded = run_child("volume", tmp_path, timeout=50)
    received = proc.stdout
    assert len(received) == 30_000_000
    # Everything, byte for byte and in order.
    assert hashlib.sha256(received).hexdigest() == recorded["sent_sha256"]
    assert recorded["mark"] == len(received)
    # The tail is bounded by tail_bytes (1 MiB) and is the end of the stream.
    assert 0 < recorded["tail_bytes"] <= 1 << 20
    assert recorded["tail_end"] == received[-2000:].decode()


def test_c_code_holding_the_gil_can_write_more_than_a_default_pipe(tmp_path: Path) -> None:
    # With the default 64 KiB pipe this child hangs for good (minrk/wurlitzer#20).
    proc, recorded = run_child("gil_held_write", tmp_path, timeout=15)
    assert recorded["pipe_size"] >= min(1 << 20, _pipe_max_size())
    assert recorded["written"] == 768 * 1024
    assert proc.stdout == b"g" * (768 * 1024 - 1) + b"\n"
    assert recorded["mark"] == 768 * 1024


def test_mark_counts_every_byte_written_before_it(tmp_path: Path) -> None:
    _, recorded = run_child("marks", tmp_path)
    assert recorded["wrong"] == []


def test_output_buffered_at_exit_still_reaches_the_real_stdout(tmp_path: Path) -> None:
    proc, _ = run_child("exit_without_stop", tmp_path)
    out = proc.stdout.decode()
    assert "py-last-words" in out
    assert "c-last-words" in out


def _pipe_max_size() -> int:
    return int(Path("/proc/sys/fs/pipe-max-size").read_text(encoding="ascii"))


# --- redaction, including secrets cut by a boundary -----------------------------------


def test_secrets_are_redacted_even_across_writes_marks_and_the_window_edge(
    tmp_path: Path,
) -> None:
    proc, recorded = run_child("redact", tmp_path, env={"HF_TOKEN": SECRET})
    assert "token is [REDACTED]" in recorded["printed"]
    assert f"head {REDACTED} tail" in recorded["printed"]  # split over two writes
    # Split by a mark: shown as redacted, not as the secret's unmatched tail.
    assert recorded["since"] == f"{REDACTED} tail\n"
    edges = recorded["edges"]
    assert len(edges) == len(SECRET) + 1
    for k, texts in enumerate(edges):
        for text in texts:
            assert not any(fragment in text for fragment in secret_fragments(SECRET)), (k, text)
            if 0 < k:
                # The window reaches into the secret: it must say so, not drop it silently.
                assert REDACTED in text, (k, text)
            assert text.endswith("." * (63 - k) + "\n")
    assert recorded["multibyte"] == "é" * 32 + "\n"
    # Captured text is redacted; what passes through to the container log is verbatim.
    assert SECRET in proc.stdout.decode()


# --- logs_for_job ---------------------------------------------------------------------


def test_logs_for_job_shapes(tmp_path: Path) -> None:
    _, recorded = run_child("logs", tmp_path, env={"HF_TOKEN": SECRET})
    single = recorded["single"]
    for expected in ("job-a says hi", "c-level line", "from-child", "job-b says hi"):
        assert expected in single
    assert "setup noise" not in single
    assert SHARED_OUTPUT_HEADER not in single
    assert f"job-a token {REDACTED}" in single

    own, shared = recorded["shared"].split(SHARED_OUTPUT_HEADER + "\n")
    assert own == f"job-a says hi\njob-a token {REDACTED}\n"
    for expected in ("job-a says hi", "c-level line", "from-child", "job-b says hi"):
        assert expected in shared
    assert "setup noise" not in shared

    assert recorded["no_job"] == SHARED_OUTPUT_HEADER + "\n" + single
    assert recorded["off"] == ""
    for text in (single, recorded["shared"]):
        assert SECRET not in text

    bounded = recorded["bounded"]
    assert len(bounded) <= 300
    own, shared = bounded.split(SHARED_OUTPUT_HEADER + "\n")
    # Each part keeps its own tail and gets about half of what the header leaves.
    assert own.endswith("own 199\n")
    assert shared.endswith("proc 199\n")
    assert "proc" not in own
    # The job's lines reached fd 1 before the os.write()s, so the shared tail is all "proc".
    assert "own" not in shared
    assert 100 <= len(own) <= 150
    assert 100 <= len(shared) <= 160


def test_logs_for_job_off_is_empty() -> None:
    with job_output("j") as job:
        pass
    assert logs_for_job(None, job, 0, shared_process=True) == ""
    assert logs_for_job(None, None, 0, shared_process=False) == ""


# --- stop -----------------------------------------------------------------------------


def test_stop_restores_fds_and_ends_the_reader(tmp_path: Path) -> None:
    proc, recorded = run_child("stop", tmp_path)
    assert recorded["during"] != recorded["before"]
    assert recorded["after"] == recorded["before"]
    assert recorded["active"] is False
    assert recorded["readers"] == 0
    assert recorded["fds_leaked"] == []
    assert "captured" in recorded["tail"]
    assert "after-stop" not in recorded["tail"]
    assert proc.stdout.decode() == "captured\nafter-stop\n"


def test_stop_does_not_wait_for_or_kill_a_child_holding_the_pipe(tmp_path: Path) -> None:
    proc, recorded = run_child("stop_with_child", tmp_path)
    assert recorded["stop_seconds"] < 0.5
    assert recorded["returncode"] == 0  # not -SIGPIPE
    assert recorded["readers_while_child"] == 1  # still forwarding the child's output
    assert recorded["readers_after_child"] == 0
    assert "late-child" in proc.stdout.decode()  # reached the real stdout after stop()
    assert "late-child" in recorded["tail"]


def test_nested_captures_unwind_in_lifo_order(tmp_path: Path) -> None:
    proc, recorded = run_child("nested", tmp_path)
    assert proc.stdout.decode() == "in-both\nouter-only\nin-neither\n"
    assert recorded["inner"] == "in-both\n"
    assert recorded["outer"] == "in-both\nouter-only\n"
    assert recorded["restored"] is True
    assert recorded["readers"] == 0
    assert recorded["foreign_kept"] is True


# --- per-job attribution (in-process) -------------------------------------------------


async def test_python_writes_are_attributed_to_their_own_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs: dict[str, JobOutput] = {}

    async def task_job(job_id: str) -> None:
        with job_output(job_id) as out:
            jobs[job_id] = out
            for i in range(20):
                print(f"{job_id} line {i}")
                print(f"{job_id} err {i}", file=sys.stderr)
                await trio.lowlevel.checkpoint()

    def thread_body(job_id: str) -> None:
        for i in range(20):
            print(f"{job_id} line {i}")
            # A round trip through the event loop lets the task jobs print in between.
            trio.from_thread.run_sync(lambda: None)

    async def thread_job(job_id: str) -> None:
        with job_output(job_id) as out:
            jobs[job_id] = out
            await trio.to_thread.run_sync(thread_body, job_id)

    sink_path = tmp_path / "sink.txt"
    # monkeypatch.context() unwinds first, so sys.stdout is restored before the file closes.
    with sink_path.open("w", encoding="utf-8") as sink, monkeypatch.context() as patch:
        patch.setattr(sys, "stdout", sink)
        patch.setattr(sys, "stderr", sink)
        install_python_stream_attribution()
        wrapper = sys.stdout
        install_python_stream_attribution()  # idempotent: not wrapped twice
        assert sys.stdout is wrapper
        assert wrapper is not sink
        # The wrapper is transparent for everything but write().
        assert wrapper.fileno() == sink.fileno()
        assert wrapper.encoding == "utf-8"
        assert wrapper.isatty() is False
        assert wrapper.buffer is sink.buffer

        print("outside any job")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(task_job, "a")
            nursery.start_soon(task_job, "b")
            nursery.start_soon(thread_job, "t")
        with job_output("w") as via_writelines:
            sys.stdout.writelines(["w1\n", "w2\n"])
        sys.stdout.flush()

    for job_id in ("a", "b"):
        lines = jobs[job_id].text().splitlines()
        assert lines == [s for i in range(20) for s in (f"{job_id} line {i}", f"{job_id} err {i}")]
    assert jobs["t"].text().splitlines() == [f"t line {i}" for i in range(20)]
    assert via_writelines.text() == "w1\nw2\n"
    # Everything passed through unchanged, and the jobs really ran interleaved.
    written = sink_path.read_text(encoding="utf-8").splitlines()
    assert len(written) == 1 + 40 + 40 + 20 + 2
    assert written[0] == "outside any job"
    assert written.index("b line 0") < written.index("a line 19")


def test_job_output_is_bounded_and_keeps_the_tail() -> None:
    job = JobOutput("j", max_chars=100)
    for i in range(10_000):
        job.append(f"{i:05}|")
    everything = "".join(f"{i:05}|" for i in range(10_000))
    assert job.text(40) == everything[-40:]
    assert job.text(10**6) == everything[-100:]
    assert job.text(0) == ""
    # The buffer stays bounded however much is appended (window + edge context, doubled).
    assert len(job._joined()) <= 2 * (100 + EDGE_CONTEXT)


def test_job_output_redacts_a_secret_cut_by_its_window() -> None:
    redactor = Redactor([SECRET])
    for k in range(len(SECRET) + 1):
        job = JobOutput("j", max_chars=50)
        job.append("x" * 10_000)  # forces trimming, so the edge context matters
        job.append(SECRET)
        job.append("." * (50 - k))
        text = job.redacted_text(redactor, 10**6)
        assert not any(f in text for f in secret_fragments(SECRET)), (k, text)
        assert text.endswith("." * (50 - k))
        assert (REDACTED in text) == (k > 0)


# --- the redaction helper -------------------------------------------------------------


def test_redact_from_never_leaks_a_secret_straddling_the_cut() -> None:
    redactor = Redactor([SECRET, "other-secret"])
    text = f"aaa other-secret bbb {SECRET} ccc"
    secret_at = text.index(SECRET)
    for start in range(len(text) + 1):
        out = redact_from(redactor, text, start)
        assert not any(f in out for f in secret_fragments(SECRET)), (start, out)
        assert out.endswith(" ccc"[max(start - len(text) + 4, 0) :])
        if secret_at < start < secret_at + len(SECRET):
            assert out.startswith(REDACTED)
    # Without a straddle the result is exactly the redacted suffix.
    assert redact_from(redactor, text, 4) == "[REDACTED] bbb [REDACTED] ccc"
    assert redact_from(redactor, text, 0) == "aaa [REDACTED] bbb [REDACTED] ccc"
    assert redact_from(Redactor([]), text, 4) == text[4:]

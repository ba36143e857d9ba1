"""The GPU checks' children are ended and reaped even when their check is cancelled.

A GPU check's bound, or a shutdown, cancels the task that runs the probe or a tool such as
``nvidia-smi``. The child must still be asked to leave (the probe gets a moment to tear its
CUDA context down cleanly) and reaped, or every cancelled check leaves a zombie behind and
a driver half torn down: the reaping waits are shielded for exactly that.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import trio

from trio_worker._fitness import _gpu

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

# Leaves on the end of its input, but only after a moment of cleanup, as the real probe
# does when it tears its CUDA context down.
GRACEFUL_PROBE = """
import sys, time
sys.stdin.read()
time.sleep(0.05)
open(MARKER, "w").write("left cleanly")
"""


async def test_a_probe_closed_from_a_cancelled_task_still_leaves_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "probe.py"
    marker = tmp_path / "left"
    script.write_text(GRACEFUL_PROBE.replace("MARKER", repr(str(marker))))
    monkeypatch.setattr(_gpu, "PROBE", script)
    probe = _gpu.GpuProbe(dict(os.environ), 2.0)
    process = await probe._started()
    with trio.CancelScope() as scope:
        scope.cancel()
        await probe.aclose()
    assert marker.read_text() == "left cleanly"
    assert process.returncode == 0


async def test_a_tool_cancelled_from_outside_is_killed_and_reaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: list[trio.Process] = []
    open_process = _gpu._open

    async def recording_open(*args: object, **kwargs: object) -> trio.Process:
        process = await open_process(*args, **kwargs)  # type: ignore[arg-type]
        opened.append(process)
        return process

    monkeypatch.setattr(_gpu, "_open", recording_open)
    hang = [sys.executable, "-c", "import time; time.sleep(60)"]
    with trio.move_on_after(0.05):
        await _gpu.run_tool(hang, dict(os.environ), bound=30.0)
    (process,) = opened
    # Popen's own record, which only a wait (or poll) sets: trio's ``returncode`` property
    # would poll, and so hide whether the tool was reaped by us.
    assert process._proc.returncode is not None

"""The GPU checks, every one in a child process so a driver that hangs or crashes cannot
take the worker with it, and CUDA is never initialized in the worker.

When a GPU is expected, and why that and not ``nvidia-smi`` decides: docs/reference.md,
"Fitness checks". The tools run under :func:`run_tool`; the Python checks in one child,
:mod:`._gpu_probe`, that imports torch once and answers one step at a time. A child that
overruns its bound is killed with its whole process group.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from ._gpu_probe import MARKER

if TYPE_CHECKING:
    from collections.abc import Mapping

log = logging.getLogger("trio_worker")

DEVICE_DIR = "/dev"  # where the NVIDIA device nodes are: nvidia0, nvidiactl, nvidia-uvm
PROBE = Path(__file__).with_name("_gpu_probe.py")
# nvcc and the plain nvidia-smi get the reference's 5 s each.
TOOL_BOUND = 5.0
# What a child may print that we keep: enough to say why it died.
_OUTPUT_CAP = 64 * 1024
_TAIL = 300
# After a kill, how long we wait to reap the child: one stuck in the driver (state D)
# cannot be reaped at all, and must not hold the worker.
_REAP_BOUND = 1.0


def gpu_expected(environ: Mapping[str, str]) -> str:
    """Why this container is meant to have a GPU, or ``""`` when it is not.

    ``NVIDIA_VISIBLE_DEVICES=all`` alone does not count: the CUDA base images set it, and
    they also run on CPU-only hosts.
    """
    visible = environ.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if visible and visible.lower() not in ("all", "none", "void"):
        return f"NVIDIA_VISIBLE_DEVICES={visible}"
    nodes = nvidia_device_nodes()
    if nodes:
        return f"{nodes[0]} exists"
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi:
        return f"nvidia-smi is on the PATH ({smi})"
    return ""


def nvidia_device_nodes() -> list[str]:
    """The ``/dev/nvidia*`` nodes, sorted (listed, not globbed: ``glob`` is not imported
    for this alone)."""
    try:
        names = os.listdir(DEVICE_DIR)
    except OSError:
        return []
    return sorted(os.path.join(DEVICE_DIR, n) for n in names if n.startswith("nvidia"))


def parse_version(text: str) -> tuple[int, int]:
    """``(12, 2)`` from ``"12.2"`` or ``"CUDA Version: 12.2"``; ``(0, 0)`` when none."""
    match = re.search(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def tail(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _TAIL else "..." + text[-_TAIL:]


async def _end(process: trio.Process) -> None:
    """Kill *process* and its group (a wrapper script's children too), close its pipes,
    and reap it if it can be reaped within a second."""
    if process.returncode is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            process.kill()
    # One shielded, bounded cleanup: in a cancelled task (the check's bound, a shutdown)
    # an unshielded aclose_forcefully re-raises the outer cancellation, and the wait that
    # reaps the child would never run.
    with trio.move_on_after(_REAP_BOUND, shield=True):
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                await trio.aclose_forcefully(pipe)
        await process.wait()


async def _open(argv: list[str], environ: Mapping[str, str], *, stdin: int) -> trio.Process:
    return await trio.lowlevel.open_process(
        argv,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(environ),
        start_new_session=True,  # its own group, so a kill reaches what it started
    )


async def run_tool(argv: list[str], environ: Mapping[str, str], bound: float) -> tuple[int, str]:
    """Run *argv* to its end: its status and its output (stdout and stderr together).

    Raises:
        RuntimeError: it did not end within *bound* seconds (it has been killed).
        OSError: it could not be started.
    """
    process = await _open(argv, environ, stdin=subprocess.DEVNULL)
    output = bytearray()
    try:
        with trio.move_on_after(bound) as scope:
            assert process.stdout is not None
            async for chunk in process.stdout:
                if len(output) < _OUTPUT_CAP:
                    output += chunk
            status = await process.wait()
    finally:
        await _end(process)
    name = " ".join(Path(argv[0]).name.split() + argv[1:])
    if scope.cancelled_caught:
        raise RuntimeError(f"{name} did not finish within {bound:g}s")
    return status, output.decode(errors="replace")


async def check_gpu_health(
    environ: Mapping[str, str], expected: str, timeout: float, probe: GpuProbe
) -> None:
    """``_gpu_health_check``: ``nvidia-smi --list-gpus`` lists a GPU (the reference's
    fallback; its ``gpu_test`` binary is not shipped). Without ``nvidia-smi``, the probe
    counts devices with torch or CuPy."""
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        await _count_devices(expected, timeout, probe)
        return
    status, output = await run_tool([smi, "--list-gpus"], environ, timeout)
    if status != 0:
        raise RuntimeError(
            f"a GPU is expected ({expected}) but nvidia-smi --list-gpus failed "
            f"(status {status}): {tail(output)}"
        )
    if not any(line.startswith("GPU ") for line in output.splitlines()):
        raise RuntimeError(f"a GPU is expected ({expected}) but nvidia-smi lists none")


async def _count_devices(expected: str, timeout: float, probe: GpuProbe) -> None:
    """The health check without ``nvidia-smi``: a device node, and torch or CuPy counting
    devices in the probe. With neither library the GPU cannot be tested here: a warning."""
    if not nvidia_device_nodes():
        raise RuntimeError(f"a GPU is expected ({expected}) but no {DEVICE_DIR}/nvidia* exists")
    with trio.move_on_after(timeout) as scope:
        detail = await probe.step("devices")
    if scope.cancelled_caught:
        raise RuntimeError(f"the GPU probe did not count the devices within {timeout:g}s")
    if detail is None:
        log.warning("GPU expected (%s) but not verified: no nvidia-smi, torch or CuPy", expected)


async def cuda_version(environ: Mapping[str, str]) -> str | None:
    """The CUDA version as the reference finds it: ``nvcc --version``, then the header of
    ``nvidia-smi``; None when neither says."""
    path = environ.get("PATH")
    nvcc = shutil.which("nvcc", path=path)
    if nvcc is not None:
        try:
            status, output = await run_tool([nvcc, "--version"], environ, TOOL_BOUND)
        except (OSError, RuntimeError) as exc:
            log.debug("nvcc not usable: %s", exc)
        else:
            lines = output.splitlines() if status == 0 else []
            for line in lines:
                if "release" in line.lower() or "version" in line.lower():
                    return line.strip()
    smi = shutil.which("nvidia-smi", path=path)
    if smi is not None:
        try:
            status, output = await run_tool([smi], environ, TOOL_BOUND)
        except (OSError, RuntimeError) as exc:
            log.debug("nvidia-smi not usable: %s", exc)
        else:
            for line in output.splitlines() if status == 0 else []:
                if "CUDA Version:" in line:
                    return "CUDA Version: " + line.split("CUDA Version:")[1].split()[0]
    return None


async def check_cuda_version(environ: Mapping[str, str], minimum: str) -> None:
    """``_cuda_version_check``; skipped with a warning when the version cannot be found,
    as in the reference (the health and init checks still say whether the GPU works)."""
    found = await cuda_version(environ)
    if found is None:
        log.warning("could not determine the CUDA version; the CUDA version check is skipped")
        return
    have, need = parse_version(found), parse_version(minimum)
    if have < need:
        raise RuntimeError(
            f"CUDA version too old: {have[0]}.{have[1]} found, {need[0]}.{need[1]} required"
        )


class GpuProbe:
    """One :mod:`._gpu_probe` child, started at the first step and asked one step at a time.

    A step that is cancelled (its check's bound) leaves the child in an unknown state, so
    the child is killed then and the next step fails at once.
    """

    def __init__(self, environ: Mapping[str, str], benchmark_timeout: float) -> None:
        self._environ = environ
        self._benchmark_timeout = benchmark_timeout
        self._process: trio.Process | None = None
        self._pending = bytearray()
        self._noise = bytearray()
        self._broken: str | None = None

    async def step(self, name: str) -> str | None:
        """Run *name* in the child: its detail on a pass, None when it could not be tested.

        Raises:
            RuntimeError: the step failed, the child died, or it was killed earlier.
        """
        if self._broken is not None:
            raise RuntimeError(self._broken)
        try:
            process = await self._started()
            assert process.stdin is not None
            await process.stdin.send_all(f"{name}\n".encode())
            answer = await self._answer(process)
        except (OSError, ValueError, trio.BrokenResourceError, trio.EndOfChannel):
            self._broken = await self._died(name)
            raise RuntimeError(self._broken) from None
        except BaseException:
            # Cancelled (the check's bound): the child may be stuck in the driver.
            self._broken = f"the GPU probe was killed after {name!r} overran its bound"
            await self.aclose(kill=True)
            raise
        if answer.get("status") == "fail":
            raise RuntimeError(str(answer.get("detail")))
        if answer.get("status") == "skip":
            log.debug("GPU probe step %s not tested: %s", name, answer.get("detail"))
            return None
        return str(answer.get("detail"))

    async def aclose(self, *, kill: bool = False) -> None:
        """End the child: asked to leave (end of its input), killed if it has not within a
        second, or at once with *kill*."""
        process, self._process = self._process, None
        if process is None:
            return
        if not kill and process.stdin is not None:
            # Shielded as a whole, as in _end: closing its input is what asks it to leave.
            with trio.move_on_after(_REAP_BOUND, shield=True):
                await trio.aclose_forcefully(process.stdin)
                await process.wait()
        await _end(process)

    async def _started(self) -> trio.Process:
        if self._process is None:
            argv = [sys.executable, "-P", str(PROBE), str(self._benchmark_timeout)]
            self._process = await _open(argv, self._environ, stdin=subprocess.PIPE)
        return self._process

    async def _answer(self, process: trio.Process) -> dict[str, object]:
        assert process.stdout is not None
        while True:
            line, newline, rest = self._pending.partition(b"\n")
            if newline:
                self._pending = bytearray(rest)
                text = line.decode(errors="replace")
                if text.startswith(MARKER):
                    answer = json.loads(text[len(MARKER) :])
                    assert isinstance(answer, dict)
                    return answer
                self._noise = (self._noise + line + b"\n")[-_OUTPUT_CAP:]
                continue
            if len(self._pending) > _OUTPUT_CAP:  # a line without end: noise, kept short
                self._noise, self._pending = self._pending[-_OUTPUT_CAP:], bytearray()
            chunk = await process.stdout.receive_some()
            if not chunk:
                raise trio.EndOfChannel
            self._pending += chunk

    async def _died(self, name: str) -> str:
        """Why the child stopped answering; it is reaped (bounded) for its status."""
        process = self._process
        status = None
        if process is not None:
            with trio.move_on_after(_REAP_BOUND):
                status = await process.wait()
            await self.aclose()
        if status is None:
            how = "no exit status"
        else:
            how = f"status {status}" if status >= 0 else f"signal {-status}"
        noise = tail((self._noise + self._pending).decode(errors="replace"))
        return f"the GPU probe died during {name!r} ({how})" + (f": {noise}" if noise else "")

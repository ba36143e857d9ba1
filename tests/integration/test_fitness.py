"""Fitness checks end to end: a real worker process against the fake platform over loopback,
with a fake ``nvidia-smi`` on the PATH and a fake ``torch`` for the GPU probe's child
(docs/reference.md, Fitness checks)."""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
from pathlib import Path

import pytest
import trio

from trio_worker._fitness._gpu import GpuProbe

from ..conftest import Platform
from .conftest import WorkerProcess, kill_all, open_worker

pytestmark = pytest.mark.slow

APP = Path(__file__).with_name("fitness_worker.py")

SMI_OK = """#!/bin/sh
case "$1" in
  --list-gpus) echo "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5f8e2b)";;
  *) echo "| NVIDIA-SMI 535.104.05  Driver Version: 535.104  CUDA Version: ${FAKE_CUDA:-12.2} |";;
esac
"""
# First in the PATH: the host's own nvcc (a CUDA toolkit without a GPU) must not decide.
NVCC = """#!/bin/sh
echo "nvcc: NVIDIA (R) Cuda compiler driver"
echo "Cuda compilation tools, release ${FAKE_CUDA:-12.2}, V${FAKE_CUDA:-12.2}.140"
"""
SMI_BROKEN = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
exit 9
"""
SMI_HANGS = """#!/bin/sh
sleep 3600
"""
FAKE_TORCH = """
import os, time
with open(os.environ["TW_TORCH_IMPORTS"], "a") as f:
    f.write(f"{os.getpid()}\\n")
MODE = os.environ.get("TW_FAKE_TORCH", "ok")
class _Props:
    total_memory = 80 * 2**30
class cuda:
    is_available = staticmethod(lambda: MODE != "no_cuda")
    device_count = staticmethod(lambda: 1)
    get_device_properties = staticmethod(lambda index: _Props())
    synchronize = staticmethod(lambda device=None: None)
def zeros(*args, device=None):
    if MODE == "crash":
        os.abort()
    if MODE == "hang":
        time.sleep(3600)
def randn(*args, device=None):
    return 0
def matmul(a, b):
    if MODE == "slow":
        time.sleep(0.3)
"""


@pytest.fixture
def gpu_host(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "bin").mkdir()
    (tmp_path / "site" / "torch").mkdir(parents=True)
    (tmp_path / "site" / "torch" / "__init__.py").write_text(FAKE_TORCH)
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.write_text(NVCC)
    nvcc.chmod(0o755)
    return {"bin": tmp_path / "bin", "site": tmp_path / "site", "imports": tmp_path / "imports"}


def fake_smi(gpu_host: dict[str, Path], script: str) -> None:
    smi = gpu_host["bin"] / "nvidia-smi"
    smi.write_text(script)
    smi.chmod(0o755)


def gpu_env(platform: Platform, gpu_host: dict[str, Path], **overrides: str) -> dict[str, str]:
    env = platform.env(**overrides)
    env["PATH"] = f"{gpu_host['bin']}:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONPATH"] = str(gpu_host["site"])  # the stub torch only; the package is installed
    env["TW_TORCH_IMPORTS"] = str(gpu_host["imports"])
    return env


async def run(nursery: trio.Nursery, env: dict[str, str], *args: str) -> WorkerProcess:
    return await open_worker(nursery, [sys.executable, str(APP), *args], env)


async def exits_unhealthy(platform: Platform, worker: WorkerProcess, check: str) -> str:
    """The worker exits 1 after one unhealthy ping naming *check*, having taken nothing;
    the ping's reason."""
    try:
        assert await worker.wait(30) == 1, worker.output
    finally:
        await kill_all([worker])
    unhealthy = [p.query for p in platform.fake.pings if p.query.get("status") == "unhealthy"]
    assert len(unhealthy) == 1, (platform.fake.pings, worker.output)
    assert unhealthy[0]["check"] == check
    assert [r.route for r in platform.fake.requests] == ["ping"], worker.output
    assert f"fitness check {check} failed" in worker.output
    return unhealthy[0]["reason"]


@pytest.mark.parametrize("kind", ["fail_sync", "fail_async"])
async def test_a_failing_check_is_reported_and_the_worker_exits_without_taking(
    platform: Platform, nursery: trio.Nursery, kind: str
) -> None:
    job_id = platform.fake.enqueue("for a healthy worker")
    worker = await run(nursery, platform.env(TW_CHECK=kind))
    reason = await exits_unhealthy(platform, worker, "model_files_present")
    assert reason == "RuntimeError: model file /models/model.safetensors not found"
    assert platform.fake.job(job_id).status == "IN_QUEUE"
    assert platform.fake.job(job_id).takes == 0


async def test_checks_pass_then_the_worker_takes_and_serves(
    platform: Platform, nursery: trio.Nursery
) -> None:
    job_id = platform.fake.enqueue("hi")
    worker = await run(nursery, platform.env(TW_CHECK="pass"))
    try:
        with trio.fail_after(30):
            record = await platform.fake.wait_for_status(job_id, "COMPLETED")
        assert record.output == {"echo": "hi"}
        assert not [p for p in platform.fake.pings if p.query.get("status") == "unhealthy"]
        assert await worker.stop() == 0
        # Read once the process is gone: its output reaches us through the crash watchdog's
        # tee, a moment after the job's report.
        assert worker.output.index("user check ran") < worker.output.index("fitness checks passed")
        assert "model_files_present, _memory_check, _disk_check, _network_check" in worker.output
    finally:
        await kill_all([worker])


async def test_a_hanging_check_fails_after_its_bound(
    platform: Platform, nursery: trio.Nursery
) -> None:
    worker = await run(nursery, platform.env(TW_CHECK="hang", TW_FITNESS_BOUND="0.5"))
    reason = await exits_unhealthy(platform, worker, "stuck_mount")
    assert reason == "FitnessCheckTimeout: did not finish within 0.5s"


async def test_a_child_a_check_forked_ends_with_the_check(
    platform: Platform, nursery: trio.Nursery, tmp_path: Path
) -> None:
    # It was left running (a copy of the worker, asleep) after the worker had exited.
    pid_file = tmp_path / "child"
    env = platform.env(TW_CHECK="fork_and_hang", TW_FITNESS_BOUND="0.5", TW_CHILD_PID=str(pid_file))
    worker = await run(nursery, env)
    reason = await exits_unhealthy(platform, worker, "forks_then_hangs")
    assert reason == "FitnessCheckTimeout: did not finish within 0.5s"
    child = int(pid_file.read_text())
    try:
        assert not running(child), worker.output
        assert f"left 1 process(es) running (pid {child}): ended" in worker.output
    finally:
        if running(child):
            os.kill(child, signal.SIGKILL)


async def test_an_async_check_swallowing_its_cancellation_cannot_hold_the_worker_on_trio(
    platform: Platform, nursery: trio.Nursery
) -> None:
    # No take, no ping and no exit, for as long as it liked (SIGTERM went unanswered).
    env = platform.env(TW_CHECK="swallows_cancellation", TW_FITNESS_BOUND="0.5")
    worker = await run(nursery, env)
    reason = await exits_unhealthy(platform, worker, "stubborn")
    assert reason == "FitnessCheckTimeout: did not finish within 0.5s"


def running(pid: int) -> bool:
    """Whether *pid* is a process that still runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_checks_do_not_run_with_test_input(platform: Platform, nursery: trio.Nursery) -> None:
    worker = await run(nursery, platform.env(TW_CHECK="fail_sync"), "--test_input", '{"input": 1}')
    assert await worker.wait(30) == 0, worker.output
    assert "fitness checks are not run in local mode" in worker.output
    assert "failed" not in worker.output
    assert platform.fake.requests == []


async def test_checks_do_not_run_behind_the_local_endpoint(
    platform: Platform, nursery: trio.Nursery
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = platform.env(TW_CHECK="fail_sync")
    worker = await run(nursery, env, "--rp_serve_api", "--rp_api_port", str(port))
    try:
        await worker.until_output("fitness checks are not run in the local endpoint")
        assert "fitness check model_files_present failed" not in worker.output
    finally:
        await kill_all([worker])


async def test_a_failing_nvidia_smi_fails_the_gpu_check(
    platform: Platform, nursery: trio.Nursery, gpu_host: dict[str, Path]
) -> None:
    fake_smi(gpu_host, SMI_BROKEN)
    worker = await run(nursery, gpu_env(platform, gpu_host))
    reason = await exits_unhealthy(platform, worker, "_gpu_health_check")
    assert reason.startswith("RuntimeError: a GPU is expected (nvidia-smi is on the PATH")
    assert "nvidia-smi --list-gpus failed (status 9): NVIDIA-SMI has failed" in reason


async def test_a_hanging_nvidia_smi_is_killed_after_the_gpu_test_timeout(
    platform: Platform, nursery: trio.Nursery, gpu_host: dict[str, Path]
) -> None:
    fake_smi(gpu_host, SMI_HANGS)
    worker = await run(nursery, gpu_env(platform, gpu_host, RUNPOD_GPU_TEST_TIMEOUT="1"))
    reason = await exits_unhealthy(platform, worker, "_gpu_health_check")
    assert reason == "RuntimeError: nvidia-smi --list-gpus did not finish within 1s"


async def test_a_working_gpu_passes_and_torch_is_never_imported_by_the_worker(
    platform: Platform, nursery: trio.Nursery, gpu_host: dict[str, Path]
) -> None:
    fake_smi(gpu_host, SMI_OK)
    job_id = platform.fake.enqueue("on a gpu")
    worker = await run(nursery, gpu_env(platform, gpu_host))
    try:
        with trio.fail_after(30):
            await platform.fake.wait_for_status(job_id, "COMPLETED")
        importers = gpu_host["imports"].read_text().split()
        assert len(importers) == 1  # one probe child for init and the benchmark
        assert str(worker.process.pid) not in importers
        assert await worker.stop() == 0
        # Read once the process is gone: its output reaches us through the crash
        # watchdog's tee, which a loaded machine may leave behind the job's report.
        assert "_cuda_version_check, _cuda_init_check, _benchmark_check" in worker.output
    finally:
        await kill_all([worker])


@pytest.mark.parametrize(
    ("torch_mode", "extra", "check", "reason"),
    [
        (
            "no_cuda",
            {},
            "_cuda_init_check",
            "RuntimeError: CUDA is not available to torch (torch.cuda.is_available() is False)",
        ),
        (
            "crash",
            {},
            "_cuda_init_check",
            "RuntimeError: the GPU probe died during 'init' (signal 6)",
        ),
        (
            "hang",
            {"TW_FITNESS_BOUND": "1"},
            "_cuda_init_check",
            "FitnessCheckTimeout: did not finish within 1s",
        ),
        (
            "slow",
            {"RUNPOD_GPU_BENCHMARK_TIMEOUT": "0.1"},
            "_benchmark_check",
            "RuntimeError: GPU compute too slow",
        ),
        (
            "ok",
            {"FAKE_CUDA": "11.2"},
            "_cuda_version_check",
            "RuntimeError: CUDA version too old: 11.2 found, 11.8 required",
        ),
    ],
)
async def test_a_broken_gpu_fails_its_check_in_the_probe(
    platform: Platform,
    nursery: trio.Nursery,
    gpu_host: dict[str, Path],
    torch_mode: str,
    extra: dict[str, str],
    check: str,
    reason: str,
) -> None:
    fake_smi(gpu_host, SMI_OK)
    env = gpu_env(platform, gpu_host, TW_FAKE_TORCH=torch_mode, **extra)
    worker = await run(nursery, env)
    assert (await exits_unhealthy(platform, worker, check)).startswith(reason)


@pytest.mark.parametrize(
    ("torch_mode", "answer"),
    [("ok", "1 device(s) visible to torch"), ("no_cuda", "torch.cuda.is_available() is False")],
)
async def test_the_probe_counts_devices_for_a_host_without_nvidia_smi(
    gpu_host: dict[str, Path], torch_mode: str, answer: str
) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(gpu_host["site"]),
        "TW_TORCH_IMPORTS": str(gpu_host["imports"]),
        "TW_FAKE_TORCH": torch_mode,
    }
    probe = GpuProbe(env, 2.0)
    try:
        with trio.fail_after(30):
            if torch_mode == "ok":
                assert await probe.step("devices") == answer
            else:
                with pytest.raises(RuntimeError, match=re.escape(answer)):
                    await probe.step("devices")
    finally:
        await probe.aclose()
    importers = gpu_host["imports"].read_text().split()
    assert len(importers) == 1  # the probe's child, not this process
    assert str(os.getpid()) not in importers

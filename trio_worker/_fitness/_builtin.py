"""The built-in fitness checks, with the reference's names, variables and defaults.

What each checks, when it runs, and where it differs from the reference on purpose (a GPU
*expected*, not found by ``nvidia-smi``; the network check dials the platform):
docs/reference.md, "Fitness checks". Its variables: ``RUNPOD_SKIP_GPU_CHECK``,
``RUNPOD_SKIP_AUTO_SYSTEM_CHECKS``, ``RUNPOD_MIN_MEMORY_GB`` (4.0),
``RUNPOD_MIN_DISK_PERCENT`` (10), ``RUNPOD_MIN_CUDA_VERSION`` (11.8),
``RUNPOD_NETWORK_CHECK_TIMEOUT`` (5 s), ``RUNPOD_GPU_TEST_TIMEOUT`` (30 s),
``RUNPOD_GPU_BENCHMARK_TIMEOUT`` (2 s).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._exceptions import ConfigurationError
from ._gpu import GpuProbe, check_cuda_version, check_gpu_health, gpu_expected, parse_version
from ._reach import check_platform_reachable
from ._registry import Check

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    from .._config import PlatformConfig
    from .._platform._http import StreamOpener

log = logging.getLogger("trio_worker")


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").lower() == "true"


def _number(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ConfigurationError(f"{name} must be a number >= 0, got {raw!r}")
    return value


@dataclass(frozen=True)
class FitnessConfig:
    """The built-in checks' settings, read once at start (bad values: ConfigurationError,
    before any check runs, so a typo is a configuration error and not an unhealthy host)."""

    skip_gpu: bool = False
    skip_system: bool = False
    min_memory_gb: float = 4.0
    min_disk_percent: float = 10.0
    min_cuda_version: str = "11.8"
    network_timeout: float = 5.0
    gpu_test_timeout: float = 30.0
    benchmark_timeout: float = 2.0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> FitnessConfig:
        cuda = environ.get("RUNPOD_MIN_CUDA_VERSION", "").strip() or "11.8"
        if parse_version(cuda) == (0, 0):
            raise ConfigurationError(f"RUNPOD_MIN_CUDA_VERSION must look like 11.8, got {cuda!r}")
        return cls(
            skip_gpu=_flag(environ, "RUNPOD_SKIP_GPU_CHECK"),
            skip_system=_flag(environ, "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS"),
            min_memory_gb=_number(environ, "RUNPOD_MIN_MEMORY_GB", 4.0),
            min_disk_percent=_number(environ, "RUNPOD_MIN_DISK_PERCENT", 10.0),
            min_cuda_version=cuda,
            network_timeout=_number(environ, "RUNPOD_NETWORK_CHECK_TIMEOUT", 5.0),
            gpu_test_timeout=_number(environ, "RUNPOD_GPU_TEST_TIMEOUT", 30.0),
            benchmark_timeout=_number(environ, "RUNPOD_GPU_BENCHMARK_TIMEOUT", 2.0),
        )


def available_memory_gb(meminfo: str = "/proc/meminfo") -> float:
    """``MemAvailable`` in GiB, as the reference reads it without psutil."""
    with open(meminfo, encoding="ascii", errors="replace") as lines:
        for line in lines:
            key, _, value = line.partition(":")
            if key.strip() == "MemAvailable":
                return int(value.split()[0]) / (1024**2)
    raise RuntimeError(f"no MemAvailable in {meminfo}")


def check_memory(min_gb: float, meminfo: str = "/proc/meminfo") -> None:
    available = available_memory_gb(meminfo)
    if available < min_gb:
        raise RuntimeError(f"Insufficient memory: {available:.2f}GB available, {min_gb}GB required")
    log.debug("memory check passed: %.2f GB available", available)


def check_disk(min_percent: float, path: str = "/") -> None:
    usage = shutil.disk_usage(path)
    free_percent = 100 * usage.free / usage.total if usage.total > 0 else 0.0
    if free_percent < min_percent:
        raise RuntimeError(
            f"Insufficient disk space: {usage.free / 1024**3:.2f}GB free "
            f"({free_percent:.1f}%), {min_percent}% required"
        )
    log.debug("disk check passed: %.1f%% free", free_percent)


@contextlib.asynccontextmanager
async def builtin_checks(
    config: FitnessConfig,
    platform: PlatformConfig,
    environ: Mapping[str, str],
    *,
    open_stream: StreamOpener | None = None,
) -> AsyncIterator[list[Check]]:
    """The built-in checks this host runs, in the reference's order.

    The GPU checks share one child process (:class:`._gpu.GpuProbe`), ended on exit.
    """
    expected = gpu_expected(environ)
    if expected:
        log.debug("a GPU is expected (%s): the GPU checks run", expected)
    probe = GpuProbe(environ, config.benchmark_timeout)
    checks: list[Check] = []
    if expected and not config.skip_gpu:
        health = functools.partial(
            check_gpu_health, environ, expected, config.gpu_test_timeout, probe
        )
        checks.append(Check("_gpu_health_check", health, native=True))
    if not config.skip_system:
        memory = functools.partial(_inline, check_memory, config.min_memory_gb)
        disk = functools.partial(_inline, check_disk, config.min_disk_percent)
        reach = functools.partial(
            check_platform_reachable,
            platform,
            config.network_timeout,
            open_stream=open_stream,
        )
        checks += [
            Check("_memory_check", memory, native=True),
            Check("_disk_check", disk, native=True),
        ]
        if platform.queue_mode:
            # A load-balancing worker has no platform URL to dial: traffic comes to it.
            checks.append(Check("_network_check", reach, native=True))
        if expected:
            version = functools.partial(check_cuda_version, environ, config.min_cuda_version)
            checks += [
                Check("_cuda_version_check", version, native=True),
                Check("_cuda_init_check", functools.partial(probe.step, "init"), native=True),
                Check("_benchmark_check", functools.partial(probe.step, "benchmark"), native=True),
            ]
    try:
        yield checks
    finally:
        await probe.aclose()


async def _inline(fn: Callable[[float], None], threshold: float) -> None:
    """Run on the loop: one read of ``/proc/meminfo`` or one ``statvfs("/")`` costs
    microseconds, less than starting a thread for it would."""
    fn(threshold)

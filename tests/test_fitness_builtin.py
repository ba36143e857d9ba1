"""The built-in fitness checks: which run, their thresholds from the environment, and the
platform's reachability (docs/reference.md, Fitness checks).

Nothing here starts a process: the GPU checks' child processes and a fake ``nvidia-smi``
are in tests/integration/test_fitness.py. Every case points the GPU detection at an empty
PATH and no device nodes, so the host running the tests does not decide what runs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_worker import ConfigurationError, Timings
from trio_worker import Timings as _Timings
from trio_worker._backends import BACKENDS
from trio_worker._config import Settings, platform_from_env
from trio_worker._fitness import FitnessCheckFailed, check_fitness
from trio_worker._fitness import _gpu as gpu
from trio_worker._fitness import _registry as registry
from trio_worker._fitness._builtin import FitnessConfig, builtin_checks, check_disk, check_memory
from trio_worker._fitness._reach import dial_target
from trio_worker._scopes import Scopes
from trio_worker.testing import FakePlatform, memory_network

BASE = "http://platform.test:8080/v2/ep"


@pytest.fixture(autouse=True)
def no_gpu_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(gpu, "DEVICE_DIR", str(tmp_path / "dev"))
    saved = list(registry._registered)
    registry._registered.clear()
    yield
    registry._registered[:] = saved


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "bin").mkdir()
    return {
        "PATH": str(tmp_path / "bin"),
        "RUNPOD_WEBHOOK_GET_JOB": f"{BASE}/job-take/$ID",
        "RUNPOD_WEBHOOK_PING": f"{BASE}/ping/$RUNPOD_POD_ID",
        "RUNPOD_WEBHOOK_POST_OUTPUT": f"{BASE}/job-done/$RUNPOD_POD_ID/$ID",
        "RUNPOD_AI_API_KEY": "fake-key",
        "RUNPOD_POD_ID": "w1",
    }


Dials = list[tuple[str, int, bool]]


@pytest.fixture
async def network() -> AsyncIterator[tuple[FakePlatform, Any, Dials]]:
    fake = FakePlatform()
    dials: Dials = []
    async with memory_network(fake) as opener:

        async def recording(host: str, port: int, tls: bool) -> trio.abc.Stream:
            dials.append((host, port, tls))
            return await opener(host, port, tls)

        yield fake, recording, dials


async def run_gate(env: dict[str, str], opener: Callable[..., Any]) -> None:
    await check_fitness(Settings.from_environ(env), BACKENDS["trio"], env, open_stream=opener)


def unhealthy(fake: FakePlatform) -> list[dict[str, str]]:
    return [p.query for p in fake.pings if p.query.get("status") == "unhealthy"]


async def names(env: dict[str, str]) -> list[str]:
    config = FitnessConfig.from_environ(env)
    async with builtin_checks(config, platform_from_env(env), env) as checks:
        return [check.name for check in checks]


# -- which checks run ---------------------------------------------------------------------


async def test_a_cpu_only_host_runs_memory_disk_and_network_as_the_reference(
    env: dict[str, str],
) -> None:
    assert await names(env) == ["_memory_check", "_disk_check", "_network_check"]


async def test_a_host_meant_to_have_a_gpu_runs_every_gpu_check_in_the_references_order(
    env: dict[str, str],
) -> None:
    env["NVIDIA_VISIBLE_DEVICES"] = "GPU-5f8e2b"
    assert await names(env) == [
        "_gpu_health_check",
        "_memory_check",
        "_disk_check",
        "_network_check",
        "_cuda_version_check",
        "_cuda_init_check",
        "_benchmark_check",
    ]


@pytest.mark.parametrize("value", ["true", "TRUE", "True"])
async def test_the_skip_variables_turn_off_what_they_do_in_the_reference(
    env: dict[str, str], value: str
) -> None:
    env["NVIDIA_VISIBLE_DEVICES"] = "0"
    assert "_gpu_health_check" not in await names({**env, "RUNPOD_SKIP_GPU_CHECK": value})
    # RUNPOD_SKIP_GPU_CHECK leaves the CUDA checks to the system switch, as the reference.
    assert "_cuda_init_check" in await names({**env, "RUNPOD_SKIP_GPU_CHECK": value})
    assert await names({**env, "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": value}) == ["_gpu_health_check"]
    both = {**env, "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": value, "RUNPOD_SKIP_GPU_CHECK": value}
    assert await names(both) == []


@pytest.mark.parametrize("value", ["1", "yes", "on", ""])
async def test_only_true_skips(env: dict[str, str], value: str) -> None:
    assert len(await names({**env, "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": value})) == 3


# -- whether a GPU is expected ------------------------------------------------------------


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("0", True),
        ("0,1", True),
        ("GPU-5f8e2b", True),
        ("all", False),
        ("none", False),
        ("void", False),
        ("", False),
    ],
)
def test_nvidia_visible_devices_naming_a_device_means_a_gpu_is_expected(
    env: dict[str, str], visible: str, expected: bool
) -> None:
    assert bool(gpu.gpu_expected({**env, "NVIDIA_VISIBLE_DEVICES": visible})) is expected


def test_a_device_node_means_a_gpu_is_expected(env: dict[str, str], tmp_path: Path) -> None:
    assert gpu.gpu_expected(env) == ""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    assert gpu.gpu_expected(env).endswith("dev/nvidia0 exists")


def test_nvidia_smi_on_the_path_means_a_gpu_is_expected(
    env: dict[str, str], tmp_path: Path
) -> None:
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexit 0\n")
    smi.chmod(0o755)
    assert gpu.gpu_expected(env) == f"nvidia-smi is on the PATH ({smi})"


async def test_a_gpu_expected_without_nvidia_smi_or_device_nodes_fails(
    env: dict[str, str], network: tuple[FakePlatform, Any, Dials]
) -> None:
    fake, opener, _ = network
    env.update(NVIDIA_VISIBLE_DEVICES="0", RUNPOD_SKIP_AUTO_SYSTEM_CHECKS="true")
    with pytest.raises(FitnessCheckFailed) as failed:
        await run_gate(env, opener)
    assert failed.value.check == "_gpu_health_check"
    (query,) = unhealthy(fake)
    assert query["check"] == "_gpu_health_check"
    assert "a GPU is expected (NVIDIA_VISIBLE_DEVICES=0)" in query["reason"]


# -- thresholds ---------------------------------------------------------------------------


def test_memory_threshold(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  16384000 kB\nMemAvailable:   3145728 kB\n")
    check_memory(3.0, str(meminfo))
    with pytest.raises(
        RuntimeError, match=r"Insufficient memory: 3.00GB available, 4.0GB required"
    ):
        check_memory(4.0, str(meminfo))


def test_disk_threshold() -> None:
    check_disk(0.0)
    with pytest.raises(RuntimeError, match=r"Insufficient disk space: .*% required"):
        check_disk(100.0)


@pytest.mark.parametrize(
    ("variable", "check"),
    [("RUNPOD_MIN_MEMORY_GB", "_memory_check"), ("RUNPOD_MIN_DISK_PERCENT", "_disk_check")],
)
async def test_thresholds_come_from_the_environment(
    env: dict[str, str], network: tuple[FakePlatform, Any, Dials], variable: str, check: str
) -> None:
    fake, opener, _ = network
    await run_gate({**env, variable: "0"}, opener)
    with pytest.raises(FitnessCheckFailed) as failed:
        await run_gate({**env, variable: "1e9"}, opener)
    assert failed.value.check == check
    (query,) = unhealthy(fake)
    assert query["reason"].startswith("RuntimeError: Insufficient")


@pytest.mark.parametrize(
    "variable",
    [
        "RUNPOD_MIN_MEMORY_GB",
        "RUNPOD_MIN_DISK_PERCENT",
        "RUNPOD_GPU_BENCHMARK_TIMEOUT",
        "RUNPOD_NETWORK_CHECK_TIMEOUT",
        "RUNPOD_MIN_CUDA_VERSION",
    ],
)
async def test_a_bad_value_is_a_configuration_error_not_an_unhealthy_host(
    env: dict[str, str], network: tuple[FakePlatform, Any, Dials], variable: str
) -> None:
    fake, opener, _ = network
    with pytest.raises(ConfigurationError, match=variable):
        await run_gate({**env, variable: "lots"}, opener)
    assert fake.requests == []


async def test_every_default_check_passes_on_this_host(
    env: dict[str, str],
    network: tuple[FakePlatform, Any, Dials],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "trio_worker")
    fake, opener, _ = network
    await run_gate(env, opener)
    assert fake.requests == []
    assert "fitness checks passed in" in caplog.text
    assert "_memory_check, _disk_check, _network_check" in caplog.text


# -- the platform's reachability ----------------------------------------------------------


async def test_the_network_check_dials_the_ping_urls_host_and_port(
    env: dict[str, str], network: tuple[FakePlatform, Any, Dials]
) -> None:
    _, opener, dials = network
    await run_gate(env, opener)
    assert dials == [("platform.test", 8080, False)]


def test_the_dial_follows_the_urls_tls_and_a_proxy(env: dict[str, str]) -> None:
    https = {**env, "RUNPOD_WEBHOOK_PING": "https://api.runpod.ai/v2/ep/ping/$RUNPOD_POD_ID"}
    assert dial_target(platform_from_env(https)) == ("api.runpod.ai", 443, True)
    no_ping = {k: v for k, v in env.items() if k != "RUNPOD_WEBHOOK_PING"}
    assert dial_target(platform_from_env(no_ping)) == ("platform.test", 8080, False)
    proxied = {**https, "HTTPS_PROXY": "http://proxy.local:3128"}
    assert dial_target(platform_from_env(proxied)) == ("proxy.local", 3128, False)
    tls_proxy = {**https, "HTTPS_PROXY": "https://user:pw@proxy.local"}
    assert dial_target(platform_from_env(tls_proxy)) == ("proxy.local", 443, True)


@pytest.mark.parametrize(
    "no_proxy", ["platform.test", ".test", "*.test", "platform.test:8080", "*", "x, platform.test"]
)
async def test_the_network_check_goes_direct_to_a_platform_no_proxy_names(
    env: dict[str, str], network: tuple[FakePlatform, Any, Dials], no_proxy: str
) -> None:
    # A dead proxy that NO_PROXY rules out for the platform must not be dialed: the
    # worker would declare itself unhealthy while every request of its own goes direct.
    _, opener, dials = network
    await run_gate({**env, "HTTP_PROXY": "http://dead.proxy:1", "NO_PROXY": no_proxy}, opener)
    assert dials == [("platform.test", 8080, False)]


async def test_the_network_check_dials_the_proxy_a_no_proxy_does_not_cover(
    env: dict[str, str], network: tuple[FakePlatform, Any, Dials]
) -> None:
    _, opener, dials = network
    proxied = {**env, "http_proxy": "http://live.proxy:3128", "NO_PROXY": "platform.test:9999"}
    await run_gate(proxied, opener)
    assert dials == [("live.proxy", 3128, False)]


async def test_an_unreachable_platform_fails_the_network_check(
    env: dict[str, str], network: tuple[FakePlatform, Any, Dials]
) -> None:
    async def refused(host: str, port: int, tls: bool) -> trio.abc.Stream:
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(FitnessCheckFailed) as failed:
        await run_gate(env, refused)
    assert failed.value.check == "_network_check"
    assert failed.value.reason == (
        "RuntimeError: cannot reach the platform at platform.test:8080: "
        "[Errno 111] Connection refused"
    )


async def test_a_platform_that_never_answers_fails_after_the_network_timeout(
    env: dict[str, str], virtual_clock: trio.abc.Clock
) -> None:
    async def silent(host: str, port: int, tls: bool) -> trio.abc.Stream:
        await trio.sleep_forever()
        raise AssertionError

    env["RUNPOD_NETWORK_CHECK_TIMEOUT"] = "3"
    # Only the network check: its bound is the point, in virtual time.
    config = FitnessConfig.from_environ(env)
    async with builtin_checks(config, platform_from_env(env), env, open_stream=silent) as checks:
        (reach,) = [check for check in checks if check.name == "_network_check"]
        failure = await registry.run_check(
            reach,
            bound=Timings().fitness_check_timeout,
            backend=BACKENDS["trio"],
            waits=Scopes(_Timings()),
        )
    assert failure is not None
    assert failure.reason == (
        "RuntimeError: cannot reach the platform at platform.test:8080: no connection within 3s"
    )


class StubProbe:
    """What the GPU probe's child answers for ``devices``, without a child."""

    def __init__(self, answer: str | Exception | None) -> None:
        self.answer = answer
        self.steps: list[str] = []

    async def step(self, name: str) -> str | None:
        self.steps.append(name)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        ("1 device(s) visible to torch", "pass"),
        (None, "warning"),
        (RuntimeError("torch.cuda.is_available() is False"), "fail"),
    ],
)
async def test_without_nvidia_smi_a_device_node_sends_the_health_check_to_the_probe(
    env: dict[str, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    answer: str | Exception | None,
    outcome: str,
) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    probe = StubProbe(answer)
    expected = gpu.gpu_expected(env)
    health = gpu.check_gpu_health(env, expected, 30.0, probe)  # type: ignore[arg-type]
    if outcome == "fail":
        with pytest.raises(RuntimeError, match="is_available"):
            await health
    else:
        await health
    assert probe.steps == ["devices"]
    assert ("not verified: no nvidia-smi, torch or CuPy" in caplog.text) is (outcome == "warning")


# -- the variables, as the docs list them ------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
READ = re.compile(r'environ(?:\.get\(|, )"(RUNPOD_[A-Z_]+)"')


def test_every_fitness_variable_the_code_reads_is_in_each_list_of_them() -> None:
    source = (REPO / "trio_worker" / "_fitness" / "_builtin.py").read_text()
    read = set(READ.findall(source))
    assert "RUNPOD_NETWORK_CHECK_TIMEOUT" in read  # the reading above found them
    migration = (REPO / "docs" / "migration.md").read_text()
    listed = migration.split("names and variables", 1)[1].split(")", 1)[0]
    [environment_row] = [
        line
        for line in (REPO / "docs" / "reference.md").read_text().splitlines()
        if line.startswith("| `RUNPOD_MIN_MEMORY_GB`")
    ]
    thresholds = source.split('"""', 2)[1]  # the module's docstring
    for where, text in (
        ("migration.md", listed),
        ("reference.md", environment_row),
        ("_builtin.py", thresholds),
    ):
        missing = sorted(name for name in read if f"`{name}`" not in text)
        assert missing == [], f"{where} leaves out {missing}"

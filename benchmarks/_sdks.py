"""The two SDKs under benchmark, the reference SDK's virtualenv, and the workers' environment.

The reference SDK (``runpod`` on PyPI) is never a project dependency: it is installed on
request into ``benchmarks/.venv-reference`` and runs with that interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    Say = Callable[[str], None]

HERE = Path(__file__).resolve().parent
REFERENCE_VENV = HERE / ".venv-reference"
TOOLS_VENV = HERE / ".venv-tools"


@dataclass(frozen=True)
class Sdk:
    """One SDK: how to run its worker file."""

    key: str  # "trio_worker" or "reference"
    label: str
    python: str
    script: Path
    version: str


def trio_worker_sdk() -> Sdk:
    return Sdk(
        "trio_worker",
        "trio_worker",
        sys.executable,
        HERE / "worker_trio.py",
        metadata.version("trio_worker"),
    )


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _has_module(python: Path, module: str) -> bool:
    if not python.exists():
        return False
    probe = subprocess.run(
        [str(python), "-c", f"import {module}"],
        capture_output=True,
        timeout=120,
        check=False,
        env=_clean_env(),
    )
    return probe.returncode == 0


def _clean_env() -> dict[str, str]:
    """This process's environment without the RUNPOD_/BENCH_ variables and PYTHONPATH."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("RUNPOD_", "BENCH_")) and key not in ("PYTHONPATH", "VIRTUAL_ENV")
    }


def ensure_venv(
    venv: Path, packages: list[str], say: Say, *, module: str = "", executable: str = ""
) -> Path | None:
    """A virtualenv at *venv* in which *module* imports (or *executable* is installed).

    Created and filled with *packages* on demand. Returns its interpreter, or None (after
    saying why) if it cannot be set up.
    """
    python = venv_python(venv)

    def ready() -> bool:
        if executable:
            return (venv / "bin" / executable).exists()
        return _has_module(python, module)

    if ready():
        return python
    say(f"installing {' '.join(packages)} into {venv} ...")
    try:
        if not python.exists():
            subprocess.run(
                [sys.executable, "-m", "venv", str(venv)],
                check=True,
                capture_output=True,
                timeout=300,
            )
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                *packages,
            ],
            check=True,
            capture_output=True,
            timeout=900,
            env=_clean_env(),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        detail = ""
        if isinstance(exc, subprocess.CalledProcessError):
            detail = (exc.stderr or b"").decode(errors="replace")[-800:]
        say(f"could not install {' '.join(packages)} into {venv}: {exc}\n{detail}")
        return None
    if not ready():
        say(f"{module or executable} is still missing from {venv}")
        return None
    return python


def reference_sdk(say: Say) -> Sdk | None:
    """The reference SDK in its own virtualenv (installed if needed); None if unavailable."""
    python = ensure_venv(REFERENCE_VENV, ["runpod"], say, module="runpod")
    if python is None:
        return None
    version = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('runpod'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=_clean_env(),
    ).stdout.strip()
    return Sdk(
        "reference", "runpod (reference)", str(python), HERE / "worker_reference.py", version
    )


def worker_env(
    platform_env: dict[str, str], home: Path, pycache: Path, scenario_env: dict[str, str]
) -> dict[str, str]:
    """The environment of a worker process; the same for both SDKs.

    docs/protocol.md §1.5: the platform wiring, a ping interval of at least 1000 ms (below that the
    reference's heartbeat dies), the reference's system and GPU checks skipped, an empty
    HOME (so no ``~/.runpod/config.toml`` overrides the key) and ERROR logging, which is
    also the quietest setting the reference accepts.

    Bytecode: a deployed image has compiled ``.pyc`` files. A development checkout may not
    (this sandbox sets ``PYTHONDONTWRITEBYTECODE=1``, and sources being edited invalidate
    their ``.pyc``), which adds tens of ms of compiling to every start. So workers write
    and read bytecode in a private *pycache* (``PYTHONPYCACHEPREFIX``), warmed once per
    run, and never write into the source tree.
    """
    env = _clean_env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    env.update(platform_env)
    env.update(
        {
            "RUNPOD_PING_INTERVAL": str(max(1000, int(platform_env["RUNPOD_PING_INTERVAL"]))),
            "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": "true",
            "RUNPOD_SKIP_GPU_CHECK": "true",
            "RUNPOD_LOG_LEVEL": "ERROR",
            "HOME": str(home),
        }
    )
    env.update(scenario_env)
    return env


# What a worker file runs before its handler can start: the import, and the entry point
# reached (trio_worker loads its public names on first use, so the import alone is not it).
ENTRY_POINT = {"trio_worker": "trio_worker.start", "runpod": "runpod.serverless.start"}
_TIMED_IMPORT = """
import time
t = time.perf_counter()
import {module}
{entry}
print((time.perf_counter() - t) * 1000)
"""


def python_import_ms(python: str, module: str, env: dict[str, str]) -> float | None:
    """Wall time in ms of ``import module`` and reaching its entry point, in a fresh
    interpreter (*python*) with bytecode already compiled."""
    code = _TIMED_IMPORT.format(module=module, entry=ENTRY_POINT[module])
    result = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, timeout=120, check=False, env=env
    )
    if result.returncode != 0:
        return None
    return float(result.stdout.strip().splitlines()[-1])

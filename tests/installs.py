"""The project installed for real into temporary virtual environments, the ways users
install it: a wheel, an editable install (``pip install -e``: setuptools' finder, put in
place by a ``.pth`` file), and a plain ``.pth`` file naming a directory.

Each install is built from a copy of the project whose version says which install it is
(``0.1.0+wheel``...): every error body carries ``sdk_version``, so a crash report shows
which copy of the package the watchdog loaded. The fixtures in ``tests/conftest.py`` build
each one once per test session. Nothing here sets ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BOUND = 600  # seconds for one pip step: a safety bound, never reached on a working machine
DEPENDENCIES = ("trio>=0.31", "httpx>=0.28", "h11>=0.16", "httptools>=0.7.1")  # as pyproject.toml's


@dataclass(frozen=True)
class Install:
    """A virtual environment with the project in it."""

    venv: Path
    version: str  # the copy's __version__: what its reports carry as sdk_version
    package: Path  # the trio_worker directory its interpreter imports

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def script(self, name: str) -> Path:
        return self.venv / "bin" / name

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return venv_env(self.venv, base)


def venv_env(venv: Path, base: dict[str, str]) -> dict[str, str]:
    """*base* with *venv*'s bin first on PATH (as an image's PATH finds its commands), and
    no PYTHONPATH."""
    env = {k: v for k, v in base.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{base.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


def project_copy(root: Path, version: str) -> Path:
    """What an install is made from: pyproject.toml, README.md and the package, with
    ``__version__`` set to *version*."""
    root.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, root / name)
    shutil.copytree(
        REPO / "trio_worker",
        root / "trio_worker",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    (root / "trio_worker" / "_version.py").write_text(f'__version__ = "{version}"\n')
    return root


def new_venv(path: Path) -> Path:
    """An empty virtual environment (no pip: this test run's pip installs into it)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=BOUND
    )
    return path / "bin" / "python"


def pip_install(python: Path, *args: str) -> None:
    subprocess.run(
        [
            sys.executable,
            *("-m", "pip", "--python", str(python), "--disable-pip-version-check"),
            *("install", "--quiet", *args),
        ],
        check=True,
        timeout=BOUND,
    )


def site_packages(python: Path) -> Path:
    done = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=BOUND,
    )
    return Path(done.stdout.strip())


def build_wheel(project: Path, into: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            *("-m", "pip", "--disable-pip-version-check", "wheel", "--quiet", "--no-deps"),
            *(str(project), "-w", str(into)),
        ],
        check=True,
        timeout=BOUND,
    )
    (wheel,) = into.glob("trio_worker-*.whl")
    return wheel


def install_wheel(base: Path) -> Install:
    project = project_copy(base / "project", "0.1.0+wheel")
    python = new_venv(base / "venv")
    pip_install(python, str(build_wheel(project, base / "dist")))
    return Install(base / "venv", "0.1.0+wheel", site_packages(python) / "trio_worker")


def install_editable(base: Path) -> Install:
    project = project_copy(base / "project", "0.1.0+editable")
    python = new_venv(base / "venv")
    pip_install(python, "--editable", str(project))
    return Install(base / "venv", "0.1.0+editable", project / "trio_worker")


def install_by_pth(base: Path) -> Install:
    """The dependencies installed, and the package found through a ``.pth`` file naming
    the directory it sits in (as ``conda develop`` or a hand-made path file does)."""
    project = project_copy(base / "project", "0.1.0+pth")
    python = new_venv(base / "venv")
    pip_install(python, *DEPENDENCIES)
    (site_packages(python) / "trio_worker_checkout.pth").write_text(f"{project}\n")
    return Install(base / "venv", "0.1.0+pth", project / "trio_worker")

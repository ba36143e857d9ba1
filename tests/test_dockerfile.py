"""examples/Dockerfile's build steps, checked as far as a machine without docker allows.

The Dockerfile is parsed; its base image must carry Python 3.11+, every COPY source must
exist in the build context and survive .dockerignore, and its CMD is the launcher on a
copied file. The slow test then plays the image build in a scratch directory: the COPY
steps, the wheel build of the copied SDK (what ``pip install /tmp/sdk`` builds), the wheel
installed into a virtual environment of its own (``tests/installs.py``), and the image's
CMD, found on that environment's PATH as on the image's, run with ``--test_input``
against that installed wheel, not this checkout.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.installs import build_wheel, new_venv, pip_install, venv_env

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "examples" / "Dockerfile"
BOUND = 300  # seconds for a pip step; a safety bound, never reached on a working machine


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def parse(text: str) -> list[Instruction]:
    """Dockerfile instructions, continuation lines joined and comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
    return instructions


def instructions(keyword: str) -> list[Instruction]:
    return [i for i in parse(DOCKERFILE.read_text(encoding="utf-8")) if i.keyword == keyword]


def base_image() -> str:
    (source,) = instructions("FROM")
    image = source.args
    for arg in instructions("ARG"):
        name, _, default = arg.args.partition("=")
        image = image.replace(f"${{{name}}}", default).replace(f"${name}", default)
    return image


def copies() -> list[tuple[list[str], str]]:
    found = []
    for copy in instructions("COPY"):
        *sources, dest = shlex.split(copy.args)
        found.append((sources, dest))
    return found


def ignored(path: str) -> bool:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = Path(path).parts
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
        for pattern in patterns
        for prefix in prefixes
    )


def cmd() -> list[str]:
    (command,) = instructions("CMD")
    value = json.loads(command.args)  # the exec form: no shell between the platform and us
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def test_the_parser_reads_the_dockerfile() -> None:
    keywords = {i.keyword for i in parse(DOCKERFILE.read_text(encoding="utf-8"))}
    assert {"FROM", "WORKDIR", "COPY", "RUN", "CMD"} <= keywords


def test_the_base_image_has_python_311_or_newer() -> None:
    image = base_image()
    match = re.fullmatch(r"python:3\.(\d+)(-slim|-bookworm|-slim-bookworm)?", image)
    if match is None:
        # A Runpod base: then the build's own check must be there to refuse a 3.10 image.
        assert image.startswith("runpod/"), image
    else:
        assert int(match.group(1)) >= 11
    checks = [run.args for run in instructions("RUN") if "sys.version_info >= (3, 11)" in run.args]
    assert checks, "the build must refuse a base image with Python < 3.11"


def test_every_copy_source_is_in_the_build_context() -> None:
    assert copies()
    for sources, _dest in copies():
        for source in sources:
            assert (ROOT / source).exists(), source
            assert not ignored(source), f"{source} is excluded by .dockerignore"


def test_dockerignore_keeps_the_context_to_what_the_image_needs() -> None:
    for heavy in (".git", ".venv", ".tox", "tests", "benchmarks/results", "x/__pycache__"):
        assert ignored(heavy), heavy


# The launcher, in either spelling: the crash watchdog starts first (docs/deploy.md).
LAUNCHERS = (["trio-worker", "run"], ["python3", "-m", "trio_worker"])


def test_cmd_runs_a_copied_file_in_the_workdir_through_the_launcher() -> None:
    (workdir,) = instructions("WORKDIR")
    command = cmd()
    launcher = next(each for each in LAUNCHERS if command[: len(each)] == each)
    script = command[len(launcher)]
    assert script.endswith(".py")
    destinations = [
        Path(dest) / Path(source).name if dest.endswith("/") else Path(dest)
        for sources, dest in copies()
        for source in sources
    ]
    assert Path(workdir.args) / script in destinations


def _build_root(tmp_path: Path) -> Path:
    """The image's filesystem after the COPY steps, under *tmp_path*."""
    (workdir,) = instructions("WORKDIR")
    image = tmp_path / "image"
    for sources, dest in copies():
        target = image / Path(workdir.args, dest).relative_to("/")
        for source in sources:
            origin = ROOT / source
            into = target / origin.name if dest.endswith("/") else target
            into.parent.mkdir(parents=True, exist_ok=True)
            if origin.is_dir():
                shutil.copytree(origin, into, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(origin, into)
    return image


@pytest.mark.slow
def test_the_image_builds_and_its_cmd_runs_a_job(tmp_path: Path) -> None:
    image = _build_root(tmp_path)
    wheel = build_wheel(image / "tmp" / "sdk", tmp_path / "wheels")
    venv = tmp_path / "venv"
    python = new_venv(venv)
    pip_install(python, str(wheel))

    env = venv_env(venv, {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD_")})
    (workdir,) = instructions("WORKDIR")
    app = image / Path(workdir.args).relative_to("/")
    command = cmd()
    program = shutil.which(command[0], path=env["PATH"])  # as the image's PATH finds it
    assert program is not None and Path(program).is_relative_to(venv), program
    test_input = json.dumps({"input": {"prompt": "from the image"}})
    done = subprocess.run(
        [program, *command[1:], "--test_input", test_input],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hello from the model: from the image" in done.stdout
    where = subprocess.run(
        [str(python), "-c", "import trio_worker; print(trio_worker.__file__)"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=BOUND,
    )
    assert Path(where.stdout.strip()).is_relative_to(venv)  # the wheel, not this checkout

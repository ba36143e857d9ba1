"""Every install layout reports a crash: the watchdog loads the package from where the
worker loaded it (docs/design.md §13.1).

The project is installed for real into temporary virtual environments, once per session
(``tests/installs.py``): a wheel, an editable install, a ``.pth`` file; and a copy on
``PYTHONPATH`` in front of the wheel. A worker from each dies by SIGSEGV holding a job, in
both forms (``python handler.py``, which forks at ``start()``, and the launcher), and the
fake platform, over loopback, must get its ``WorkerCrashed`` report, carrying the version
of the very copy the worker imported. No test here sets ``PYTHONPATH`` but the one about it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import trio

from tests.installs import Install, project_copy

from ..conftest import Platform
from .conftest import open_worker

pytestmark = pytest.mark.slow

APP = """
import os, signal, trio_worker

print(f"trio_worker {trio_worker.__version__} from {os.path.dirname(trio_worker.__file__)}")


def handler(job):
    os.kill(os.getpid(), signal.SIGSEGV)


trio_worker.start(handler)
"""

FORMS = ("fork", "launcher")


def command(install: Install, form: str, app: Path) -> list[str]:
    if form == "fork":
        return [str(install.python), str(app)]
    if install.script("trio-worker").exists():
        return [str(install.script("trio-worker")), "run", str(app)]
    return [str(install.python), "-m", "trio_worker", str(app)]  # no script: not pip's


async def crash_once(
    nursery: trio.Nursery, platform: Platform, tmp_path: Path, argv: list[str], env: dict[str, str]
) -> tuple[dict[str, object], str]:
    """Run *argv* until it dies holding one job: that job's error, and the output."""
    job_id = platform.fake.enqueue({"prompt": "hi"})
    worker = await open_worker(nursery, argv, env, cwd=tmp_path)
    assert await worker.wait() == 139, worker.output
    record = platform.fake.job(job_id)
    assert record.status == "FAILED", worker.output
    (body,) = record.done_reports
    assert isinstance(body, dict)
    error = json.loads(str(body["error"]))
    assert isinstance(error, dict)
    return error, worker.output


@pytest.fixture
def app(tmp_path: Path) -> Path:
    path = tmp_path / "handler.py"
    path.write_text(APP)
    return path


@pytest.fixture(params=["wheel_install", "editable_install", "pth_install"])
def install(request: pytest.FixtureRequest) -> Install:
    found: Install = request.getfixturevalue(request.param)
    return found


@pytest.mark.parametrize("form", FORMS)
async def test_a_crash_is_reported_from_every_install_layout(
    platform: Platform,
    nursery: trio.Nursery,
    tmp_path: Path,
    app: Path,
    install: Install,
    form: str,
) -> None:
    env = install.env(platform.env())
    error, output = await crash_once(nursery, platform, tmp_path, command(install, form, app), env)
    assert f"trio_worker {install.version} from {install.package}\n" in output
    assert error["error_type"] == "WorkerCrashed"
    assert error["error_category"] == "segfault"
    assert error["sdk_version"] == install.version  # the watchdog's copy: the worker's
    assert "ModuleNotFoundError" not in output


@pytest.mark.parametrize("form", FORMS)
async def test_a_copy_on_pythonpath_reports_with_itself_not_the_installed_one(
    platform: Platform,
    nursery: trio.Nursery,
    tmp_path: Path,
    app: Path,
    wheel_install: Install,
    form: str,
) -> None:
    copy = project_copy(tmp_path / "checkout", "0.1.0+pythonpath")
    env = wheel_install.env(platform.env())
    env["PYTHONPATH"] = str(copy)  # in front of the wheel's site-packages
    argv = command(wheel_install, form, app)
    error, output = await crash_once(nursery, platform, tmp_path, argv, env)
    assert f"trio_worker 0.1.0+pythonpath from {copy / 'trio_worker'}\n" in output
    assert error["error_type"] == "WorkerCrashed"
    assert error["sdk_version"] == "0.1.0+pythonpath"


def test_the_installs_are_what_they_say(
    wheel_install: Install, editable_install: Install, pth_install: Install
) -> None:
    # An editable install is on no sys.path entry (a finder maps it), which is what the
    # watchdog's -S once missed; the .pth layout is a plain directory on sys.path.
    for install in (wheel_install, editable_install, pth_install):
        assert (install.package / "__init__.py").is_file()
    site = wheel_install.package.parent
    assert not list(site.glob("__editable__*"))
    editable_site = next(editable_install.venv.glob("lib/python*/site-packages"))
    assert list(editable_site.glob("__editable__*.pth"))
    assert str(editable_install.package.parent) not in _sys_path(editable_install)
    assert str(pth_install.package.parent) in _sys_path(pth_install)


def _sys_path(install: Install) -> list[str]:
    done = subprocess.run(
        [str(install.python), "-c", "import json, sys; print(json.dumps(sys.path))"],
        capture_output=True,
        text=True,
        check=True,
        env=install.env(dict(os.environ)),
        timeout=60,
    )
    found: list[str] = json.loads(done.stdout)
    return found

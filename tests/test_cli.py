"""The command line as a user meets it, through real processes: ``trio-worker`` and
``python worker.py [flags]``. Everyday mistakes are one line on stderr with status 2."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trio_worker import __version__

REPO = Path(__file__).resolve().parents[1]
ECHO = REPO / "examples" / "echo_worker.py"
FLAGS = ("--test_input", "--rp_log_level", "--rp_serve_api", "--rp_api_host", "--rp_api_port")


def run(*argv: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    # No PYTHONPATH: the commands run as installed, as a user's do.
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RUNPOD_", "TW_")) and k != "PYTHONPATH"
    }
    clean.update(env)
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean,
        cwd=cwd or REPO,
        check=False,
    )


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run("-m", "trio_worker._cli", *args, cwd=cwd)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        sock.listen()
        yield sock.getsockname()[1]


# -- trio-worker ----------------------------------------------------------------------------


def test_help_names_the_launcher_and_the_local_endpoint() -> None:
    done = cli("--help")
    assert done.returncode == 0
    assert "run a handler file as a worker, with the crash watchdog in front of it" in (
        " ".join(done.stdout.split())
    )
    done = cli("run", "--help")
    assert done.returncode == 0
    assert done.stdout.startswith("usage: trio-worker run [-h] HANDLER_FILE ...")


def test_version() -> None:
    done = cli("--version")
    assert (done.returncode, done.stdout) == (0, f"trio-worker {__version__}\n")


def test_dev_help_describes_every_flag_with_its_default() -> None:
    done = cli("dev", "--help")
    assert done.returncode == 0
    assert "the Python file that calls trio_worker.start()" in done.stdout
    flat = " ".join(done.stdout.split())  # argparse wraps the help at the terminal width
    assert "address to listen on; requests must name it, localhost, 127.0.0.1" in flat
    assert "in their Host header (default: localhost)" in flat
    assert "port to listen on (default: 8000)" in done.stdout


def test_no_command_is_a_one_line_usage_error() -> None:
    done = cli()
    assert (done.returncode, done.stderr) == (
        2,
        "trio-worker: error: the following arguments are required: COMMAND\n",
    )


def test_a_missing_file_is_a_one_line_usage_error(tmp_path: Path) -> None:
    done = cli("dev", "nope.py", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (2, "trio-worker: error: nope.py: no such file\n")


@pytest.mark.parametrize(
    ("launcher", "prog"),
    [
        (["-m", "trio_worker._cli", "run"], "trio-worker"),
        (["-m", "trio_worker"], "python -m trio_worker"),
    ],
)
def test_the_launcher_names_a_missing_file_in_one_line(
    tmp_path: Path, launcher: list[str], prog: str
) -> None:
    done = run(*launcher, "nope.py", "--test_input", "{}", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (2, f"{prog}: error: nope.py: no such file\n")
    (tmp_path / "a_directory").mkdir()
    done = run(*launcher, "a_directory", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (2, f"{prog}: error: a_directory: is a directory\n")
    done = run(*launcher, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (
        2,
        f"{prog}: error: the following arguments are required: HANDLER_FILE\n",
    )


def test_the_launcher_passes_every_argument_after_the_file_to_it(tmp_path: Path) -> None:
    write(tmp_path / "handler.py", "import os, sys\nprint(os.getpid(), sys.argv[1:])\n")
    args = ["-h", "--port", "1", "run", "--", "x"]
    done = run("-m", "trio_worker", "handler.py", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(" ", 1)[1] == f"{args}\n"


def test_a_file_that_never_calls_start_says_so(tmp_path: Path) -> None:
    write(tmp_path / "handler.py", "def handler(job):\n    return job\n")
    done = cli("dev", "handler.py", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (
        2,
        "trio-worker: error: handler.py ran to its end without calling trio_worker.start()\n",
    )


def test_dev_runs_the_file_as_python_file_would(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    write(app / "helpers.py", "GREETING = 'imported from beside the handler'\n")
    write(
        app / "handler.py",
        "import sys\nimport helpers\n"
        "print(helpers.GREETING, __name__, sys.argv[1:], sys.path[0])\n",
    )
    done = cli("dev", "app/handler.py", "--port", "9123", "--model", "x", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    args = ["--rp_serve_api", "--rp_api_host", "localhost", "--rp_api_port", "9123"]
    assert done.stdout == (
        f"imported from beside the handler __main__ {[*args, '--model', 'x']} {app}\n"
    )


def test_a_port_in_use_is_one_line_with_status_2(tmp_path: Path, busy_port: int) -> None:
    write(tmp_path / "handler.py", "import trio_worker\ntrio_worker.start(lambda job: job)\n")
    done = cli("dev", "handler.py", "--port", str(busy_port), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"handler.py: error: cannot serve on localhost:{busy_port}: Address already in use"
    )
    assert "Traceback" not in done.stderr


# -- python worker.py [flags] ---------------------------------------------------------------


def test_help_describes_the_reference_flags_and_exits_0() -> None:
    done = run(str(ECHO), "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: echo_worker.py [-h] [--test_input JSON]")
    for flag in FLAGS:
        assert flag in done.stdout
    assert "(default: 8000)" in done.stdout and "(default: localhost)" in done.stdout
    assert done.stderr == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--test_input"],
            """--test_input needs a value: the job as JSON, e.g. --test_input '{"input": {}}'""",
        ),
        (["--rp_api_port", "http"], "--rp_api_port must be an integer, got 'http'"),
        (["--rp_serve_api", "--rp_api_port"], "argument --rp_api_port: expected one argument"),
    ],
)
def test_flag_mistakes_are_one_line_with_status_2(args: list[str], message: str) -> None:
    done = run(str(ECHO), *args)
    assert (done.returncode, done.stderr) == (2, f"echo_worker.py: error: {message}\n")


def test_serve_api_on_a_port_in_use_is_one_line_with_status_2(busy_port: int) -> None:
    done = run(str(ECHO), "--rp_serve_api", "--rp_api_port", str(busy_port))
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"echo_worker.py: error: cannot serve on localhost:{busy_port}: Address already in use"
    )
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("mode", [["--test_input", '{"input": 1}'], ["--rp_serve_api"]])
def test_local_modes_make_the_queue_modes_configuration_checks(
    tmp_path: Path, mode: list[str]
) -> None:
    script = write(
        tmp_path / "worker.py", "import trio_worker\ntrio_worker.start(lambda job: job)\n"
    )
    done = run(str(script), *mode, RUNPOD_PING_INTERVAL="10s")
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.endswith("configuration error: RUNPOD_PING_INTERVAL must be an integer, got '10s'")


def test_sys_exit_in_a_handler_exits_with_its_status_locally(tmp_path: Path) -> None:
    script = write(
        tmp_path / "worker.py",
        "import sys, trio_worker\n"
        "def handler(job):\n    sys.exit(job['input'])\n"
        "trio_worker.start(handler)\n",
    )
    done = run(str(script), "--test_input", '{"input": 3}')
    assert done.returncode == 3, done.stderr
    error = json.loads(json.loads(done.stdout.splitlines()[-1])["error"])
    assert error["error_type"] == "SystemExit"
    assert error["error_message"].startswith("handler called sys.exit(3)")
    # The reported traceback starts at the user's code.
    trace = error["error_traceback"].splitlines()
    assert trace[1].endswith("elided)") and trace[2].startswith(f'  File "{script}"')


EMBEDDED = """
import sys
sys.argv = []  # what an interpreter embedded in another program may leave
import trio_worker

async def app(scope, receive, send):
    pass

if {which!r} == "start":
    trio_worker.start(lambda job: job["input"])
trio_worker.start_app(app, argv={argv!r})
"""


@pytest.mark.parametrize(
    ("which", "argv"),
    [("start", []), ("start_app", ["--help"]), ("start_app", ["--rp_api_port", "http"])],
)
def test_an_empty_sys_argv_reads_the_flags_and_names_the_program_worker(
    which: str, argv: list[str]
) -> None:
    # start() reads sys.argv: empty, no flag; with no test input either, it says so.
    done = run("-c", EMBEDDED.format(which=which, argv=argv), cwd=REPO / "docs")
    assert "Traceback" not in done.stderr, done.stderr
    if which == "start":
        assert done.returncode == 1, done.stderr
        assert "local mode: no --test_input and no test_input.json here" in done.stderr
    elif argv == ["--help"]:
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout.startswith("usage: worker [-h] [--test_input JSON]")
    else:
        assert (done.returncode, done.stderr) == (
            2,
            "worker: error: --rp_api_port must be an integer, got 'http'\n",
        )

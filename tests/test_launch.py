"""The launcher's decisions, in process: when the handler file runs in its place, and how
the file's ``start()`` finds the launcher's fds (docs/design.md §13.1). The processes
themselves are in tests/integration/test_launcher.py."""

from __future__ import annotations

import json
import logging
import marshal
import os
from collections.abc import Iterator

import pytest

from trio_worker._watch._launch import plain_reason
from trio_worker._watch._launched import ENV, PROTOCOL, find_launch, read_options

QUEUE = {"RUNPOD_WEBHOOK_GET_JOB": "http://platform.test/v2/e/job-take/$ID"}


@pytest.mark.parametrize(
    ("args", "environ", "plain"),
    [
        ([], QUEUE, None),
        (["--model", "x", "--rp_log_level", "DEBUG"], QUEUE, None),  # not local flags
        (["--test_input", '{"input": 1}'], QUEUE, "a local mode"),
        (["--test_input={}"], QUEUE, "a local mode"),
        (["--rp_serve_api"], QUEUE, "a local mode"),
        (["-h"], QUEUE, "a local mode"),
        (["--test"], QUEUE, None),  # no abbreviations, as start()
        (["--test_input"], QUEUE, "a mistake in the flags, which start() explains"),
        ([], {}, "local mode: no RUNPOD_WEBHOOK_GET_JOB"),
        ([], {"RUNPOD_WEBHOOK_GET_JOB": ""}, "local mode: no RUNPOD_WEBHOOK_GET_JOB"),
        ([], {**QUEUE, "TRIO_WORKER_CRASH_WATCH": "off"}, "TRIO_WORKER_CRASH_WATCH=off"),
        ([], {**QUEUE, "TRIO_WORKER_CRASH_WATCH": "1"}, None),
    ],
)
def test_the_file_runs_in_the_launchers_place_where_nothing_is_watched(
    args: list[str], environ: dict[str, str], plain: str | None
) -> None:
    assert plain_reason(args, environ) == plain


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def test_the_options_start_sends_reach_the_watchdog(pipe: tuple[int, int]) -> None:
    r, w = pipe
    options = {"timings": {"shutdown_grace": 2.5}, "capture_logs": "off", "log_level": 10}
    os.write(w, marshal.dumps(options))
    os.close(w)
    assert read_options(r) == options


@pytest.mark.parametrize("sent", [None, b"", b"not marshal", marshal.dumps([1, 2])])
def test_no_options_or_garbage_leave_the_defaults(
    pipe: tuple[int, int], sent: bytes | None
) -> None:
    r, w = pipe
    if sent is not None:  # else start() never ran: the write end is still open, empty
        os.write(w, sent)
        os.close(w)
    assert read_options(r) == {}


def launch_value(**changes: object) -> str:
    fds = {"records": 0, "state": 1, "options": 2, "signals": 2, "tee": None}  # open anywhere
    return json.dumps({"protocol": PROTOCOL, "watchdog": os.getppid(), **fds, **changes})


def test_the_launchers_fds_are_found_and_the_variable_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV, launch_value())
    launch = find_launch()
    assert launch is not None and launch["options"] == 2
    assert ENV not in os.environ  # what this worker starts later is not launched
    assert find_launch() is None


OTHER = "written by another version of trio_worker, or not by the launcher"
FDS = "it does not name this process's open fds"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        # A process is never its own parent (PID 1 may well be: a container's, or init's
        # after a shell that started pytest in the background has exited).
        (launch_value(watchdog=os.getpid()), "the watchdog it names is not this process's parent"),
        (launch_value(protocol=PROTOCOL + 1), OTHER),
        ("{not json", OTHER),
        (launch_value(records="5"), FDS),
        (launch_value(state=True), FDS),
        (launch_value(options=987654), FDS),  # not open here
        (launch_value(tee={"copies": [0], "upstream": [1, 2], "seq": 0}), FDS),
        (launch_value(tee=[0, 1]), FDS),
    ],
)
def test_a_variable_not_from_this_processs_launcher_is_ignored(
    monkeypatch: pytest.MonkeyPatch, worker_log: list[logging.LogRecord], value: str, why: str
) -> None:
    monkeypatch.setenv(ENV, value)
    assert find_launch() is None
    assert ENV not in os.environ
    assert [record.getMessage() for record in worker_log] == [f"ignoring {ENV} ({why})"]

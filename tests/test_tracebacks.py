"""``_tracebacks``: an exception's reported type name, and its traceback starting at the user's
code: the frames of trio_worker, trio, outcome and asyncio that lead up to the handler are
elided, with a line saying how many."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import trio_worker
from trio_worker._tracebacks import error_type_name, format_traceback

SDK_FILE = str(Path(trio_worker.__file__).with_name("_pretend_runner.py"))
TRIO_FILE = str(Path(trio.__file__).with_name("_pretend_threads.py"))


def _define(filename: str, source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


# Two "SDK" frames (one in trio_worker, one in trio) call the user's function; the
# outermost one catches what it raises, as the job runner does.
_SDK = _define(
    SDK_FILE,
    "def run(fn):\n    try:\n        hop(fn)\n    except BaseException as exc:\n"
    "        return exc\n    raise AssertionError('did not raise')\n",
)
_SDK.update(_define(TRIO_FILE, "def hop(fn):\n    return fn()\n"))
_SDK["run"].__globals__["hop"] = _SDK["hop"]


def user_handler() -> None:
    raise ValueError("bad input")


def caught(fn: Any) -> BaseException:
    exc = _SDK["run"](fn)
    assert isinstance(exc, BaseException)
    return exc


def test_leading_sdk_frames_are_elided_with_a_count() -> None:
    lines = format_traceback(caught(user_handler)).splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1] == "  (2 frames of trio_worker and trio elided)"
    assert lines[2].startswith(f'  File "{__file__}"') and "user_handler" in lines[2]
    assert lines[-1] == "ValueError: bad input"
    assert SDK_FILE not in "\n".join(lines) and TRIO_FILE not in "\n".join(lines)


def test_sdk_frames_called_back_from_user_code_are_kept() -> None:
    def handler() -> None:
        raise caught(user_handler)  # the user's code calls into the SDK again

    text = format_traceback(caught(handler))
    assert "(2 frames of trio_worker and trio elided)" in text
    assert TRIO_FILE in text  # the inner call's frames sit between user frames


def test_a_traceback_with_no_user_frame_is_kept_whole() -> None:
    sdk_only = _define(SDK_FILE, "def boom():\n    raise RuntimeError('ours')\n")["boom"]
    exc = caught(sdk_only)
    assert format_traceback(exc) == "".join(traceback.format_exception(exc))


def test_without_sdk_frames_the_traceback_is_pythons_own() -> None:
    with pytest.raises(ValueError) as info:
        user_handler()
    assert format_traceback(info.value) == "".join(traceback.format_exception(info.value))


def test_causes_and_group_members_are_elided_too() -> None:
    def chained() -> None:
        raise RuntimeError("wrapped") from caught(user_handler)

    grouped = BaseExceptionGroup("several", [caught(user_handler), caught(chained)])
    text = format_traceback(grouped)
    # The two members' own stacks and the cause's: three elisions.
    assert text.count("frames of trio_worker and trio elided)") == 3, text


# --- names, chains and groups --------------------------------------------------------------------


class LibraryError(Exception):
    pass


LibraryError.__module__ = "somelib.errors"


def test_error_type_name() -> None:
    assert error_type_name(RuntimeError("x")) == "RuntimeError"
    assert error_type_name(LibraryError()) == "somelib.errors.LibraryError"
    main_cls = type("BadInput", (ValueError,), {"__module__": "__main__"})
    assert error_type_name(main_cls()) == "BadInput"
    private = type("ConnectError", (Exception,), {"__module__": "somelib._exceptions"})
    assert error_type_name(private()) == "somelib.ConnectError"
    assert error_type_name(trio.TooSlowError()) == "trio.TooSlowError"
    assert error_type_name(httpx.ConnectError("x")) == "httpx.ConnectError"


def test_error_types_in_payloads_are_importable() -> None:
    # Payloads name them "trio_worker.MalformedJob", "trio_worker.AsyncioUnderTrio", ...
    from trio_worker import AsyncioUnderTrio, MalformedJob, TrioUnderAsyncio

    assert error_type_name(MalformedJob("x")) == "trio_worker.MalformedJob"
    assert error_type_name(AsyncioUnderTrio("x")) == "trio_worker.AsyncioUnderTrio"
    assert error_type_name(TrioUnderAsyncio("x")) == "trio_worker.TrioUnderAsyncio"


def test_format_traceback_includes_the_chain() -> None:
    try:
        try:
            raise KeyError("inner-cause")
        except KeyError as inner:
            raise RuntimeError("outer-failure") from inner
    except RuntimeError as outer:
        text = format_traceback(outer)
    assert "KeyError: 'inner-cause'" in text
    assert "direct cause of the following exception" in text
    assert text.rstrip().endswith("RuntimeError: outer-failure")


def test_format_traceback_of_an_exception_group() -> None:
    from .test_payloads import raised

    group = raised(ExceptionGroup("two failed", [ValueError("first"), OSError("second")]))
    text = format_traceback(group)
    assert "ValueError: first" in text
    assert "OSError: second" in text

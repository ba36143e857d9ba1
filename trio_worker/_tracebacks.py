"""Naming an exception and formatting its traceback for an error report.

The SDK's own leading frames are left out, counted in one line (docs/reference.md, "Error
shapes"). Neither function ever raises: a pathological exception must not lose its report.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import re
import sys
import traceback

import outcome
import trio

__all__ = ["ASYNCIO_DIR", "error_type_name", "format_traceback", "one_line", "safe_str"]


def error_type_name(exc: BaseException) -> str:
    """The exception's class, named as a reader would import it (docs/reference.md,
    "Handler exception"): plain for built-ins and ``__main__``, else qualified by its module
    path up to its first private part, where libraries re-export their exceptions.
    """
    cls = type(exc)
    module = cls.__module__ if isinstance(cls.__module__, str) else ""
    if module in ("builtins", "__main__", ""):
        return cls.__qualname__
    public: list[str] = []
    for part in module.split("."):
        if part.startswith("_"):
            break
        public.append(part)
    return ".".join([*public, cls.__qualname__])


def format_traceback(exc: BaseException) -> str:
    """The traceback of *exc*, its causes, contexts and exception-group members, each
    starting at the user's code, the frames before it counted in one line. A traceback of
    such frames only (an error of the SDK's own) is kept whole.
    """
    try:
        summary = traceback.TracebackException.from_exception(exc)
        _elide_sdk_frames(summary)
        return "".join(summary.format())
    except Exception as failure:  # a pathological exception must not lose the report
        return f"{error_type_name(exc)}: {safe_str(exc)}\n(traceback unavailable: {failure!r})"


def _package_dir(path: str | None) -> str:
    return os.path.dirname(os.path.abspath(str(path))) + os.sep


def _asyncio_dir() -> str:
    # Found, not imported: a worker on the trio backend never pays asyncio's import.
    module = sys.modules.get("asyncio")
    if module is None:
        spec = importlib.machinery.PathFinder.find_spec("asyncio")
        if spec is not None and spec.origin is not None:
            return _package_dir(spec.origin)
        module = importlib.import_module("asyncio")  # a stdlib with no file on the path
    return _package_dir(module.__file__)


#: asyncio's own directory: its frames lead up to a handler call, and an error raised in it
#: is asyncio code failing for want of its loop (``_backends``).
ASYNCIO_DIR = _asyncio_dir()


# The packages whose frames lead up to a handler call, by their directory.
_SDK_DIRS = {
    _package_dir(__file__): "trio_worker",
    _package_dir(trio.__file__): "trio",
    _package_dir(outcome.__file__): "outcome",
    ASYNCIO_DIR: "asyncio",
}
_SDK_PREFIXES = tuple(_SDK_DIRS)


def _package_of(filename: str) -> str | None:
    for prefix, name in _SDK_DIRS.items():
        if filename.startswith(prefix):
            return name
    return None


class _ElidedStack(traceback.StackSummary):
    """A stack whose leading SDK frames were removed; its first line says how many."""

    note = ""

    def format(self) -> list[str]:
        return [self.note, *super().format()]


def _elide_sdk_frames(summary: traceback.TracebackException) -> None:
    seen: set[int] = set()
    todo = [summary]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        frames = list(current.stack)
        leading = 0
        while leading < len(frames) and frames[leading].filename.startswith(_SDK_PREFIXES):
            leading += 1
        if 0 < leading < len(frames):
            stack = _ElidedStack(frames[leading:])
            stack.note = _elided_note(frames[:leading])
            current.stack = stack
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
        todo += current.exceptions or []


def _elided_note(frames: list[traceback.FrameSummary]) -> str:
    names = list(dict.fromkeys(_package_of(f.filename) or "?" for f in frames))
    packages = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    noun = "frame" if len(frames) == 1 else "frames"
    return f"  ({len(frames)} {noun} of {packages} elided)\n"


def safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}: str() failed>"


# Line breaks and every other control character a terminal or a log shipper acts on:
# C0 but the tab, DEL, C1, and Unicode's line and paragraph separators.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """*text* for one log line: each control character written as its escape (``\\n``,
    ``\\x1b``, ``\\u2028``), so a message cannot forge a line of its own, nor colour or
    move the terminal that shows it."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], text)

"""Clearing the reference's rp_debugger after each job (tests/compat runs it for real).

These run without ``runpod`` installed: a stand-in module under the debugger's name.
"""

from __future__ import annotations

import logging
import sys
import types

import pytest

from trio_worker import _compat
from trio_worker._compat import DEBUGGER_MODULE, clear_reference_debugger


def _stand_in(monkeypatch: pytest.MonkeyPatch, clear: object) -> None:
    module = types.ModuleType(DEBUGGER_MODULE)
    module.clear_debugger_output = clear  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, DEBUGGER_MODULE, module)


def test_nothing_happens_when_the_debugger_was_never_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, DEBUGGER_MODULE, raising=False)
    clear_reference_debugger()
    assert DEBUGGER_MODULE not in sys.modules  # looked up, never imported


def test_a_loaded_debugger_is_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[None] = []
    _stand_in(monkeypatch, lambda: calls.append(None))
    for _ in range(3):
        clear_reference_debugger()
    assert len(calls) == 3


def test_a_failing_clear_is_logged_once_and_never_raises(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> None:
        raise AttributeError("no attribute 'checkpoints'")

    monkeypatch.setattr(_compat, "_warned", False)
    _stand_in(monkeypatch, broken)
    with caplog.at_level(logging.WARNING, logger="trio_worker"):
        for _ in range(3):
            clear_reference_debugger()
    warnings = [r.getMessage() for r in caplog.records if "rp_debugger" in r.getMessage()]
    assert len(warnings) == 1
    assert "AttributeError: no attribute 'checkpoints'" in warnings[0]

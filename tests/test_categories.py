"""The error-category rules (docs/design.md §7): their order, user timeouts, the evidence
read (chain, groups, notes, output) and the table against docs/error-categories.md. The
messages real libraries print: tests/test_categories_real_messages.py."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
from pathlib import Path

import pytest
import trio

from trio_worker._categories import RULES, Rule, classify

from .library_errors import (
    CUDA_ASYNC_NOTE,
    HF_GATED,
    HF_LOCAL_ENTRY,
    KERNEL_OOM,
    KERNEL_OOM_KILL,
    TORCH_OOM,
    GatedRepoError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    TorchOutOfMemoryError,
    oserror,
    raised,
)

# --- order ----------------------------------------------------------------------------------


def test_cuda_oom_is_out_of_memory_not_cuda_error() -> None:
    text = "CUDA error: out of memory" + CUDA_ASYNC_NOTE
    assert any(p.search(text.lower()) for p in _rule("cuda").patterns)  # both rules match
    assert classify(RuntimeError(text)) == "out_of_memory"
    assert _index("oom") < _index("cuda")


def test_cuda_library_import_is_cuda_error_not_import_error() -> None:
    assert _index("cuda") < _index("import")
    exc = ImportError(
        "libcublasLt.so.12: cannot open shared object file: No such file or directory"
    )
    assert classify(exc) == "cuda_error"


def test_missing_shared_object_is_import_error_not_file_not_found() -> None:
    assert _index("import") < _index("file_not_found")
    assert (
        classify(OSError("libGL.so.1: cannot open shared object file: No such file or directory"))
        == "import_error"
    )


def test_hf_offline_is_network_although_it_is_a_file_not_found_error() -> None:
    exc = LocalEntryNotFoundError(HF_LOCAL_ENTRY)
    assert isinstance(exc, FileNotFoundError)
    assert _index("hf_offline") < _index("file_not_found")
    assert classify(exc) == "network"


def test_gated_repo_is_permission_although_it_is_a_repository_not_found_error() -> None:
    exc = GatedRepoError(HF_GATED)
    assert isinstance(exc, RepositoryNotFoundError)
    assert classify(exc) == "permission"
    # Without the 401, a missing repository is file_not_found.
    assert classify(
        RepositoryNotFoundError("404 Client Error. Repository Not Found for url: x")
    ) == ("file_not_found")


def test_disk_full_while_downloading_is_disk_full() -> None:
    exc = OSError(28, "No space left on device")
    exc.__context__ = ConnectionResetError(104, "Connection reset by peer")
    assert classify(exc) == "disk_full"


def test_first_rule_wins_across_the_chain() -> None:
    """An OOM anywhere in the chain beats a CUDA error at the top."""
    outer = raised(
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        TorchOutOfMemoryError(TORCH_OOM),
    )
    assert classify(outer) == "out_of_memory"


# --- I4: user timeouts are the user's own errors ----------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError(),
        TimeoutError("timed out"),
        trio.TooSlowError(),
    ],
    ids=["TimeoutError", "TimeoutError msg", "trio.TooSlowError"],
)
def test_user_timeouts_are_never_category_timeout(exc: BaseException) -> None:
    assert classify(exc) == "unknown"
    assert classify(exc, output="Loading checkpoint shards: 100%|██████████| 4/4") == "unknown"


def test_socket_and_asyncio_timeouts_are_the_builtin() -> None:
    """So the TimeoutError cases above cover them too (Python >= 3.11)."""
    assert socket.timeout is TimeoutError
    assert asyncio.TimeoutError is TimeoutError


def test_no_rule_produces_timeout_or_worker_shutdown() -> None:
    assert {r.category for r in RULES}.isdisjoint({"timeout", "worker_shutdown", "unknown"})


def test_user_timeout_wrapping_a_real_cause_takes_the_cause() -> None:
    outer = raised(
        TimeoutError("model server did not come up"),
        oserror(ConnectionRefusedError, 111, "Connection refused"),
    )
    assert classify(outer) == "network"


# --- the evidence: chain, groups, notes, output -----------------------------------------------


def test_cause_is_read() -> None:
    outer = raised(
        RuntimeError("failed to save the image"), oserror(OSError, 28, "No space left on device")
    )
    assert outer.__cause__ is not None
    assert classify(outer) == "disk_full"


def test_context_hidden_by_from_none_is_still_evidence() -> None:
    outer = raised(
        ValueError("image too large for this GPU"), TorchOutOfMemoryError(TORCH_OOM), hide=True
    )
    assert outer.__suppress_context__
    assert outer.__cause__ is None
    assert classify(outer) == "out_of_memory"


def test_exception_group_members_are_read() -> None:
    group = BaseExceptionGroup(
        "Exceptions from Trio nursery",
        [KeyboardInterrupt(), ExceptionGroup("nested", [ValueError("x"), MemoryError()])],
    )
    assert classify(group) == "out_of_memory"


def test_notes_are_read() -> None:
    exc = RuntimeError("engine failed")
    exc.add_note("worker 3: CUDA error: device-side assert triggered")
    assert classify(exc) == "cuda_error"


def test_cyclic_chain_terminates() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__context__, b.__context__ = b, a
    assert classify(a) == "unknown"


def test_broken_str_does_not_break_classification() -> None:
    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert classify(Weird()) == "unknown"
    assert classify(Weird(), output="OSError: [Errno 28] No space left on device") == "disk_full"


def test_child_killed_with_oom_text_in_output_is_out_of_memory() -> None:
    exc = subprocess.CalledProcessError(-9, ["python", "convert.py"])
    assert classify(exc) == "unknown"  # "died with <Signals.SIGKILL: 9>" alone proves nothing
    output = "Killed\n" + KERNEL_OOM_KILL + "\n" + KERNEL_OOM + "\n"
    assert classify(exc, output) == "out_of_memory"
    assert classify(None, "Memory cgroup out of memory: Killed process 77 (python)") == (
        "out_of_memory"
    )


def test_engine_death_explained_by_output() -> None:
    exc = RuntimeError("Engine core initialization failed. See root cause above.")
    output = f"(EngineCore_0 pid=311) ERROR ... torch.OutOfMemoryError: {TORCH_OOM}\n"
    assert classify(exc, output) == "out_of_memory"


def test_exception_beats_noisy_output() -> None:
    noisy = (
        "WARNING: Retrying (Retry(total=4)) after connection broken by"
        " 'NewConnectionError(... [Errno 111] Connection refused)'\n"
    )
    exc = oserror(PermissionError, 13, "Permission denied", "/runpod-volume/out.png")
    assert classify(exc, noisy) == "permission"
    assert classify(ValueError("bad input"), noisy) == "network"  # output is read as a fallback


def test_output_only_and_nothing() -> None:
    assert classify(None) == "unknown"
    assert classify(None, "") == "unknown"
    assert classify(None, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.") == (
        "cuda_error"
    )


def test_huge_messages_are_classified_quickly() -> None:
    exc = RuntimeError("x" * 5_000_000 + " CUDA out of memory")
    assert classify(exc, "y" * 5_000_000) == "out_of_memory"


# --- the table itself ---------------------------------------------------------------------------


def test_patterns_are_lower_case_and_fast() -> None:
    for rule in RULES:
        for pattern in rule.patterns:
            literal = re.sub(r"\\.", "", pattern.pattern)
            assert literal == literal.lower(), (rule.name, pattern.pattern)
            assert not pattern.pattern.startswith(r"\b"), (rule.name, pattern.pattern)
            assert not pattern.flags & re.IGNORECASE


def test_rule_names_are_unique() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))


def test_documented_table_matches_rules() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "error-categories.md").read_text()
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*`([^`]+)`\s*\|\s*`([^`]+)`\s*\|", doc, re.M)
    assert [(int(n), name, cat) for n, name, cat in rows] == [
        (i, r.name, r.category) for i, r in enumerate(RULES, start=1)
    ]
    for rule in RULES:
        section = doc.split(f"### `{rule.name}`\n", 1)[1].split("\n### ", 1)[0]
        listed = re.findall(r"^- `(.+)`$", section.split("Examples:", 1)[0], re.M)
        assert listed == [p.pattern for p in rule.patterns], rule.name


def _rule(name: str) -> Rule:
    return next(r for r in RULES if r.name == name)


def _index(name: str) -> int:
    return next(i for i, r in enumerate(RULES) if r.name == name)

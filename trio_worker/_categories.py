"""The ``error_category`` of a failure: an ordered rule table, first match wins.

The rules, their order and the reasons for it are ``docs/error-categories.md`` (checked
against ``RULES`` by ``tests/test_categories.py``); why categories exist is docs/design.md §7.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["NATIVE_FAULTS", "RULES", "Category", "Rule", "classify", "classify_crash"]

Category = Literal[
    "out_of_memory",
    "cuda_error",
    "timeout",
    "import_error",
    "file_not_found",
    "network",
    "disk_full",
    "permission",
    "worker_shutdown",
    "segfault",
    "unknown",
]

# Bounds that keep classification cheap whatever the user raised: huge texts are read by
# their head and tail, pathological chains or groups walked only so far.
_MAX_TEXT_SCAN = 64 * 1024
_MAX_CHAIN = 64


@dataclass(frozen=True)
class Rule:
    """One row of the category table.

    ``exception_types`` are class names (``cls.__name__``) looked up in the whole MRO.
    ``patterns`` are lower case, searched in the lower-cased messages of the exception chain
    and then of the captured output.
    """

    category: Category
    name: str
    exception_types: tuple[str, ...]
    patterns: tuple[re.Pattern[str], ...]


def _lc(*regexes: str) -> tuple[re.Pattern[str], ...]:
    """Patterns written in lower case, matched against lower-cased text.

    Case-insensitive in effect, but faster: re only skips ahead by a literal prefix when
    matching case-sensitively, which is also why no pattern starts with ``\\b``.
    """
    return tuple(re.compile(r) for r in regexes)


# Shared libraries whose absence or mismatch is a CUDA installation problem.
_CUDA_LIBRARY = (
    r"lib(?:cuda|cudart|cublas(?:lt)?|cudnn\w*|nccl|nvrtc|cufft|curand|cusparse|cusolver"
    r"|nvjitlink|nvtoolsext|nvidia-ml)\b[\w.\-]*\.so"
)

# Order is precedence (docs/error-categories.md, "Why this order").
RULES: tuple[Rule, ...] = (
    Rule(
        category="out_of_memory",
        name="oom",
        exception_types=("MemoryError", "OutOfMemoryError", "ResourceExhaustedError"),
        patterns=_lc(
            r"out of memory",
            r"memoryerror\b",  # also outofmemoryerror, _arraymemoryerror
            r"oom when allocating\b",
            r"std::bad_alloc",
            r"cannot allocate memory",
            r"\[errno 12\]",
            r"oom[-_]kill",
            r"killed process \d+",
            r"cublas_status_alloc_failed\b",
            r"cudnn_status_alloc_failed\b",
            r"cudaerrormemoryallocation\b",
            r"cuda_error_out_of_memory\b",
        ),
    ),
    Rule(
        category="cuda_error",
        name="cuda",
        exception_types=(
            "AcceleratorError",
            "CUDARuntimeError",
            "CUDADriverError",
            "CuDNNError",
            "CUBLASError",
            "NCCLError",
            "NVMLError",
        ),
        patterns=_lc(
            r"cuda (?:runtime )?error\b",
            r"hip error:",
            r"device-side assert",
            r"illegal memory access",
            r"cuda kernel errors might be asynchronously reported",
            r"cublas_status_\w+",
            r"cudnn_status_\w+",
            r"cudnn error\b",
            r"nccl error\b",
            r"nccl\w*error\b",
            r"cudaerror\w+",
            r"cuda_error_\w+",
            r"found no nvidia driver",
            r"nvidia driver on your system is too old",
            r"torch not compiled with cuda enabled",
            r"torch\.cuda\.is_available\(\) is false",
            r"cuda driver version is insufficient",
            r"no cuda-capable device is detected",
            r"no cuda gpus are available",
            r"cuda-capable device\(s\) is/are busy or unavailable",
            r"gpu has fallen off the bus",
            r"failed to initialize nvml",
            r"nvidia-smi has failed",
            r"nvrm: xid",
            r"xid \(pci:",
            _CUDA_LIBRARY,
        ),
    ),
    Rule(
        category="disk_full",
        name="disk_full",
        exception_types=(),
        patterns=_lc(
            r"no space left on device",
            r"\[errno 28\]",
            r"disk quota exceeded",
            r"\[errno 122\]",
            r"enospc\b",
            r"edquot\b",
            r"insufficient shared memory \(shm\)",
        ),
    ),
    Rule(
        category="import_error",
        name="import",
        exception_types=("ImportError",),
        # no "No module named" text pattern: optional-dependency warnings ("No module named
        # 'triton'" from xformers on every start) fill captured output, and an ImportError
        # in the chain is already matched by its type.
        patterns=_lc(
            r"cannot open shared object file",
            r"undefined symbol: ",
            r"dll load failed",
        ),
    ),
    # Before file_not_found: LocalEntryNotFoundError is also a FileNotFoundError.
    Rule(
        category="network",
        name="hf_offline",
        exception_types=("LocalEntryNotFoundError", "OfflineModeIsEnabled"),
        patterns=_lc(
            r"we couldn't connect to '",
            r"cannot find the requested files in the local cache",
        ),
    ),
    # Before file_not_found: GatedRepoError subclasses RepositoryNotFoundError.
    Rule(
        category="permission",
        name="hf_access",
        exception_types=("GatedRepoError",),
        patterns=_lc(
            r"401 client error\b",
            r"403 client error\b",
            r"access to model \S+ is restricted",
            r"gated repo\b",
        ),
    ),
    Rule(
        category="file_not_found",
        name="file_not_found",
        exception_types=(
            "FileNotFoundError",
            "EntryNotFoundError",
            "RepositoryNotFoundError",
            "RevisionNotFoundError",
        ),
        patterns=_lc(
            r"no such file or directory",
            r"\[errno 2\]",
            r"does not appear to have a file named",
            r"entry not found\b",
            r"repository not found\b",
            r"revision not found\b",
            r"is not a local folder and is not a valid model identifier",
        ),
    ),
    Rule(
        category="network",
        name="network",
        exception_types=(
            "ConnectionError",
            "ConnectError",
            "ConnectTimeout",
            "ReadTimeout",
            "NetworkError",
            "ReadTimeoutError",
            "ConnectTimeoutError",
            "MaxRetryError",
            "NewConnectionError",
            "NameResolutionError",
            "ClientConnectionError",
            "ServerTimeoutError",
            "gaierror",
            "herror",
            "SSLError",
        ),
        patterns=_lc(
            r"max retries exceeded with url",
            r"failed to establish a new connection",
            r"temporary failure in name resolution",
            r"name or service not known",
            r"nodename nor servname provided",
            r"could not resolve host",
            r"connection refused",
            r"connection reset by peer",
            r"connection aborted",
            r"connection timed out",
            r"network is unreachable",
            r"no route to host",
            r"remote end closed connection",
            r"cannot connect to host",
            r"read timed out",
            r"readtimeouterror\b",
            r"could not find a version that satisfies the requirement",
            r"no matching distribution found",
            r"httperror: 5\d\d\b",
            r"http error 5\d\d\b",
            r"5\d\d server error\b",
            r"429 client error\b",
        ),
    ),
    Rule(
        category="permission",
        name="permission",
        exception_types=("PermissionError",),
        patterns=_lc(
            r"permission denied",
            r"\[errno 13\]",
            r"operation not permitted",
            r"\[errno 1\]",
            r"read-only file system",
            r"eacces\b",
            r"eperm\b",
        ),
    ),
)


def classify(exc: BaseException | None, output: str = "") -> Category:
    """The category of a failure, from its exception chain and then the captured output.

    Never returns ``"timeout"`` or ``"worker_shutdown"``: those are set by the caller for
    the SDK's own init deadline and shutdown. Returns ``"unknown"`` when no rule matches.
    """
    if exc is not None:
        chain = list(_walk(exc))
        type_names = [frozenset(c.__name__ for c in type(e).__mro__) for e in chain]
        messages = [_scan_text(m).lower() for e in chain for m in _messages(e)]
        for rule in RULES:
            if any(names.intersection(rule.exception_types) for names in type_names):
                return rule.category
            if any(p.search(m) for p in rule.patterns for m in messages):
                return rule.category
    if output:
        text = _scan_text(output).lower()
        for rule in RULES:
            if any(p.search(text) for p in rule.patterns):
                return rule.category
    return "unknown"


# Fatal signals raised by native code itself: a crash of a C/C++/CUDA extension.
NATIVE_FAULTS = frozenset(
    {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE}
)
_CRASH_TAIL = 16 * 1024  # the "last output" a crash is judged by: what its report carries
_CUDA_WORDS = ("cuda", "cublas", "cudnn", "nccl", "hip error")


def classify_crash(code: int, output: str, *, oom_killed: bool) -> Category:
    """The category of a worker process that died (``WorkerCrashed``, docs/design.md §13).

    *code* is the child's ``os.waitstatus_to_exitcode`` (negative: killed by that signal).
    In order: ``out_of_memory`` for SIGKILL when the kernel counted an OOM kill
    (*oom_killed*); what a CUDA line in the last output says (``cuda_error``, or
    ``out_of_memory`` for "CUDA out of memory"); ``segfault`` for a fatal signal of native
    code; else the rules above on the output.
    """
    if code == -signal.SIGKILL and oom_killed:
        return "out_of_memory"
    last = output[-_CRASH_TAIL:]
    said = classify(None, last)
    lowered = last.lower()
    if said in ("cuda_error", "out_of_memory") and any(w in lowered for w in _CUDA_WORDS):
        return said
    if -code in NATIVE_FAULTS:
        return "segfault"
    return said


def _walk(exc: BaseException) -> Iterator[BaseException]:
    """The exception, its causes, contexts and group members, each once, outermost first."""
    seen: set[int] = set()
    stack = [exc]
    while stack and len(seen) < _MAX_CHAIN:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        nested: list[BaseException] = []
        if isinstance(current, BaseExceptionGroup):
            nested.extend(current.exceptions)
        if current.__cause__ is not None:
            nested.append(current.__cause__)
        if current.__context__ is not None:
            nested.append(current.__context__)
        stack.extend(reversed(nested))


def _messages(exc: BaseException) -> list[str]:
    """``str(exc)`` and any PEP 678 notes; a broken ``__str__`` yields nothing."""
    texts: list[str] = []
    try:
        texts.append(str(exc))
    except Exception:
        pass
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list):
        texts.extend(n for n in notes if isinstance(n, str))
    return texts


def _scan_text(text: str) -> str:
    """Head and tail of a huge text, so matching stays fast whatever the user raised."""
    if len(text) <= _MAX_TEXT_SCAN:
        return text
    half = _MAX_TEXT_SCAN // 2
    return text[:half] + "\n" + text[-half:]

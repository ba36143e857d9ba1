"""The error-category rules, on the messages real libraries print (docs/design.md §7)."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import trio

from trio_worker._categories import RULES, Category, Rule, classify

# --- stand-ins for library exception classes: same names and bases as the real ones ---------


class TorchOutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError (also exposed as torch.cuda.OutOfMemoryError)."""


TorchOutOfMemoryError.__name__ = TorchOutOfMemoryError.__qualname__ = "OutOfMemoryError"
TorchOutOfMemoryError.__module__ = "torch"


class AcceleratorError(RuntimeError):
    """torch.AcceleratorError (torch >= 2.8 raises it for CUDA errors)."""


class HfHubHTTPError(OSError):  # the real one derives from requests.HTTPError, an OSError
    pass


class EntryNotFoundError(HfHubHTTPError):
    pass


class LocalEntryNotFoundError(EntryNotFoundError, FileNotFoundError, ValueError):
    pass


class RepositoryNotFoundError(HfHubHTTPError):
    pass


class GatedRepoError(RepositoryNotFoundError):
    pass


class RequestException(OSError):  # requests.exceptions.RequestException
    pass


class RequestsConnectionError(RequestException):
    """requests.exceptions.ConnectionError: not the builtin, but named the same."""


RequestsConnectionError.__name__ = "ConnectionError"


class HTTPError(RequestException):  # requests.exceptions.HTTPError
    pass


class ReadTimeoutError(Exception):  # urllib3.exceptions.ReadTimeoutError
    pass


# --- real message texts, verbatim -----------------------------------------------------------

TORCH_OOM = (
    "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 23.65 GiB"
    " of which 3.06 MiB is free. Process 1234 has 23.64 GiB memory in use. Of the allocated"
    " memory 23.19 GiB is allocated by PyTorch, and 1.02 MiB is reserved by PyTorch but"
    " unallocated. If reserved but unallocated memory is large try setting"
    " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See"
    " documentation for Memory Management "
    " (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
TORCH_OOM_OLD = (
    "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity; 12.94 GiB"
    " already allocated; 1.54 GiB free; 13.05 GiB reserved in total by PyTorch) If reserved"
    " memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See"
    " documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
CUDA_ASYNC_NOTE = (
    "\nCUDA kernel errors might be asynchronously reported at some other API call, so the"
    " stacktrace below might be incorrect.\nFor debugging consider passing"
    " CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side"
    " assertions.\n"
)
KERNEL_OOM = (
    "[12345.678901] Out of memory: Killed process 1234 (python) total-vm:48123456kB,"
    " anon-rss:31234567kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:61234kB oom_score_adj:0"
)
KERNEL_OOM_KILL = (
    "[12345.678800] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,"
    "mems_allowed=0,global_oom,task_memcg=/,task=python,pid=1234,uid=0"
)
NCCL_ERROR = (
    "NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:219, unhandled cuda error,"
    " NCCL version 2.14.3\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
    "Cuda failure 'invalid device ordinal'"
)
HF_OFFLINE = (
    "We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it in the"
    " cached files and it looks like gpt2 is not the path to a directory containing a file"
    " named config.json.\nCheckout your internet connection or see how to run the library in"
    " offline mode at 'https://huggingface.co/docs/transformers/installation#offline-mode'."
)
HF_LOCAL_ENTRY = (
    "An error happened while trying to locate the file on the Hub and we cannot find the"
    " requested files in the local cache. Please check your connection and try again or make"
    " sure your Internet connection is on."
)
HF_GATED = (
    "401 Client Error. (Request ID: Root=1-65a1b2c3-0a1b2c3d4e5f60718293a4b5;"
    "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b)\n\nCannot access gated repo for url"
    " https://huggingface.co/meta-llama/Llama-2-7b-hf/resolve/main/config.json.\nAccess to"
    " model meta-llama/Llama-2-7b-hf is restricted. You must be authenticated to access it."
)
HF_ENTRY_NOT_FOUND = (
    "404 Client Error. (Request ID: Root=1-65a1b2c3-1a2b3c4d5e6f708192a3b4c5)\n\nEntry Not Found"
    " for url: https://huggingface.co/gpt2/resolve/main/pytorch_model.bin."
)
HF_MISSING_FILE = (
    "stabilityai/stable-diffusion-xl-base-1.0 does not appear to have a file named"
    " pytorch_model.bin, model.safetensors, tf_model.h5, model.ckpt or flax_model.msgpack."
)
REQUESTS_DNS = (
    "HTTPSConnectionPool(host='huggingface.co', port=443): Max retries exceeded with url:"
    " /api/models/gpt2 (Caused by NewConnectionError('<urllib3.connection.HTTPSConnection"
    " object at 0x7f3b2c1d0e50>: Failed to establish a new connection: [Errno -3] Temporary"
    " failure in name resolution'))"
)
PIP_NOT_FOUND = (
    "ERROR: Could not find a version that satisfies the requirement torch==9.9.9 (from"
    " versions: none)\nERROR: No matching distribution found for torch==9.9.9"
)


def oserror(cls: type[OSError], errno: int, text: str, filename: str | None = None) -> OSError:
    return cls(errno, text) if filename is None else cls(errno, text, filename)


def raised(
    outer: type[BaseException] | BaseException, inner: BaseException, *, hide: bool = False
) -> BaseException:
    """*outer* raised while handling *inner*: ``from inner``, or ``from None`` with *hide*."""
    try:
        try:
            raise inner
        except BaseException:
            if hide:
                raise outer from None
            raise outer from inner
    except BaseException as caught:
        return caught
    raise AssertionError("unreachable")


CASES: list[tuple[str, BaseException, Category]] = [
    # out_of_memory
    ("torch OutOfMemoryError", TorchOutOfMemoryError(TORCH_OOM), "out_of_memory"),
    ("torch OOM as RuntimeError (old)", RuntimeError(TORCH_OOM_OLD), "out_of_memory"),
    (
        "CUDA error: out of memory",
        RuntimeError("CUDA error: out of memory" + CUDA_ASYNC_NOTE),
        "out_of_memory",
    ),
    ("MemoryError", MemoryError(), "out_of_memory"),
    ("numpy _ArrayMemoryError", type("_ArrayMemoryError", (MemoryError,), {})(), "out_of_memory"),
    ("std::bad_alloc", RuntimeError("std::bad_alloc"), "out_of_memory"),
    (
        "terminate bad_alloc",
        RuntimeError(
            "terminate called after throwing an instance of 'std::bad_alloc'\n"
            "  what():  std::bad_alloc"
        ),
        "out_of_memory",
    ),
    ("ENOMEM", oserror(OSError, 12, "Cannot allocate memory"), "out_of_memory"),
    (
        "HIP out of memory",
        TorchOutOfMemoryError(
            "HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of"
            " 191.98 GiB of which 1.23 GiB is free."
        ),
        "out_of_memory",
    ),
    (
        "cuBLAS alloc failure",
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        "out_of_memory",
    ),
    # cuda_error
    (
        "illegal memory access",
        RuntimeError("CUDA error: an illegal memory access was encountered" + CUDA_ASYNC_NOTE),
        "cuda_error",
    ),
    (
        "device-side assert",
        RuntimeError("CUDA error: device-side assert triggered" + CUDA_ASYNC_NOTE),
        "cuda_error",
    ),
    (
        "AcceleratorError by type",
        AcceleratorError("CUDA error: unspecified launch failure"),
        "cuda_error",
    ),
    (
        "cuBLAS execution failed",
        RuntimeError(
            "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa,"
            " opb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)`"
        ),
        "cuda_error",
    ),
    (
        "cuDNN not initialized",
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_INITIALIZED"),
        "cuda_error",
    ),
    ("cuDNN internal", RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"), "cuda_error"),
    ("NCCL", RuntimeError(NCCL_ERROR), "cuda_error"),
    (
        "ncclUnhandledCudaError",
        RuntimeError("ncclUnhandledCudaError: Call to CUDA function failed."),
        "cuda_error",
    ),
    (
        "no NVIDIA driver",
        RuntimeError(
            "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU"
            " and installed a driver from http://www.nvidia.com/Download/index.aspx"
        ),
        "cuda_error",
    ),
    (
        "driver too old",
        RuntimeError(
            "The NVIDIA driver on your system is too old (found version 11040). Please update"
            " your GPU driver by downloading and installing a new version from the URL:"
            " http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org"
            " to install a PyTorch version that has been compiled with your version of the CUDA"
            " driver."
        ),
        "cuda_error",
    ),
    (
        "not compiled with CUDA",
        AssertionError("Torch not compiled with CUDA enabled"),
        "cuda_error",
    ),
    ("is_available False", AssertionError("torch.cuda.is_available() is False"), "cuda_error"),
    (
        "driver insufficient",
        RuntimeError("CUDA driver version is insufficient for CUDA runtime version"),
        "cuda_error",
    ),
    (
        "no CUDA-capable device",
        RuntimeError("CUDA error: no CUDA-capable device is detected" + CUDA_ASYNC_NOTE),
        "cuda_error",
    ),
    (
        "Xid in a message",
        RuntimeError(
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
        ),
        "cuda_error",
    ),
    (
        "libcudart missing",
        ImportError("libcudart.so.12: cannot open shared object file: No such file or directory"),
        "cuda_error",
    ),
    (
        "libcudnn undefined symbol",
        OSError(
            "/usr/local/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn_cnn_infer.so.8:"
            " undefined symbol: _ZN11nvrtcHelper4loadEb, version libcudnn_ops_infer.so.8"
        ),
        "cuda_error",
    ),
    # import_error
    ("ModuleNotFoundError", ModuleNotFoundError("No module named 'vllm'"), "import_error"),
    (
        "ImportError by type",
        ImportError(
            "Using `bitsandbytes` 8-bit quantization requires Accelerate: `pip install accelerate`"
        ),
        "import_error",
    ),
    (
        "undefined symbol (flash-attn ABI)",
        ImportError(
            "/usr/local/lib/python3.11/site-packages/flash_attn_2_cuda.cpython-311-x86_64-linux"
            "-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi"
        ),
        "import_error",
    ),
    (
        "libGL missing (cv2)",
        ImportError("libGL.so.1: cannot open shared object file: No such file or directory"),
        "import_error",
    ),
    (
        "ctypes OSError for a missing library",
        OSError("libsndfile.so.1: cannot open shared object file: No such file or directory"),
        "import_error",
    ),
    # file_not_found
    (
        "FileNotFoundError",
        oserror(
            FileNotFoundError, 2, "No such file or directory", "/runpod-volume/model.safetensors"
        ),
        "file_not_found",
    ),
    ("ENOENT text", RuntimeError("open: /models/x: No such file or directory"), "file_not_found"),
    ("HF missing weights", OSError(HF_MISSING_FILE), "file_not_found"),
    ("HF EntryNotFoundError", EntryNotFoundError(HF_ENTRY_NOT_FOUND), "file_not_found"),
    # network
    (
        "ConnectionRefusedError",
        oserror(ConnectionRefusedError, 111, "Connection refused"),
        "network",
    ),
    ("httpx.ConnectError", httpx.ConnectError("[Errno 111] Connection refused"), "network"),
    ("httpx.ConnectTimeout", httpx.ConnectTimeout("timed out"), "network"),
    ("requests ConnectionError", RequestsConnectionError(REQUESTS_DNS), "network"),
    ("DNS text", RuntimeError("[Errno -2] Name or service not known"), "network"),
    ("socket.gaierror", socket.gaierror(-3, "Temporary failure in name resolution"), "network"),
    ("HF offline (OSError)", OSError(HF_OFFLINE), "network"),
    ("HF LocalEntryNotFoundError", LocalEntryNotFoundError(HF_LOCAL_ENTRY), "network"),
    ("pip", RuntimeError(PIP_NOT_FOUND), "network"),
    (
        "requests HTTPError 503",
        HTTPError("503 Server Error: Service Unavailable for url: https://example.com/v1/x"),
        "network",
    ),
    (
        "urllib HTTPError text",
        RuntimeError("urllib.error.HTTPError: HTTP Error 503: Service Unavailable"),
        "network",
    ),
    ("HTTPError: 503", RuntimeError("HTTPError: 503"), "network"),
    (
        "urllib3 ReadTimeoutError",
        ReadTimeoutError(
            "HTTPSConnectionPool(host='cdn-lfs.huggingface.co', port=443): Read timed out."
        ),
        "network",
    ),
    ("ETIMEDOUT connecting", oserror(TimeoutError, 110, "Connection timed out"), "network"),
    # disk_full
    ("ENOSPC", oserror(OSError, 28, "No space left on device"), "disk_full"),
    ("EDQUOT", oserror(OSError, 122, "Disk quota exceeded"), "disk_full"),
    (
        "torch shm full",
        RuntimeError(
            "unable to write to file </torch_1234_2862387210_0>: No space left on device (28)"
        ),
        "disk_full",
    ),
    # permission
    (
        "PermissionError",
        oserror(PermissionError, 13, "Permission denied", "/runpod-volume/hf-cache"),
        "permission",
    ),
    ("EACCES text", RuntimeError("[Errno 13] Permission denied: '/root/.cache'"), "permission"),
    ("EPERM", oserror(OSError, 1, "Operation not permitted"), "permission"),
    ("EROFS", oserror(OSError, 30, "Read-only file system", "/app/cache"), "permission"),
    ("HF gated", GatedRepoError(HF_GATED), "permission"),
    (
        "HF 401 as text",
        OSError(
            "401 Client Error: Unauthorized for url:"
            " https://huggingface.co/api/models/my-org/private-model"
        ),
        "permission",
    ),
    # unknown
    ("ValueError", ValueError("prompt must be a string"), "unknown"),
    ("KeyError", KeyError("input"), "unknown"),
    ("BrokenProcessPool-like", RuntimeError("worker exited"), "unknown"),
]


@pytest.mark.parametrize(("exc", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_real_messages(exc: BaseException, expected: Category) -> None:
    assert classify(exc) == expected


# Cases known only by their exception type: printed by a child process, the text alone is not
# evidence (there is deliberately no "No module named" pattern, and "timed out" alone does
# not say what timed out).
KNOWN_BY_TYPE_ONLY = {"ModuleNotFoundError", "ImportError by type", "httpx.ConnectTimeout"}


@pytest.mark.parametrize(("exc", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_real_messages_in_captured_output(
    exc: BaseException, expected: Category, request: pytest.FixtureRequest
) -> None:
    """The same failures printed by a child process and seen only in the captured output."""
    printed = f"Traceback (most recent call last):\n  ...\n{type(exc).__name__}: {exc}\n"
    got = classify(RuntimeError("child process failed"), output=printed)
    case_id = request.node.callspec.id
    assert got == ("unknown" if case_id in KNOWN_BY_TYPE_ONLY else expected)


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

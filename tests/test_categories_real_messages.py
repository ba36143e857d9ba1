"""The error-category rules classify the messages real libraries print, raised or seen
only in a child process's captured output (docs/design.md §7, docs/error-categories.md)."""

from __future__ import annotations

import socket

import httpx
import pytest

from trio_worker._categories import Category, classify

from .library_errors import (
    CUDA_ASYNC_NOTE,
    HF_ENTRY_NOT_FOUND,
    HF_GATED,
    HF_LOCAL_ENTRY,
    HF_MISSING_FILE,
    HF_OFFLINE,
    NCCL_ERROR,
    PIP_NOT_FOUND,
    REQUESTS_DNS,
    TORCH_OOM,
    TORCH_OOM_OLD,
    AcceleratorError,
    EntryNotFoundError,
    GatedRepoError,
    HTTPError,
    LocalEntryNotFoundError,
    ReadTimeoutError,
    RequestsConnectionError,
    TorchOutOfMemoryError,
    oserror,
)

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

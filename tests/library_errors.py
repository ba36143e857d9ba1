"""Stand-ins for the exceptions of the libraries a model loads (torch, huggingface_hub,
requests, urllib3): same names and bases as the real ones, with the messages they really
print, verbatim; for the error-category tests (tests/test_categories*.py)."""

from __future__ import annotations

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

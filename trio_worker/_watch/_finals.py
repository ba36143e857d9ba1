"""The terminal bodies in flight, kept in the memfd shared with the watchdog so that a job
never gets two different finals: its layout, and why nothing torn is ever read, are in
docs/design.md §13.2. An entry is ``state, flags, id_len, body_len``; its region, ``STRIDE``
bytes apart in a sparse file, holds the id's bytes, then the body's.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import struct
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["CAPACITY", "STATE_BYTES", "Finals", "read_finals"]

# The records' own words (``_records._STATE``) live in the first 64 bytes.
_DIRECTORY = 64
_ENTRY = struct.Struct("QQQQ")  # state, flags, id_len, body_len
_WORD = struct.Struct("Q")
_LENGTHS = struct.Struct("QQQ")
CAPACITY = 4096
STATE_BYTES = _DIRECTORY + CAPACITY * _ENTRY.size
_ARENA = -(-STATE_BYTES // mmap.PAGESIZE) * mmap.PAGESIZE
STRIDE = 1 << 32  # virtual room per entry; only written pages are real memory
MAX_BODY = 1 << 30

_FREE = 0
_KEPT = 1
_STREAM = 1  # flags: the body goes to the stream's done route


class Finals:
    """The worker's side: the bodies of the terminal reports in flight."""

    def __init__(self, fd: int, state: mmap.mmap) -> None:
        self._fd = fd
        self._state = state
        self._entries: dict[str, int] = {}  # job id -> directory index
        self._free: list[int] = []
        self._used = 0  # indices ever handed out; reused from _free first

    def keep(self, job_id: str, body: bytes, *, is_stream: bool) -> bool:
        """Make *body* readable by the watchdog before it is first posted.

        A second call for the same job replaces the body (the small refusal report that
        follows a 400 or 413). False when it could not be kept.
        """
        index = self._entries.get(job_id)
        if index is None:
            index = self._allocate()
            if index is None:
                return False
        else:
            self._clear(index)
        key = job_id.encode(errors="surrogatepass")
        if len(body) > MAX_BODY or len(key) > MAX_BODY:
            self._free.append(index)
            self._entries.pop(job_id, None)
            return False
        try:
            os.pwrite(self._fd, key + body, _ARENA + index * STRIDE)
        except OSError:  # out of memory for the page cache: the caller falls back
            self._free.append(index)
            self._entries.pop(job_id, None)
            return False
        offset = _DIRECTORY + index * _ENTRY.size
        flags = _STREAM if is_stream else 0
        _LENGTHS.pack_into(self._state, offset + _WORD.size, flags, len(key), len(body))
        _WORD.pack_into(self._state, offset, _KEPT)  # last: the entry now counts
        self._entries[job_id] = index
        return True

    def drop(self, job_id: str) -> None:
        """The job left the ledger: its body is no longer owed."""
        index = self._entries.pop(job_id, None)
        if index is None:
            return
        length = self._clear(index)
        self._free.append(index)
        if not self._entries:
            # Every region is free: give all their pages back at once.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, _ARENA)
        elif length > mmap.PAGESIZE:
            _punch_hole(self._fd, _ARENA + index * STRIDE, length)

    def __len__(self) -> int:
        return len(self._entries)

    def _allocate(self) -> int | None:
        if self._free:
            return self._free.pop()
        if self._used >= CAPACITY:
            return None
        self._used += 1
        return self._used - 1

    def _clear(self, index: int) -> int:
        """Mark the entry free (state word first); the bytes its region held."""
        offset = _DIRECTORY + index * _ENTRY.size
        _, _, key_len, body_len = _ENTRY.unpack_from(self._state, offset)
        _WORD.pack_into(self._state, offset, _FREE)
        return int(key_len + body_len)


def read_finals(fd: int, state: mmap.mmap) -> dict[str, tuple[bytes, bool]]:
    """The watchdog's side, after the death: ``{job_id: (body, is_stream)}`` kept."""
    finals: dict[str, tuple[bytes, bool]] = {}
    for index in range(CAPACITY):
        offset = _DIRECTORY + index * _ENTRY.size
        if offset + _ENTRY.size > len(state):
            break
        kept, flags, key_len, body_len = _ENTRY.unpack_from(state, offset)
        if kept != _KEPT or key_len > MAX_BODY or body_len > MAX_BODY:
            continue
        try:
            data = os.pread(fd, key_len + body_len, _ARENA + index * STRIDE)
        except OSError:
            continue
        if len(data) != key_len + body_len:
            continue
        job_id = data[:key_len].decode(errors="surrogatepass")
        finals[job_id] = (data[key_len:], bool(flags & _STREAM))
    return finals


def _punch_hole(fd: int, offset: int, length: int) -> None:
    """Free a region's pages now (a large body), keeping the file's size."""
    fallocate = _fallocate()
    if fallocate is not None:
        fallocate(fd, _PUNCH_HOLE | _KEEP_SIZE, offset, length)


_PUNCH_HOLE = 0x02  # FALLOC_FL_PUNCH_HOLE (linux/falloc.h)
_KEEP_SIZE = 0x01  # FALLOC_FL_KEEP_SIZE


@functools.cache
def _fallocate() -> Callable[[int, int, int, int], int] | None:
    """libc's ``fallocate`` (Python's os module has no hole punching), or None."""
    try:
        import ctypes

        function = ctypes.CDLL(None, use_errno=True).fallocate
        function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        function.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return cast("Callable[[int, int, int, int], int]", function)

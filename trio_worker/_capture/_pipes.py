"""fd plumbing shared by the capture (`_fd`) and the crash watchdog's tee (`_feed`), and the
flush of Python's and C's stdio buffers into fds 1 and 2."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import mmap
import os
import select
import sys
import termios

_MAX_PIPE_SIZE = 1 << 20
_MIN_PIPE_SIZE = 1 << 16


def grow_pipe(fd: int) -> None:
    """As large as allowed, up to 1 MiB, so a GIL-holding writer rarely meets a full pipe."""
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if set_size is None:  # not Linux
        return
    try:
        with open("/proc/sys/fs/pipe-max-size", encoding="ascii") as f:
            size = min(int(f.read()), _MAX_PIPE_SIZE)
    except (OSError, ValueError):
        size = _MAX_PIPE_SIZE
    while size >= _MIN_PIPE_SIZE:
        try:
            fcntl.fcntl(fd, set_size, size)
            return
        except OSError:
            # EPERM once the user's pipe-buffer quota (pipe-user-pages-soft) is used up.
            size //= 2


def dup2(src: int, dst: int) -> None:
    # Linux dup2 can fail with EBUSY while another thread is inside open() on dst.
    for _ in range(100):
        try:
            os.dup2(src, dst)
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
    os.dup2(src, dst)


def identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


def wait_writable(fd: int) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    poller.poll()


def close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def shared_page(name: str) -> tuple[int, mmap.mmap]:
    """A page of memory shared by a process, its forked child, and the program either
    one may exec (an anonymous mapping would not survive the exec): its fd, and the map."""
    fd = os.memfd_create(name, 0)  # not close-on-exec: the exec'd watchdog maps it again
    os.ftruncate(fd, mmap.PAGESIZE)
    return fd, mmap.mmap(fd, mmap.PAGESIZE)


def map_page(fd: int) -> mmap.mmap:
    """The page `shared_page` made, mapped again from its fd (after exec)."""
    return mmap.mmap(fd, mmap.PAGESIZE)


def pending_bytes(fd: int) -> int:
    """Bytes waiting in the pipe *fd* (0 when it cannot tell)."""
    buf = bytearray(4)
    with contextlib.suppress(OSError):
        fcntl.ioctl(fd, termios.FIONREAD, buf, True)
    return int.from_bytes(buf, sys.byteorder)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.fflush.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return libc


def flush_stdio() -> None:
    """Flush Python's and C's user-space buffers into fds 1 and 2."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()
    libc = _libc()
    if libc is not None:
        libc.fflush(None)  # NULL: every C stdio stream, CUDA's and extensions' included

"""fd plumbing shared by the capture (`_fd`) and the crash watchdog's tee (`_feed`): an fd
pointed at a pipe, writing a chunk in full, the flush of Python's and C's stdio buffers into
fds 1 and 2, and the pages of memory shared across fork and exec."""

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


def write_all(fd: int, data: bytes) -> bool:
    """Write all of *data* to *fd*, waiting for room; False once *fd* refuses writes (the
    reader of the real stdout is gone)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            # Someone made the shared file description non-blocking (it is shared with
            # whatever else holds the real stdout); wait for room instead of spinning.
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            poller.poll()
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            return False
    return True


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


class Redirect:
    """An fd pointed at the write end of a pipe whose read end the capture reads.

    (A plain class: the crash watchdog imports this module, see ``_feed.Feed``.)
    """

    __slots__ = ("fd", "forwarding", "pipe_id", "read_end", "saved")

    def __init__(
        self,
        fd: int,
        saved: int,
        read_end: int,
        pipe_id: tuple[int, int],
        *,
        forwarding: bool = True,
    ) -> None:
        self.fd = fd  # 1 or 2
        self.saved = saved  # what fd pointed at before install; the pass-through destination
        self.read_end = read_end
        self.pipe_id = pipe_id  # (st_dev, st_ino): recognises our pipe on fd at restore time
        self.forwarding = forwarding  # False once the destination refuses writes


def redirect_to_pipe(fd: int) -> Redirect:
    """Point *fd* at a new pipe's write end, saving what it pointed at (to pass through)."""
    saved = os.dup(fd)
    try:
        read_end, write_end = os.pipe()
    except BaseException:
        os.close(saved)
        raise
    try:
        grow_pipe(write_end)
        os.set_blocking(read_end, False)
        pipe_id = identity(write_end)
        dup2(write_end, fd)
    except BaseException:
        close_all([saved, read_end])
        raise
    finally:
        # fd now holds the only write end we need; children inherit it from there.
        os.close(write_end)
    return Redirect(fd=fd, saved=saved, read_end=read_end, pipe_id=pipe_id)

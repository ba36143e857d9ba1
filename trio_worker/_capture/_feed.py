"""The crash watchdog's side of output capture: it reads fds 1 and 2 first, passes them
through, and forwards a best-effort copy the worker's capture reads (`Feed`); a flush waits
for the three counts of the page they share (docs/design.md §13.3).

Between taking a chunk out of a pipe and counting it read, the chunk is in neither count:
a fourth word, odd while a read is under way and bumped again when it is counted, tells a
flush that looked meanwhile to look again.
"""

from __future__ import annotations

import contextlib
import os
import struct
from typing import TYPE_CHECKING, Any

from ._pipes import Redirect, close_all, grow_pipe, map_page, pending_bytes, shared_page, write_all

if TYPE_CHECKING:
    import mmap

__all__ = ["Feed", "Tee", "discard_tee", "open_tee"]

_READ_SIZE = 1 << 16
# The shared page's counts: each written alone, in this order of growth (forwarded before
# handled), so a reader that sees a chunk handled also sees its copy forwarded.
_READ, _HANDLED, _FORWARDED = 0, 8, 16
# Odd from before a read of fds 1/2's pipes until its bytes are in ``_READ``.
_READING = 24
_COUNT = struct.Struct("Q")


class Feed:
    """What the worker (the child) keeps: the copy pipes to read, the upstream pipes to
    check for unread bytes, and the watchdog's counts. (A plain class: the watchdog
    imports this module, and ``dataclasses`` would weigh on its start.)"""

    def __init__(self, copies: tuple[int, int], upstream: tuple[int, int], seq: mmap.mmap) -> None:
        self.copies = copies  # read ends: what the watchdog forwarded from fds 1 and 2
        self.upstream = upstream  # read ends of fds 1/2's pipes, only ever asked FIONREAD
        self.seq = seq

    def written_before_now(self) -> int | None:
        """The bytes written to fds 1/2 so far: what the watchdog has read, and what the
        pipes still hold, seen with no read between the two looks; None when the watchdog
        read meanwhile (look again: it reads in bursts, with pauses between)."""
        reading = self.count(_READING)
        if reading % 2:
            return None
        read = self.count(_READ)
        pending = sum(pending_bytes(fd) for fd in self.upstream)  # not read by the watchdog
        return read + pending if self.count(_READING) == reading else None

    def flush_target(self, written: int | None) -> tuple[int | None, int | None]:
        """One look for a flush of the capture that reads this feed: ``(target, written)``.

        *written* is what had been written to fds 1/2 when the flush began (None until
        seen); once the watchdog has handled that much, the target is what it had
        forwarded by then, the count the capture's ring reaches when it holds it all.
        """
        if written is None:
            written = self.written_before_now()
        if written is not None and self.count(_HANDLED) >= written:
            return self.count(_FORWARDED), written
        return None, written

    def redirects(self) -> list[Redirect]:
        """The copies as the capture reads them: non-blocking, with nothing to forward
        (the watchdog passes through) and nothing to restore."""
        redirects = [
            Redirect(fd=fd, saved=-1, read_end=copy, pipe_id=(0, 0), forwarding=False)
            for fd, copy in zip((1, 2), self.copies, strict=True)
        ]
        for r in redirects:
            os.set_blocking(r.read_end, False)
        return redirects

    def count(self, offset: int) -> int:
        return int(_COUNT.unpack_from(self.seq, offset)[0])


class Tee:
    """The watchdog's end: pumps fds 1/2's pipes to the real fds, the copies and the tail."""

    def __init__(
        self,
        reads: tuple[int, int],
        writes: tuple[int, int],
        copies: tuple[int, int],
        seq: tuple[int, mmap.mmap],
        tail_bytes: int,
        real: tuple[int, int] = (1, 2),
    ) -> None:
        self.reads = reads  # fds 1/2's pipes, read ends (non-blocking)
        self.copies = copies  # non-blocking write ends
        self._real = {reads[0]: real[0], reads[1]: real[1]}  # where each passes through
        self._copy = {reads[0]: copies[0], reads[1]: copies[1]}
        self._writes = writes  # write ends, closed once the child has its own
        self.seq_fd, self._seq = seq
        self._read = self._handled = self._forwarded = 0
        # Goes on from the page's value, so a look across a restart never sees it repeat.
        reading = int(_COUNT.unpack_from(self._seq, _READING)[0])
        self._reading = reading + reading % 2
        self._tail = bytearray()
        self._tail_bytes = tail_bytes
        self.closed: set[int] = set()  # read ends at EOF (every writer closed fd 1 or 2)

    def spec(self) -> dict[str, object]:
        """What the exec'd watchdog needs to rebuild this (`from_spec`): its fds."""
        return {"reads": list(self.reads), "copies": list(self.copies), "seq": self.seq_fd}

    @classmethod
    def from_spec(cls, spec: dict[str, Any], tail_bytes: int) -> Tee:
        reads, copies = spec["reads"], spec["copies"]
        seq = (spec["seq"], map_page(spec["seq"]))
        return cls((reads[0], reads[1]), (-1, -1), (copies[0], copies[1]), seq, tail_bytes)

    def worker_ends(self) -> tuple[int, int]:
        """The write ends the worker takes as its fds 1 and 2."""
        return self._writes

    def close_child_ends(self) -> None:
        """The child holds fds 1/2's write ends now; keeping ours would hide its EOF."""
        for fd in self._writes:
            with contextlib.suppress(OSError):
                os.close(fd)

    def pump(self, fd: int) -> bool:
        """Move one chunk; False at EOF or when nothing was there."""
        self._reading += 1
        _COUNT.pack_into(self._seq, _READING, self._reading)
        try:
            try:
                data = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                data = None
            if data:
                self._read += len(data)
                _COUNT.pack_into(self._seq, _READ, self._read)
        finally:
            self._reading += 1
            _COUNT.pack_into(self._seq, _READING, self._reading)
        if not data:
            if data is not None:
                self.closed.add(fd)
            return False
        # The copy first: a flush in the worker waits for it, not for the real fd (a
        # terminal, a container's log pipe), which may take longer to take the bytes.
        self._forwarded += self._copy_out(self._copy[fd], data)
        self._handled += len(data)
        _COUNT.pack_into(self._seq, _FORWARDED, self._forwarded)
        _COUNT.pack_into(self._seq, _HANDLED, self._handled)
        write_all(self._real[fd], data)  # the real stdout gone: the tail is still kept
        self._keep(data)
        return True

    def drain(self) -> None:
        """Whatever the pipes still hold, without waiting for EOF (a grandchild may hold
        a write end for ever)."""
        for fd in self.reads:
            while fd not in self.closed and self.pump(fd):
                pass

    def tail(self) -> str:
        return bytes(self._tail).decode(errors="replace")

    def drop_tail(self) -> None:
        """Keep no output from now on (the worker runs with ``capture_logs="off"``)."""
        self._tail_bytes = 0
        self._tail.clear()

    def _copy_out(self, fd: int, data: bytes) -> int:
        """Forward *data* to the worker, what fits without waiting; the bytes sent."""
        try:
            return os.write(fd, data)
        except OSError:  # the pipe is full, or the worker is gone: nobody reads the copy
            return 0

    def _keep(self, data: bytes) -> None:
        self._tail += data
        excess = len(self._tail) - self._tail_bytes
        if excess > 0:
            del self._tail[:excess]


def open_tee(tail_bytes: int, real: tuple[int, int] = (1, 2)) -> tuple[Tee, Feed]:
    """Make the pipes before fork: the parent keeps the `Tee`, the child the `Feed`."""
    reads: list[int] = []
    writes: list[int] = []
    copy_reads: list[int] = []
    copy_writes: list[int] = []
    for _ in (1, 2):
        r, w = os.pipe()
        grow_pipe(w)
        os.set_blocking(r, False)
        reads.append(r)
        writes.append(w)
        cr, cw = os.pipe()
        grow_pipe(cw)
        os.set_blocking(cw, False)
        copy_reads.append(cr)
        copy_writes.append(cw)
    seq = shared_page("trio_worker-tee")
    tee = Tee(
        (reads[0], reads[1]),
        (writes[0], writes[1]),
        (copy_writes[0], copy_writes[1]),
        seq,
        tail_bytes,
        real,
    )
    feed = Feed((copy_reads[0], copy_reads[1]), (reads[0], reads[1]), seq[1])
    return tee, feed


def adopt_feed(tee: Tee, feed: Feed) -> None:
    """In the child, right after fork: fds 1/2 become the watched pipes; the parent's
    ends are closed (the upstream read ends are kept, for FIONREAD only)."""
    for fd, write_end in zip((1, 2), tee._writes, strict=True):
        os.dup2(write_end, fd)
        os.close(write_end)
    for fd in tee._copy.values():
        os.close(fd)


def close_feed_ends(feed: Feed) -> None:
    """In the parent, right after fork: the child reads the copies."""
    for fd in feed.copies:
        os.close(fd)


def discard_tee(tee: Tee, feed: Feed) -> None:
    """Close both ends of every pipe and the shared page: no worker will use them."""
    close_all([*tee.reads, *tee._writes, *tee.copies, *feed.copies, tee.seq_fd])
    tee._seq.close()

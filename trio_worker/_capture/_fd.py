"""fd-level capture of stdout and stderr, and each job's part of it (docs/how-it-works.md,
"Output capture"; docs/design.md §8).

A writer blocked in write(2) on a full pipe while holding the GIL cannot be rescued by a
reader that needs the GIL (minrk/wurlitzer#20): hence the large pipes, and a reader loop
that does little with the GIL held. Stopping never closes an fd the reader may be blocked
on (the read would fail with EBADF, and the number could be reused under it), nor a read
end a child still writes to (it would die of SIGPIPE): the reader is woken through the
control pipe, as wurlitzer does, and drains to EOF.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import selectors
import threading
import time
import traceback
from contextvars import ContextVar
from typing import TYPE_CHECKING

from ._pipes import Redirect, flush_stdio, redirect_to_pipe, write_all
from ._pipes import close_all as _close_all
from ._pipes import dup2 as _dup2
from ._pipes import identity as _identity
from ._pipes import pending_bytes as _pending
from ._redact import EDGE_CONTEXT, char_start, redact_from

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._feed import Feed
    from ._redact import Redactor

__all__ = ["JobOutput", "OutputCapture", "job_output"]

READER_THREAD_NAME = "trio_worker-output-capture"

_READ_SIZE = 1 << 16
_FLUSH_TIMEOUT = 1.0
_RECHECK = 0.001  # seconds, at most, between two looks at what a flush waits for
_FIRST_PAUSE = 0.00002


class OutputCapture:
    """Captures fds 1 and 2 while passing everything through; see the module docstring."""

    def __init__(
        self,
        redirects: list[Redirect],
        redactor: Redactor,
        tail_bytes: int,
        feed: Feed | None = None,
    ) -> None:
        self._redirects = redirects
        self._feed = feed
        self._redactor = redactor
        self._tail_bytes = tail_bytes
        self._ring = bytearray()
        self._capacity = tail_bytes + EDGE_CONTEXT
        self._total = 0
        # Guards the ring and _open_reads.
        self._cond = threading.Condition(threading.Lock())
        self.flush_timeouts = 0  # flushes that gave up waiting (a stuck reader or watchdog)
        # Held by whoever moves a chunk (the reader thread, or a flush): one at a time, so
        # chunks reach the ring and the real fds in the order they were read.
        self._pump_lock = threading.Lock()
        self._open_reads = {r.read_end for r in redirects}
        self._reader_done = False
        self._fd_lock = threading.Lock()
        self._restored = False
        self._active = True
        self._drained = threading.Event()
        self._ctl_read, self._ctl_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name=READER_THREAD_NAME, daemon=True)

    @classmethod
    def install(
        cls, *, redactor: Redactor, tail_bytes: int = 1 << 20, feed: Feed | None = None
    ) -> OutputCapture:
        """Capture fds 1 and 2 (passed through, in order per fd) until `stop` or exit.

        Captures nest if stopped in LIFO order. Raises OSError if fd 1 or 2 is not open.
        With *feed* (a watched worker), fds 1/2 are the crash watchdog's: this reads its copies.
        """
        if tail_bytes <= 0:
            raise ValueError(f"tail_bytes must be positive, got {tail_bytes}")
        if feed is not None:
            return cls._install_fed(redactor, tail_bytes, feed)
        # Output buffered before the swap belongs to the old destination, ahead of ours.
        flush_stdio()
        redirects: list[Redirect] = []
        capture: OutputCapture | None = None
        try:
            for fd in (1, 2):
                redirects.append(redirect_to_pipe(fd))
            capture = cls(redirects, redactor, tail_bytes)
            capture._thread.start()
        except BaseException:
            # Without a reader the pipes would fill and block every writer: undo it all.
            for done in reversed(redirects):
                _dup2(done.saved, done.fd)
                _close_all([done.saved, done.read_end])
            if capture is not None:
                _close_all([capture._ctl_read, capture._ctl_write])
            raise
        # Interpreter exit flushes sys.stdout and C stdio after atexit; by then fds 1/2 must
        # be the real ones again, or that output lands in a pipe nobody forwards.
        atexit.register(capture.stop)
        return capture

    @classmethod
    def _install_fed(cls, redactor: Redactor, tail_bytes: int, feed: Feed) -> OutputCapture:
        capture = cls(feed.redirects(), redactor, tail_bytes, feed)
        capture._restored = True
        capture._thread.start()
        atexit.register(capture.stop)
        return capture

    @property
    def active(self) -> bool:
        """True from install until `stop` (or until the reader thread died)."""
        return self._active and not self._reader_done

    @property
    def redactor(self) -> Redactor:
        return self._redactor

    def mark(self) -> int:
        """The absolute number of bytes captured so far (both fds), after a `flush`."""
        self.flush()
        with self._cond:
            return self._total

    def mark_nowait(self) -> int:
        """Like :meth:`mark` without the flush, cheap enough for every job's start: output
        still buffered in stdio then counts as the job's (extra context, never a loss)."""
        with self._cond:
            return self._total

    def text_since(self, mark: int, limit: int = 16384, *, flush: bool = True) -> str:
        """Redacted, decoded output captured since *mark*: its last *limit* characters.

        If the ring no longer holds everything since *mark*, what it holds (at most
        ``tail_bytes``). Flushes first, unless the caller just did (*flush* False).
        """
        if limit <= 0:
            return ""
        if flush:
            self.flush()
        with self._cond:
            total = self._total
            base = total - len(self._ring)
            start = max(mark, total - self._tail_bytes, base)
            if start >= total:
                return ""
            context = max(start - EDGE_CONTEXT, base)
            window = bytes(self._ring[context - base :])
        cut = char_start(window, start - context)
        text = window.decode(errors="replace")
        # window[:cut] ends on a character boundary, so it decodes to a prefix of text.
        cut_chars = len(window[:cut].decode(errors="replace"))
        return redact_from(self._redactor, text, cut_chars)[-limit:]

    def tail(self, limit: int = 16384) -> str:
        """The last *limit* characters of all captured output, redacted."""
        return self.text_since(0, limit)

    def flush(self) -> None:
        """Flush Python and C stdio, then wait (at most 1 s) until the ring holds
        everything written to fds 1/2 so far: a count taken now (:meth:`_look`), never
        "until the pipes are quiet". What reaches the pipes is moved on this thread
        (:meth:`_pump_ready`), sparing a thread switch and a GIL switch per flush."""
        flush_stdio()
        deadline = time.monotonic() + _FLUSH_TIMEOUT
        target = written = None
        pause = _FIRST_PAUSE
        while True:
            target, written = self._look(target, written)
            if target is not None and self._holds(target):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.flush_timeouts += 1
                return
            if self._pump_ready():
                continue
            if target is None:
                # The crash watchdog's move: its copy wakes us (it counts the bytes
                # handled right after), a copy it dropped does not, so the wait is short,
                # and grows from a few microseconds.
                self._wait_readable(min(pause, remaining))
                pause = min(pause * 2, _RECHECK)
            else:
                self._wait_readable(min(remaining, _RECHECK))

    def _look(self, target: int | None, written: int | None) -> tuple[int | None, int | None]:
        """One step towards a flush's target: ``(target, written)``, *target* being what
        ``_total`` reaches once the ring holds everything written when the flush began;
        None while the crash watchdog has not passed that on (*written*: how much that
        was, once seen). Unwatched: the ring and the pipes, counted with no chunk in
        flight (the pump lock); watched: :meth:`Feed.flush_target`."""
        if target is not None:
            return target, written
        feed = self._feed
        if feed is None:
            with self._pump_lock, self._cond:
                return self._total + self._unread(), None
        return feed.flush_target(written)

    def _holds(self, target: int) -> bool:
        """Whether the ring has reached *target* (or never will: the reader ended)."""
        with self._cond:
            return self._reader_done or self._total >= target

    def stop(self) -> None:
        """Flush, restore fds 1/2 (if they are still ours), drain and stop the reader.

        Idempotent. Bounded: a child process still holding the pipe does not keep
        ``stop()`` waiting; its output keeps being forwarded until it closes the pipe.
        """
        with self._fd_lock:
            if not self._active:
                return
            self._active = False
        atexit.unregister(self.stop)
        self.flush()
        self._restore_fds()
        # Never close a read end here (the reader may be in select on it): wake it instead.
        with contextlib.suppress(OSError):
            os.write(self._ctl_write, b"\0")
        os.close(self._ctl_write)
        deadline = time.monotonic() + _FLUSH_TIMEOUT
        self._drained.wait(_FLUSH_TIMEOUT)
        with self._cond:
            all_closed = not self._open_reads
        if all_closed:
            self._thread.join(max(deadline - time.monotonic(), 0.0))

    # --- the reader thread ------------------------------------------------------------

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        stopping = False
        try:
            for r in self._redirects:
                selector.register(r.read_end, selectors.EVENT_READ, r)
            selector.register(self._ctl_read, selectors.EVENT_READ, None)
            live = len(self._redirects)
            while live:
                # Once stopping, one non-blocking round tells stop() the pipes are drained;
                # after that only children can still write, and we wait for their EOF.
                poll = stopping and not self._drained.is_set()
                events = selector.select(0 if poll else None)
                if not events:
                    self._drained.set()
                for key, _ in events:
                    redirect: Redirect | None = key.data
                    if redirect is None:
                        selector.unregister(self._ctl_read)
                        stopping = True
                    elif not self._pump(redirect):
                        selector.unregister(redirect.read_end)
                        live -= 1
        except BaseException:
            # Nobody would empty the pipes any more, and writers would block on them: give
            # the process its real fds back before saying what happened.
            self._restore_fds()
            report = f"trio_worker: output capture failed\n{traceback.format_exc()}".encode()
            with contextlib.suppress(OSError):
                # The saved fd, not fd 2: if fd 2 was not ours to restore, it may still be
                # our pipe, which nobody will read now.
                os.write(self._redirects[-1].saved, report)
        finally:
            selector.close()
            self._finish_reader()

    def _pump(self, redirect: Redirect) -> bool:
        """Move one chunk from the pipe to the destination and the ring; False at EOF."""
        with self._pump_lock:
            try:
                data: bytes | None = os.read(redirect.read_end, _READ_SIZE)
            except BlockingIOError:
                data = None  # a flush moved it first
            # The reader of the real stdout gone: capturing goes on without forwarding.
            if data and redirect.forwarding and not write_all(redirect.saved, data):
                redirect.forwarding = False
            with self._cond:
                if data:
                    self._append(data)
                elif data == b"":
                    self._open_reads.discard(redirect.read_end)
                self._cond.notify_all()
        return data != b""

    def _pump_ready(self) -> bool:
        """Move what the pipes hold now, on this thread; whether anything was there."""
        moved = False
        for redirect in self._redirects:
            if redirect.read_end in self._open_reads and _pending(redirect.read_end):
                self._pump(redirect)
                moved = True
        return moved

    def _wait_readable(self, timeout: float) -> None:
        reads = [r.read_end for r in self._redirects if r.read_end in self._open_reads]
        with contextlib.suppress(OSError, ValueError):  # a read end closed meanwhile
            select.select(reads, [], [], timeout)

    def _append(self, data: bytes) -> None:
        ring = self._ring
        ring += data
        self._total += len(data)
        excess = len(ring) - self._capacity
        if excess > 0:
            # Deleting from the front of a bytearray only moves its start pointer.
            del ring[:excess]

    def _unread(self) -> int:
        return sum(_pending(fd) for fd in self._open_reads)

    def _restore_fds(self) -> None:
        with self._fd_lock:
            if self._restored:
                return
            self._restored = True
            for r in self._redirects:
                # LIFO safety: if someone redirected fd after us (a nested capture, pytest),
                # it is theirs to restore; clobbering it would break their capture.
                with contextlib.suppress(OSError):
                    if _identity(r.fd) == r.pipe_id:
                        _dup2(r.saved, r.fd)

    def _finish_reader(self) -> None:
        with self._cond:
            self._open_reads.clear()
            self._reader_done = True
            self._cond.notify_all()
        self._drained.set()
        _close_all([r.read_end for r in self._redirects] + [self._ctl_read])
        _close_all([r.saved for r in self._redirects])


# --- each job's part: its own Python-level output --------------------------------------


DEFAULT_JOB_CHARS = 1 << 16

# Set by job_output(), read by the sys.stdout/sys.stderr wrapper (_attribution).
current_job: ContextVar[JobOutput | None] = ContextVar("trio_worker_job_output", default=None)


class JobOutput:
    """The Python-level output of one job, bounded to its last ``max_chars`` characters."""

    def __init__(self, job_id: str, *, max_chars: int = DEFAULT_JOB_CHARS) -> None:
        self.job_id = job_id
        self._max_chars = max_chars
        self._chunks: list[str] = []
        self._size = 0
        # Writes can come from several threads of one job (trio.to_thread).
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<JobOutput {self.job_id!r} {self._size} chars>"

    def append(self, text: str) -> None:
        with self._lock:
            self._chunks.append(text)
            self._size += len(text)
            keep = self._max_chars + EDGE_CONTEXT
            # Trimming only once the buffer doubles keeps appends amortised O(1) whatever
            # the sizes of the writes; the EDGE_CONTEXT kept beyond the window lets
            # redacted_text() see a secret that straddles the window's start.
            if self._size > 2 * keep:
                self._chunks = ["".join(self._chunks)[-keep:]]
                self._size = keep

    def text(self, limit: int = 16384) -> str:
        """The job's own Python-level output, its last *limit* characters, not redacted."""
        if limit <= 0:
            return ""
        return self._joined()[-min(limit, self._max_chars) :]

    def redacted_text(self, redactor: Redactor, limit: int = 16384) -> str:
        """Like `text`, redacted, with a secret cut by the window's start still hidden."""
        if limit <= 0:
            return ""
        joined = self._joined()
        start = max(len(joined) - min(limit, self._max_chars), 0)
        context = max(start - EDGE_CONTEXT, 0)
        return redact_from(redactor, joined[context:], start - context)[-limit:]

    def _joined(self) -> str:
        with self._lock:
            joined = "".join(self._chunks)
            self._chunks = [joined]
            return joined


@contextlib.contextmanager
def job_output(job_id: str) -> Iterator[JobOutput]:
    """Attribute Python-level writes made in this context (and its copies) to a new JobOutput,
    once `install_python_stream_attribution` has run."""
    job = JobOutput(job_id)
    token = current_job.set(job)
    try:
        yield job
    finally:
        current_job.reset(token)

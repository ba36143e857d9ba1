"""The take and settle records (``T <id>``, ``S <id>``, ids in hex; ``R``: the initializer
finished; ``X``: records were lost) through which the watchdog knows the held jobs, and
the shared page that says whether the pipe told it everything (docs/design.md §13.2).
A lost record fails safe: it can cost a crash report, never send a second one.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import struct
from collections import deque

from ._finals import STATE_BYTES, Finals

_STATE = struct.Struct("QQ")  # unsent records (0/1), overflows so far

__all__ = ["Ledger", "RecordWriter", "Records", "install", "installed"]

TAKE = "T"
SETTLE = "S"
READY = "R"
LOST = "X"
MAX_BUFFERED = 64 * 1024


class RecordWriter:
    """The worker's end of the record pipe (non-blocking, bounded)."""

    def __init__(
        self, fd: int, max_buffered: int = MAX_BUFFERED, state: mmap.mmap | None = None
    ) -> None:
        self._fd = fd
        self._pending: deque[bytes] = deque()
        self._buffered = 0
        self._max = max_buffered
        self._lost = False
        self._overflows = 0
        self._state = state if state is not None else new_state()

    def write(self, kind: str, job_id: str) -> None:
        # Hex: any id fits on one line, and the watchdog decodes it without importing json.
        line = f"{kind} {job_id.encode(errors='surrogatepass').hex()}\n".encode()
        if len(line) > select.PIPE_BUF:
            # Only a line within PIPE_BUF is written whole or not at all, so the watchdog
            # never sees half a record. Such an id is never recorded, take nor settle: the
            # job goes unwatched, which is safe (no report rather than a second one).
            return
        if self._lost:
            self._pending.append(f"{LOST} \n".encode())
            self._buffered += 3  # the pipe takes each record whole or not at all
            self._lost = False
        self._pending.append(line)
        self._buffered += len(line)
        self._send()
        if self._buffered > self._max:
            self._pending.clear()
            self._buffered = 0
            self._lost = True
            self._overflows += 1
        _STATE.pack_into(self._state, 0, int(bool(self._pending)), self._overflows)

    def _send(self) -> None:
        while self._pending:
            head = self._pending[0]
            try:
                sent = os.write(self._fd, head)
            except BlockingIOError:
                return
            except OSError:  # the watchdog is gone: nobody to tell
                self._pending.clear()
                self._buffered = 0
                return
            self._buffered -= sent
            self._pending.popleft()


def new_state() -> mmap.mmap:
    """State for a writer nobody watches (tests); the watched worker's is shared."""
    return mmap.mmap(-1, STATE_BYTES)


def open_state() -> tuple[int, mmap.mmap]:
    """The memory the worker shares with the watchdog, made before the fork or launch:
    its fd (not close-on-exec, so the exec'd watchdog maps it again) and its map."""
    fd = os.memfd_create("trio_worker-records", 0)
    os.ftruncate(fd, STATE_BYTES)
    return fd, mmap.mmap(fd, STATE_BYTES)


def map_state(fd: int) -> mmap.mmap:
    """The state `open_state` made, mapped again from its fd (in the exec'd watchdog)."""
    return mmap.mmap(fd, STATE_BYTES)


class Ledger:
    """The watchdog's view: the ids held, in order of admission."""

    def __init__(self) -> None:
        self.held: dict[str, None] = {}
        self.ready = False  # the initializer finished
        self.lost = 0
        self._partial = b""

    def feed(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            if raw:
                self._apply(raw)

    def trust(self, state: mmap.mmap) -> bool:
        """After the worker died: False (and nothing held any more) when the pipe did not
        carry every record: some were still buffered, or dropped with no ``X`` seen."""
        unsent, overflows = _STATE.unpack_from(state)
        if unsent or overflows > self.lost:
            self.held.clear()
            return False
        return True

    def _apply(self, raw: bytes) -> None:
        kind, _, rest = raw.decode(errors="replace").partition(" ")
        if kind == READY:
            self.ready = True
            return
        if kind == LOST:
            self.lost += 1
            self.held.clear()
            return
        try:
            job_id = bytes.fromhex(rest).decode(errors="surrogatepass")
        except ValueError:
            return
        if kind == TAKE:
            self.held[job_id] = None
        elif kind == SETTLE:
            self.held.pop(job_id, None)


class Records:
    """The watched worker's side: what the state and the delivery tell the watchdog,
    through the hooks the supervisor installs (``_state.CrashRecords``, ``Delivery.finals``)."""

    def __init__(self, fd: int, state_fd: int, state: mmap.mmap) -> None:
        os.set_blocking(fd, False)
        self.writer = RecordWriter(fd, state=state)
        self.finals = Finals(state_fd, state)

    def take(self, job_id: str) -> None:
        """A job entered the ledger."""
        self.writer.write(TAKE, job_id)

    def ready(self) -> None:
        """The initializer finished."""
        self.writer.write(READY, "")

    def final(self, job_id: str, body: bytes, *, is_stream: bool) -> None:
        """A terminal report is about to be posted. From here on the watchdog never sends a
        different final for the job: it resends *body* itself, or, where the body could not
        be kept, nothing (a settle record)."""
        if not self.finals.keep(job_id, body, is_stream=is_stream):
            self.writer.write(SETTLE, job_id)

    def settle(self, job_id: str) -> None:
        """A job left the ledger, or the platform expects no report for it any more (a stop
        or a release was requested)."""
        self.writer.write(SETTLE, job_id)
        self.finals.drop(job_id)  # after the record: never neither kept nor settled


_installed: Records | None = None


def install(fd: int, state_fd: int, state: mmap.mmap) -> None:
    """In the watched worker: *fd* the record pipe's write end, *state_fd* and *state*
    the shared memory (`open_state`), kept open for the terminal bodies."""
    global _installed
    _installed = Records(fd, state_fd, state)


def installed() -> Records | None:
    """This process's records, when it is a watched worker (the supervisor's hooks)."""
    return _installed


def uninstall() -> None:
    global _installed
    if _installed is not None:
        with contextlib.suppress(OSError):
            os.close(_installed.writer._fd)
    _installed = None

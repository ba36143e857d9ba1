"""The watchdog's report for each job a dead worker held: the cause, its category
(docs/error-categories.md, "When the worker process dies"), the bodies (``Payloads.error``)
and their delivery with the worker's own ``Delivery`` (docs/design.md §13.4).
"""

from __future__ import annotations

import logging
import os
import signal
from typing import TYPE_CHECKING

import trio

from .._categories import classify_crash
from .._payloads import JobError, notice

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from typing import NoReturn

    from .._config import Settings
    from .._scopes import Scopes

log = logging.getLogger("trio_worker")

_FAULT_WORDS = {
    signal.SIGSEGV: "a segmentation fault",
    signal.SIGBUS: "a bus error",
    signal.SIGABRT: "an abort",
    signal.SIGILL: "an illegal instruction",
    signal.SIGFPE: "an arithmetic fault",
    signal.SIGKILL: "killed outright: the kernel's OOM killer, or a kill -9",
}
_KMSG_RECORDS = 20_000  # bound on the kernel log read at a crash
# Reports in flight at once: a platform that over-delivered before the death must not
# cost one connection (and one body in memory) per job.
REPORTS_AT_ONCE = 16
# What cuts the reports (and, twice, ends them), as the worker's own drain would.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def describe_exit(code: int) -> str:
    """``killed by SIGSEGV (signal 11: a segmentation fault)`` or ``exited with status 3``:
    *code* as ``os.waitstatus_to_exitcode`` gives it (negative: a signal)."""
    if code >= 0:
        return f"exited with status {code}"
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"killed by signal {-code}"
    words = _FAULT_WORDS.get(sig)
    return f"killed by {sig.name} (signal {-code}{': ' + words if words else ''})"


def crash_error(
    job_id: str, code: int, output: str, *, oom_killed: bool, during_init: bool
) -> JobError:
    """What the report of *job_id* says: the process ended as *code* says (as
    ``os.waitstatus_to_exitcode`` gives it), *output* its last output."""
    where = "while its initializer was running" if during_init else "while holding this job"
    return notice(
        "WorkerCrashed",
        category=classify_crash(code, output, oom_killed=oom_killed),
        logs=output,
        job_id=job_id,
        how=describe_exit(code),
        where=where,
    )


async def report_held(
    settings: Settings,
    finals: dict[str, tuple[bytes, bool]],
    crashed: list[str],
    crashed_error: Callable[[str], JobError],
    *,
    leave_now: Callable[[], NoReturn],
    early_signals: list[int] | None = None,
) -> dict[str, bool]:
    """Post every report, pinging with the ids still to report; ``{job_id: delivered}``.

    *finals* ``{job_id: (body, is_stream)}`` go again as they were; each job in *crashed*
    gets ``crashed_error(job_id)``, built when its turn comes. The worker's delivery rules,
    cut by ``shutdown_grace`` from now; a stop signal cuts the reports, a second calls
    *leave_now* (docs/design.md §13.4). *early_signals*: those that came between the death
    and this run's receiver; they count first.
    """
    from .._delivery import Delivery
    from .._payloads import Payloads
    from .._platform._client import PlatformClient
    from .._platform._heartbeat import heartbeat_task
    from .._scopes import Scopes

    client = PlatformClient(settings.platform, settings.timings)
    plan = Scopes(settings.timings)
    plan.state.drain("the worker died; reporting the jobs it held", now=trio.current_time())
    # The crashed bodies ask no stopPod: the worker that would be replaced is gone.
    payloads = Payloads.for_worker(settings)
    delivery = Delivery(settings, client, plan, payloads)
    remaining = dict.fromkeys([*finals, *crashed])
    outcome: dict[str, bool] = {}
    limiter = trio.CapacityLimiter(REPORTS_AT_ONCE)

    async def one(job_id: str) -> None:
        async with limiter:
            if job_id in finals:
                body, is_stream = finals[job_id]
            else:
                body, is_stream = payloads.error(crashed_error(job_id)), False
            outcome[job_id] = await delivery.deliver(job_id, body, is_stream=is_stream)
        remaining.pop(job_id, None)

    try:
        with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
            # From here on the receiver has them: what came before is in early_signals.
            cut = _Cut(plan, leave_now)
            for signum in early_signals or ():
                cut(signum)
            async with trio.open_nursery() as nursery:
                ping = settings.platform.ping_url
                if ping:
                    nursery.start_soon(
                        heartbeat_task,
                        client.polls,
                        ping,
                        settings.platform.ping_interval,
                        lambda: tuple(remaining),
                    )
                nursery.start_soon(_cut_on_signal, signals, cut)
                async with trio.open_nursery() as reports:
                    for job_id in list(remaining):
                        reports.start_soon(one, job_id)
                nursery.cancel_scope.cancel()
    finally:
        # The client closes every connection even when cancelled, as the worker relies on.
        await client.aclose()
    return outcome


class _Cut:
    """The first stop signal cuts the reports to their deadlines; a second ends them."""

    def __init__(self, plan: Scopes, leave_now: Callable[[], NoReturn]) -> None:
        self.plan = plan
        self.leave_now = leave_now
        self.seen = 0

    def __call__(self, signum: int) -> None:
        self.seen += 1
        log.warning("crash watchdog: %s while reporting", signal.Signals(signum).name)
        if self.seen > 1:
            self.leave_now()
        self.plan.state.cut_now(signal.Signals(signum).name, now=trio.current_time())


async def _cut_on_signal(signals: AsyncIterator[int], cut: _Cut) -> None:
    async for signum in signals:
        cut(signum)


def kernel_says_oom_killed(pid: int) -> bool:
    """Whether the kernel log (``/dev/kmsg``, often unreadable in a container) records
    the OOM killer taking *pid*."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    needles = (f"killed process {pid} ", f",pid={pid},")
    try:
        for _ in range(_KMSG_RECORDS):
            try:
                record = os.read(fd, 8192).decode(errors="replace").lower()
            except BlockingIOError:
                return False
            except OSError:  # EPIPE: a record was overwritten while reading; go on
                continue
            if not record:
                return False
            if "oom" in record or "killed process" in record:
                if any(needle in record for needle in needles):
                    return True
        return False
    finally:
        os.close(fd)

"""Soak result delivery: many jobs through a real worker while every route keeps failing.

Not a test: a measurement to run by hand (docs/reliability.md, "Soak"). In one trio run
this script serves the fake platform of ``trio_worker.testing`` on 127.0.0.1, puts a TCP
proxy in front of it, and starts a real worker process (``trio_worker.start`` with a tiny
async handler, ``--concurrency`` 16) wired to the proxy. It enqueues ``--jobs`` jobs at
``--rate`` per second (1 in 10 streams two chunks, 1 in 20 posts a progress update) while
windows of faults open and close at random on every route (take, stop, done, stream,
ping):

* ``5xx``: 500/502/503/504 before the route runs;
* ``429``: with ``Retry-After`` of 1 s up to 12 s;
* ``drop``: the connection is closed unanswered;
* ``hang``: no answer until the client gives up or the window ends, then a drop;
* ``slow``: a delay before the route, then an answer dripped in four pieces;
* ``refuse`` (the proxy, all routes): connections are refused, open ones are closed
  between requests, as when the platform stops listening;
* hostile answers (docs/security.md): ``deep`` (take: one job's input nested 5,000 deep),
  ``oversize`` (take: the answer made 65 MiB, a few times a run), ``flood`` (stop: 100,000
  unknown ids), and half of the 429s ask for ``Retry-After`` ``0``, ``-5`` or ``nan``.
  A job handed out in a hostile take answer is owed one MalformedJob error: reported
  FAILED once, it counts as delivered once (``poisoned``), any other end as lost.

Windows last up to ``--max-outage`` seconds (most are short). Every fault but ``slow``
acts *before* the route, so the platform never records a report whose answer the worker
did not get; when a report's answer may have been lost (``slow``, a send that failed), the
job is noted, and a second report for it is counted as explained (at-least-once delivery
repeats it by design).

Once every job is taken the faults stop; the run waits up to ``--settle`` seconds for the
last reports, stops the worker (SIGTERM) and prints: jobs enqueued, taken, delivered once,
delivered twice (and how many explained), lost (taken but never reported, or FAILED),
stuck in queue or in progress, worker restarts, and the worker's resident memory
(``VmRSS``) at start, middle and end. ``--json PATH`` writes the same report as JSON.

Usage::

    python scripts/soak_delivery.py                  # 100,000 jobs, outages up to 60 s
    python scripts/soak_delivery.py --quick          # 2,000 jobs, outages up to 5 s: ~1 min
    python scripts/soak_delivery.py --jobs 5000 --seed 7 --json /tmp/soak.json

Exit status: 0 when nothing was lost or delivered twice unexplained, 1 otherwise, 2 when
the run could not be made (the worker kept dying, a port could not be bound).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from _soak_faults import (  # noqa: E402
    HOST,
    HOSTILE,
    ROUTE_FAULTS,
    ROUTES,
    FaultState,
    FaultyPlatform,
    Proxy,
    Window,
)

from trio_worker.testing import FakePlatform  # noqa: E402
from trio_worker.testing._http_server import serve_asgi  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

MAX_RESTARTS = 5
STOP_WAIT = 30.0


# -- the worker process -------------------------------------------------------------------


def rss_mib(pid: int) -> float | None:
    """VmRSS of *pid* in MiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


class Worker:
    """The worker process; started again (and counted) if it dies during the run."""

    def __init__(self, env: dict[str, str], concurrency: int, log_path: Path) -> None:
        self.env = env
        self.concurrency = concurrency
        self.log_path = log_path
        self.process: trio.Process | None = None
        self.restarts = 0
        self.exits: list[int] = []
        self.stopping = False

    async def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = await trio.lowlevel.open_process(
                [sys.executable, __file__, "--worker", "--concurrency", str(self.concurrency)],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def keep_alive(self) -> None:
        while True:
            assert self.process is not None
            code = await self.process.wait()
            if self.stopping:
                return
            self.exits.append(code)
            print(f"worker exited with status {code}; see {self.log_path}", file=sys.stderr)
            if self.restarts >= MAX_RESTARTS:
                raise RuntimeError(f"the worker died {self.restarts + 1} times")
            self.restarts += 1
            await self.start()

    def kill(self) -> None:
        """SIGKILL the worker's process group if it is still there (the soak is ending)."""
        self.stopping = True
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def rss(self) -> float | None:
        return None if self.process is None else rss_mib(self.process.pid)

    async def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after STOP_WAIT; the exit status of the SIGTERM."""
        self.stopping = True
        process = self.process
        if process is None or process.returncode is not None:
            return None if process is None else process.returncode
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(STOP_WAIT):
            return await process.wait()
        os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        return None


async def handler(job: dict[str, Any]) -> Any:
    """The soak's handler: an answer, a progress update now and then, a short stream."""
    import trio_worker

    spec = job["input"]
    if spec.get("progress"):
        trio_worker.progress_update(job, {"n": spec["n"]})
    if spec.get("sleep"):
        await trio.sleep(spec["sleep"])
    if spec.get("stream"):
        return _chunks(spec["n"])
    return {"n": spec["n"]}


async def _chunks(n: int) -> AsyncIterator[dict[str, int]]:
    for i in range(2):
        await trio.lowlevel.checkpoint()
        yield {"n": n, "chunk": i}


def run_worker(concurrency: int) -> None:
    import trio_worker

    threading.Thread(target=_end_with_parent, args=(os.getppid(),), daemon=True).start()
    trio_worker.start(handler, concurrency=concurrency, async_backend="trio")


def _end_with_parent(parent: int) -> None:
    """An orphaned worker (the soak was killed) shuts down, and is killed if it hangs."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(STOP_WAIT)
    os._exit(3)


# -- the run ------------------------------------------------------------------------------


@dataclass
class Report:
    enqueued: int = 0
    taken: int = 0
    delivered_once: int = 0
    delivered_twice: int = 0
    twice_explained: int = 0
    lost: int = 0
    lost_failed: int = 0
    stuck_in_queue: int = 0
    stuck_in_progress: int = 0
    taken_again: int = 0
    worker_restarts: int = 0
    results_lost_logged: int = 0
    poisoned: int = 0  # jobs handed out in a hostile take answer
    poisoned_failed: int = 0  # of those, reported FAILED (a MalformedJob error), as owed
    worker_exit: int | None = None
    rss_mib: dict[str, float | None] = field(default_factory=dict)
    faults_opened: dict[str, int] = field(default_factory=dict)
    faults_applied: dict[str, int] = field(default_factory=dict)
    requests_by_route: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    seed: int = 0
    complete: bool = True

    @property
    def failed(self) -> bool:
        return self.lost > 0 or self.delivered_twice > self.twice_explained


def tally(platform: FakePlatform, faults: FaultState, report: Report) -> None:
    for job in platform.jobs.values():
        report.enqueued += 1
        if job.takes == 0:
            report.stuck_in_queue += 1
            continue
        report.taken += 1
        report.taken_again += job.takes > 1
        if not job.done_reports:
            report.stuck_in_progress += 1
        elif job.status != "COMPLETED" and job.id not in faults.poisoned:
            report.lost_failed += 1
        elif len(job.done_reports) == 1:
            report.delivered_once += 1
        else:
            report.delivered_twice += 1
            report.twice_explained += job.id in faults.ambiguous
    report.lost = report.stuck_in_progress + report.lost_failed
    report.poisoned = len(faults.poisoned)
    jobs = platform.jobs
    report.poisoned_failed = sum(
        1 for job_id in faults.poisoned if job_id in jobs and jobs[job_id].status == "FAILED"
    )
    report.faults_opened = dict(faults.opened)
    report.faults_applied = dict(faults.applied)
    report.requests_by_route = platform.statistics().requests_by_route


async def enqueue(platform: FakePlatform, args: argparse.Namespace, rng: random.Random) -> None:
    start = trio.current_time()
    for n in range(args.jobs):
        spec: dict[str, Any] = {"n": n}
        if rng.random() < 0.1:
            spec["stream"] = True
        if rng.random() < 0.05:
            spec["progress"] = True
        if rng.random() < 0.2:
            spec["sleep"] = round(rng.uniform(0.001, 0.05), 3)
        platform.enqueue(spec)
        await trio.sleep_until(start + (n + 1) / args.rate)


async def inject_faults(
    faults: FaultState, proxy: Proxy, args: argparse.Namespace, rng: random.Random
) -> None:
    gap = (0.3, 2.0) if args.max_outage <= 5 else (5.0, 30.0)
    async with trio.open_nursery() as nursery:
        try:
            while True:
                await trio.sleep(rng.uniform(*gap))
                # Mostly short windows, now and then one up to the bound.
                seconds = args.max_outage * rng.random() ** 3
                kind = rng.choice((*ROUTE_FAULTS, "refuse"))
                faults.opened[kind] = faults.opened.get(kind, 0) + 1
                if kind == "refuse":
                    if not faults.refusing:
                        nursery.start_soon(_refuse_for, proxy, seconds)
                    continue
                routes = rng.sample(ROUTES, rng.randint(1, len(ROUTES)))
                if kind in HOSTILE:
                    # Its one route, open across a few polls (they hold 2 s).
                    routes, seconds = [HOSTILE[kind]], max(seconds, 8.0)
                until = trio.current_time() + seconds
                for route in routes:
                    faults.windows[route] = Window(kind, until)
        finally:
            faults.windows.clear()
            proxy.set_refusing(False)
            nursery.cancel_scope.cancel()


async def _refuse_for(proxy: Proxy, seconds: float) -> None:
    proxy.set_refusing(True)
    try:
        await trio.sleep(seconds)
    finally:
        proxy.set_refusing(False)


def takes(platform: FakePlatform) -> int:
    by_route = platform.statistics().requests_by_route
    return by_route.get("take", 0) + by_route.get("take_batch", 0)


def all_taken(platform: FakePlatform, total: int) -> bool:
    stats = platform.statistics()
    return stats.in_queue == 0 and len(platform.jobs) == total


def all_reported(platform: FakePlatform) -> bool:
    stats = platform.statistics()
    return stats.in_queue == 0 and stats.in_progress == 0


async def poll_until(done: Callable[[], bool], every: float = 0.2) -> None:
    # Polled: the conditions read counters of the fake platform that nothing signals.
    while True:
        if done():
            return
        await trio.sleep(every)


async def progress(
    platform: FakePlatform,
    worker: Worker,
    faults: FaultState,
    every: float,
    report: Report,
    total: int,
) -> None:
    started = time.monotonic()
    next_line = started + every
    while True:
        await trio.sleep(0.2)  # often enough to catch the middle of a short run
        stats = platform.statistics()
        finished = stats.completed + stats.failed
        rss = worker.rss()
        if "middle" not in report.rss_mib and finished >= total / 2:
            report.rss_mib["middle"] = rss
        if time.monotonic() < next_line:
            continue
        next_line += every
        active = sorted(f"{r}:{w.kind}" for r in ROUTES if (w := faults.active(r)))
        print(
            f"{time.monotonic() - started:7.1f}s  enqueued {len(platform.jobs):>7}  "
            f"finished {finished:>7}  in progress {stats.in_progress:>3}  "
            f"rss {rss or 0:6.1f} MiB  faults {' '.join(active) or '-'}"
            + ("  REFUSING" if faults.refusing else ""),
            flush=True,
        )


async def soak(args: argparse.Namespace, log_path: Path) -> Report:
    rng = random.Random(args.seed)
    report = Report(seed=args.seed)
    platform = FakePlatform(take_hold=2.0, stop_hold=2.0, record_requests=False)
    faults = FaultState()
    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        upstream = await nursery.start(serve_asgi, FaultyPlatform(platform, faults, rng), HOST, 0)
        proxy = Proxy(upstream, faults)
        port = await nursery.start(proxy.run)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD_")}
        env.update(platform.worker_env(f"http://{HOST}:{port}", worker_id="soak"))
        env["PYTHONPATH"] = str(REPO)
        worker = Worker(env, args.concurrency, log_path)
        await worker.start()
        nursery.start_soon(worker.keep_alive)
        nursery.start_soon(_cancel_on_signal, nursery.cancel_scope)
        finished = False
        try:
            await _run(platform, faults, proxy, worker, args, report, rng)
            finished = True
        finally:
            worker.kill()  # whatever happened, no worker outlives the soak
        nursery.cancel_scope.cancel()
    if not finished:
        raise RuntimeError("interrupted")
    report.seconds = round(time.monotonic() - started, 1)
    tally(platform, faults, report)
    return report


async def _cancel_on_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            print(f"soak: signal {signum}: stopping", file=sys.stderr)
            scope.cancel()
            return


async def _run(
    platform: FakePlatform,
    faults: FaultState,
    proxy: Proxy,
    worker: Worker,
    args: argparse.Namespace,
    report: Report,
    rng: random.Random,
) -> None:
    """From the worker's first take to its exit: load and faults, settle, stop."""
    with trio.move_on_after(STOP_WAIT) as waited:
        await poll_until(lambda: platform.statistics().jobs_handed_out > 0 or takes(platform) > 0)
    if waited.cancelled_caught:
        raise RuntimeError(f"the worker never asked for a job; see {worker.log_path}")
    report.rss_mib["start"] = worker.rss()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(progress, platform, worker, faults, args.report_every, report, args.jobs)
        with trio.CancelScope(deadline=trio.current_time() + args.minutes * 60) as capped:
            async with trio.open_nursery() as load:
                load.start_soon(inject_faults, faults, proxy, args, rng)
                await enqueue(platform, args, rng)
                await poll_until(lambda: all_taken(platform, args.jobs))
                load.cancel_scope.cancel()
        report.complete = not capped.cancelled_caught
        with trio.move_on_after(args.settle):
            await poll_until(lambda: all_reported(platform))
        report.rss_mib["end"] = worker.rss()
        report.rss_mib.setdefault("middle", None)
        nursery.cancel_scope.cancel()
    report.worker_exit = await worker.stop()
    report.worker_restarts = worker.restarts


def print_report(report: Report, log_path: Path) -> None:
    rss = report.rss_mib
    lines = [
        f"seed {report.seed}, {report.seconds}s" + ("" if report.complete else " (capped)"),
        f"enqueued           {report.enqueued}",
        f"taken              {report.taken}",
        f"delivered once     {report.delivered_once}",
        f"delivered twice    {report.delivered_twice} "
        f"({report.twice_explained} after an answer that may have been lost)",
        f"lost               {report.lost} ({report.stuck_in_progress} never reported, "
        f"{report.lost_failed} FAILED)",
        f"poisoned           {report.poisoned} in hostile take answers, "
        f"{report.poisoned_failed} failed by name as owed",
        f"stuck IN_QUEUE     {report.stuck_in_queue}",
        f"stuck IN_PROGRESS  {report.stuck_in_progress}",
        f"RESULT LOST logs   {report.results_lost_logged}",
        f"worker restarts    {report.worker_restarts}, exit status {report.worker_exit}",
        "worker RSS         "
        + ", ".join(f"{k} {v:.1f} MiB" if v is not None else f"{k} -" for k, v in rss.items()),
        f"faults opened      {report.faults_opened}",
        f"faults applied     {report.faults_applied}",
        f"requests by route  {report.requests_by_route}",
        f"worker log         {log_path}",
        "VERDICT: " + ("FAIL" if report.failed else "OK"),
    ]
    print("\n".join(lines), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--quick", action="store_true", help="2,000 jobs at 50/s, outages up to 5 s, 15 s to settle"
    )
    parser.add_argument("--jobs", type=int, default=None, help="default 100,000 (quick 2,000)")
    parser.add_argument("--rate", type=float, default=None, help="jobs enqueued per second")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--seed", type=int, default=None, help="random unless given; fixes choices, not timing"
    )
    parser.add_argument("--max-outage", type=float, default=None, help="seconds (default 60)")
    parser.add_argument("--minutes", type=float, default=60.0, help="cap on the faulty phase")
    parser.add_argument(
        "--settle",
        type=float,
        default=None,
        help="seconds to wait for the last reports once faults stop",
    )
    parser.add_argument("--report-every", type=float, default=10.0)
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    for name, full, fast in (
        ("jobs", 100_000, 2_000),
        ("rate", 200.0, 50.0),
        ("max_outage", 60.0, 5.0),
        ("settle", 120.0, 15.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, fast if quick else full)
    if args.seed is None:
        args.seed = random.randrange(2**32)
    if args.jobs < 1 or args.rate <= 0 or args.concurrency < 1 or args.max_outage < 0:
        parser.error("--jobs, --rate and --concurrency must be positive, --max-outage >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        run_worker(args.concurrency)
        return 0
    log_path = Path(tempfile.mkdtemp(prefix="soak-delivery-")) / "worker.log"
    print(
        f"soak: {args.jobs} jobs at {args.rate}/s, concurrency {args.concurrency}, "
        f"outages up to {args.max_outage}s, seed {args.seed}",
        flush=True,
    )
    try:
        report = trio.run(soak, args, log_path)
    except (OSError, RuntimeError, ExceptionGroup) as exc:
        traceback.print_exc()
        print(f"soak: could not run: {exc!r}", file=sys.stderr)
        return 2
    report.results_lost_logged = log_path.read_text(errors="replace").count("RESULT LOST")
    print_report(report, log_path)
    if args.json is not None:
        args.json.write_text(json.dumps({**asdict(report), "failed": report.failed}, indent=2))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())

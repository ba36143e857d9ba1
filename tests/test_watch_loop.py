"""One stop signal is counted once however it reaches the worker, and the watchdog reads
the kernel's OOM count while the worker lives (docs/design.md §13.1, §13.4)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_worker._exit import TWIN_WINDOW, SignalCount

TERM, INT = int(signal.SIGTERM), int(signal.SIGINT)


def test_a_direct_signal_and_its_forwarded_twin_count_once_either_order() -> None:
    count = SignalCount()
    assert count.arrive(TERM, forwarded=False, now=10.0)
    assert not count.arrive(TERM, forwarded=True, now=10.02)
    assert count.count == 1
    count = SignalCount()
    assert count.arrive(TERM, forwarded=True, now=10.0)
    assert not count.arrive(TERM, forwarded=False, now=10.3)
    assert count.count == 1


def test_two_signals_the_same_way_are_two_deliveries() -> None:
    """A person's second Ctrl-C, the platform's second SIGTERM: both forwarded."""
    count = SignalCount()
    assert count.arrive(INT, forwarded=True, now=1.0)
    assert count.arrive(INT, forwarded=True, now=1.1)
    assert count.count == 2


def test_a_later_signal_or_another_signal_is_not_a_twin() -> None:
    count = SignalCount()
    assert count.arrive(TERM, forwarded=False, now=1.0)
    assert count.arrive(TERM, forwarded=True, now=1.0 + TWIN_WINDOW + 0.01)
    assert count.arrive(INT, forwarded=False, now=1.0 + TWIN_WINDOW + 0.02)
    assert count.count == 3


@given(
    st.lists(st.tuples(st.sampled_from([TERM, INT]), st.booleans(), st.floats(0, 0.5)), max_size=12)
)
def test_each_arrival_pairs_at_most_once(arrivals: list[tuple[int, bool, float]]) -> None:
    """Counted = arrivals less the pairs; a pair is one direct and one forwarded arrival."""
    count, now, twins = SignalCount(), 0.0, 0
    for signum, forwarded, gap in arrivals:
        now += gap
        twins += not count.arrive(signum, forwarded=forwarded, now=now)
    assert count.count + twins == len(arrivals)
    assert twins <= min(
        sum(1 for _, f, _ in arrivals if f), sum(1 for _, f, _ in arrivals if not f)
    )


WATCHDOG_OOM_READING = textwrap.dedent(
    """
    import json, os, sys
    from trio_worker._watch import _main, _records

    readings = iter([5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6])
    _main.oom_kills = lambda: next(readings, 6)
    _main.RECORD_POLL = 0.01
    child = os.fork()
    if child == 0:
        import time
        time.sleep(0.2)
        os._exit(0)
    read, write = os.pipe()
    state_fd, _ = _records.open_state()
    spec = {"child": child, "tee": None, "records": read, "state": state_fd,
            "oom_before": 5, "tail_bytes": 64}
    watchdog = _main._Watchdog(spec)
    code = watchdog.wait()
    print(json.dumps({"code": code, "oom_count": watchdog.oom_count}))
    """
)


def test_the_watchdog_keeps_the_oom_count_current_while_the_worker_lives() -> None:
    """An OOM kill earlier in the worker's life (a child of it, say) is absorbed into the
    count before the death, so a later kill -9 is not labelled out_of_memory."""
    done = subprocess.run(
        [sys.executable, "-c", WATCHDOG_OOM_READING],
        capture_output=True,
        timeout=60,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert json.loads(done.stdout) == {"code": 0, "oom_count": 6}


def test_lost_records_are_said_when_the_watchdog_reads_them(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A worker that wrote records faster than they were read: the held jobs are forgotten
    (fail safe), and the container log says so at once, not only after a death."""
    from trio_worker._watch import _main, _records

    read, write = os.pipe()
    state_fd, _ = _records.open_state()
    spec = {"child": 0, "tee": None, "records": read, "state": state_fd, "oom_before": None}
    watchdog = _main._Watchdog(spec)
    try:
        os.write(write, b"T " + b"job-1".hex().encode() + b"\nX \nT " + b"job-2".hex().encode())
        os.write(write, b"\n")
        watchdog._read_records()
        assert list(watchdog.ledger.held) == ["job-2"]
    finally:
        for fd in (read, write, state_fd):
            os.close(fd)
    assert "records overflowed" in capfd.readouterr().err

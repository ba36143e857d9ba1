"""``_progress_calls.ProgressTarget``: how an update from a thread reaches the worker's loop.

A step callback may fire thousands of times a second; the target keeps the newest update
per job and wakes the loop once per job until it takes it (the rules as a handler's
threads meet them are in tests/test_progress_threads.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import trio

from trio_worker._progress_calls import ProgressTarget


def test_a_thread_firing_updates_keeps_one_hand_over_per_job_on_its_way() -> None:
    # A step callback may fire thousands of times a second: the loop is woken once per
    # job until it takes the newest update, never once per call.
    handed: list[tuple[Callable[..., object], tuple[object, ...]]] = []
    posted: list[tuple[str, bytes]] = []

    async def token_of_a_run() -> trio.lowlevel.TrioToken:
        return trio.lowlevel.current_trio_token()

    target = ProgressTarget(
        lambda job_id, body: posted.append((job_id, body)),
        trio.run(token_of_a_run),
        lambda fn, *args: handed.append((fn, args)),
    )

    def fire() -> None:
        for step in range(1000):
            target.send("a", b"%d" % step)
            target.send("b", b"%d" % step)

    thread = threading.Thread(target=fire)
    thread.start()
    thread.join()
    assert len(handed) == 2  # one per job, not one per call
    for fn, args in handed:
        fn(*args)
    assert posted == [("a", b"999"), ("b", b"999")]
    # Once taken, the next update queues a hand-over of its own again.
    target.send("a", b"1000")
    assert len(handed) == 3

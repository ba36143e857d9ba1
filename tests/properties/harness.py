"""Run one drawn `Scenario` against the real worker in virtual time, then check invariants.

Theory of operation
-------------------
One example is one ``trio.run`` in virtual time: the fake platform, served by the
package's own h11 server over in-memory streams, answers the worker's own production HTTP
client, and the real ``trio_worker.serve`` runs user code that only waits on the virtual
clock. Everything observable goes into one `Recorder` under a global sequence number; once
the run is over, pure checkers judge what was recorded and each returns its violations.

The suite's pieces, one concern a module (this module re-exports the entry points that
``tests/test_properties.py`` uses):

* ``scenario.py``: what one example is (the `Scenario` and its plans);
* ``strategies.py``: how Hypothesis draws a `Scenario`, and the network steps;
* ``threads.py``: the `Baton` that keeps sync user code in its threads on virtual time;
* ``recorder.py``: what is recorded (transitions, exchanges, handler runs, stops, phases,
  the worker's log lines);
* ``chaos.py``: the network under the real client (drawn delays, refused and hanging
  connects) and the recording of each request;
* ``usercode.py``: the initializer and handlers the worker runs, and the errors they raise;
* ``runner.py``: the driver of one scenario (jobs, faults, stops, SIGTERM at their drawn
  times) and `run_scenario`, which returns the finished `Run`;
* ``views.py``: what the checkers derive from a `Run` (per job, per report, held ids);
* ``checks_init.py``, ``checks_jobs.py``, ``checks_worker.py``: the invariants of the
  initializer, of each job, and of the worker as a whole (docs/design.md §4);
* ``invariants.py``: every checker by name, `check_all`, and the coverage labels.
"""

from __future__ import annotations

from .invariants import CHECKS, check_all, describe, drop_frames
from .runner import Run, run_scenario, scratch_check

__all__ = ["CHECKS", "Run", "check_all", "describe", "drop_frames", "run_scenario", "scratch_check"]

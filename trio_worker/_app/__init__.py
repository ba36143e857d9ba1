"""Load-balancing endpoints: the user's ASGI app served on hypercorn, its load supervised.

See docs/load-balancing.md and docs/design.md §14.

* ``_health``: the phases (loading, ready, failed, draining) and what ``/ping`` answers;
  pure, no I/O.
* ``_gate``: the ASGI layer in front of the app: ``/ping``, 503 until ready, the requests
  in flight.
* ``_lifespan``: the app's own lifespan, run by the worker so its startup is the load.
* ``_loops``: trio or asyncio, where the app runs (the backend rule), and hypercorn on it.
* ``_serve``: :class:`AppWorker`, the worker inside a trio run.
* ``_start``: :func:`start_app`, the process: watchdog, capture, signals, exit.
* ``_realtime``: runpod's realtime route (``RUNPOD_REALTIME_PORT``) for a handler.
"""

from __future__ import annotations

from ._start import start_app

__all__ = ["start_app"]

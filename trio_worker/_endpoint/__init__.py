"""The local endpoint: Runpod's endpoint API on localhost, with a real worker behind it.

``trio-worker dev handler.py`` and ``python handler.py --rp_serve_api`` serve it
(docs/design.md §10): :class:`EndpointApp` holds an embedded job queue and answers both
the endpoint API (``/run``, ``/runsync``, ``/status``, ``/stream``, ``/cancel``,
``/health``, ``/purge-queue``, a page at ``/``, webhooks) and the worker routes the
production worker loop takes its jobs from over loopback HTTP, on hypercorn
(:func:`serve_endpoint`). :class:`Guard` and a per-run key keep the browser's other
pages and other processes out (docs/security.md).

The modules, bottom up: ``_records`` (what is known of each job and request), ``_rules``
(the platform's rules for the endpoint API), ``_queue`` and ``_state`` (the queue, then
stops, pings and the time rules), ``_webhooks``, ``_page``, ``_routes`` and ``_app`` (the
ASGI app, its shapes in ``_asgi``), ``_guard``, and ``_serving`` (hypercorn, with the
read deadlines and the cap on requests in flight). It imports
nothing of the worker; :mod:`trio_worker.testing` builds its fake platform on it.
"""

from __future__ import annotations

from ._app import EndpointApp
from ._guard import Guard
from ._serving import EndpointLimits, serve_endpoint

__all__ = ["EndpointApp", "EndpointLimits", "Guard", "serve_endpoint"]

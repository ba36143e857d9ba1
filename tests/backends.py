"""Running a trio test on either backend (docs/design.md §2).

pytest-trio runs each async test with the ``run`` of its first ``trio`` mark; a mark carried
by a parametrize value comes before the one trio mode adds, so these parameters choose the
runner per case: ``trio.run``, or ``trio_worker.run_asyncio_host`` (the test body as trio's
guest on an asyncio loop, where the worker's asyncio backend needs to run). Asyncio tasks
do not run on trio's clock, so a test on the asyncio host keeps to the real clock unless its
asyncio handlers only wait on what the supervisor controls.
"""

from __future__ import annotations

import pytest

import trio_worker

ON_ASYNCIO_HOST = pytest.param(
    "asyncio", id="asyncio", marks=pytest.mark.trio(run=trio_worker.run_asyncio_host)
)

# The worker's async_backend, each on the host it needs.
BOTH_BACKENDS = pytest.mark.parametrize(
    "backend", [pytest.param("trio", id="trio"), ON_ASYNCIO_HOST]
)
ASYNCIO_ONLY = pytest.mark.parametrize("backend", [ON_ASYNCIO_HOST])

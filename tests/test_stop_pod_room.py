"""With ``refresh_worker``, an error body near 64 KiB still has room for ``"stopPod": true``.

Error bodies are fitted under ``MAX_ERROR_BODY_BYTES`` with ``stopPod`` in them
(docs/design.md I6, ``trio_worker/_fitting.py``). A body that lands just under the bound, or
one the fit shrank to just under it, is where a ``stopPod`` left out of the fit would push
the posted body over the limit: so the sizes are swept across that edge, byte by byte, not
tried once. The sizes are set through the real worker: each job's handler raises
an error whose message and note are sized, from a calibration run, so that the body the
worker would post unfitted takes every size from well below the limit to past it.
"""

from __future__ import annotations

import json
from typing import Any

import trio

from trio_worker._payloads import MAX_ERROR_BODY_BYTES
from trio_worker.testing import FakePlatform

from .test_delivery import done_requests, finished, running

LIMIT = MAX_ERROR_BODY_BYTES
# The unfitted sizes swept: every byte from well below the fit's bound to past the limit.
SWEEP = range(LIMIT - 96, LIMIT + 64)
# Quotes cost the most bytes in a body (escaped twice), so a few thousand of them bring it
# near the limit while the message stays under the per-field clip (16 K characters).
QUOTES = 6000


async def raises(job: dict[str, Any]) -> Any:
    error = ValueError('"' * QUOTES + "x" * job["input"]["x"])
    # A note is printed in the traceback only: one more character, one more byte.
    error.add_note("y" * job["input"]["note"])
    raise error


async def posted_bodies(jobs: list[dict[str, int]]) -> list[bytes]:
    """Run *jobs* (inputs of :func:`raises`) on one worker with ``refresh_worker``; the
    error body posted for each, in order (each reported once, its answer a 200)."""
    platform = FakePlatform()
    ids = [platform.enqueue(job) for job in jobs]
    # All held by the first take: refresh_worker drains after the first report.
    async with running(platform, raises, refresh_worker=True, concurrency=len(jobs)):
        for job_id in ids:
            await finished(platform, job_id, "FAILED")
    bodies = []
    for job_id in ids:
        [request] = done_requests(platform, job_id)
        assert request.status == 200
        bodies.append(request.body)
    return bodies


async def test_stop_pod_fits_in_error_bodies_swept_across_the_limit(
    virtual_clock: trio.abc.Clock,
) -> None:
    # Calibration: what one more "x" and one more note character add to the posted body.
    base, more_x, more_note = map(
        len, await posted_bodies([{"x": 0, "note": 1}, {"x": 1, "note": 1}, {"x": 0, "note": 2}])
    )
    per_x, per_note = more_x - base, more_note - base
    assert per_note == 1, "the sweep needs a one-byte step"
    assert base < SWEEP.start
    plans = [{"x": (size - base) // per_x, "note": 1 + (size - base) % per_x} for size in SWEEP]

    bodies = await posted_bodies(plans)
    # The calibration holds: the smallest of the sweep, far under any fitting, went out
    # whole at exactly its planned size.
    assert len(bodies[0]) == SWEEP.start
    for unfitted, raw in zip(SWEEP, bodies, strict=True):
        assert len(raw) <= LIMIT, f"a body of {unfitted} bytes unfitted was posted as {len(raw)}"
        body = json.loads(raw)
        assert body["stopPod"] is True
        inner = json.loads(body["error"])
        assert inner["error_type"] == "ValueError"


async def costly_error_chunk(job: dict[str, Any]) -> Any:
    yield {"token": 1}
    yield {"error": job["input"]["char"] * 20_000}


async def test_an_error_chunk_of_escaped_characters_is_posted_within_the_limit(
    virtual_clock: trio.abc.Clock,
) -> None:
    """A stream's error chunk is the user's text, clipped to 16 K characters: of control
    characters, each written ``\\u0001`` on the wire, that is about 96 KB, past the
    64 KiB every error body is held to (docs/design.md I6)."""
    platform = FakePlatform()
    ids = [platform.enqueue({"char": char}) for char in ("\x01", '"', "é")]
    async with running(platform, costly_error_chunk, refresh_worker=True, concurrency=3):
        for job_id in ids:
            await finished(platform, job_id, "FAILED")
    for job_id, char in zip(ids, ("\x01", '"', "é"), strict=True):
        [request] = done_requests(platform, job_id)
        assert request.status == 200
        assert len(request.body) <= LIMIT
        body = json.loads(request.body)
        assert body["stopPod"] is True
        assert body["error"].startswith(char * 1000)
        assert "characters truncated" in body["error"]

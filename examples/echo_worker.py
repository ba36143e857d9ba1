"""A complete worker: load a model once in the initializer, then answer jobs.

Run it locally, end to end, with no platform at all::

    python examples/echo_worker.py --test_input '{"input": {"prompt": "hello"}}'

or serve the endpoint API on localhost (POST /run, /runsync, GET /status/{id}, ...)::

    python examples/echo_worker.py --rp_serve_api --rp_api_port 8000

On Runpod the same file runs unchanged: the platform sets ``RUNPOD_WEBHOOK_GET_JOB`` and the
worker takes jobs from the queue.
"""

from __future__ import annotations

import time
from typing import Any

import trio_worker

MODEL: dict[str, Any] = {}


def load_model() -> None:
    """Stands in for loading weights: slow, once per worker, before any job runs."""
    time.sleep(0.2)
    MODEL["greeting"] = "hello from the model"


def handler(job: dict[str, Any]) -> dict[str, Any]:
    prompt = str(job["input"].get("prompt", ""))
    return {"text": f"{MODEL['greeting']}: {prompt}", "length": len(prompt)}


if __name__ == "__main__":
    trio_worker.start(handler, initializer=load_model, init_timeout=60)

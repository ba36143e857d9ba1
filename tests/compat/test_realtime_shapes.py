"""The realtime route's answers beside runpod 1.12's own, for the same handlers.

runpod's ``WorkerAPI._realtime`` answers ``jsonable_encoder(await run_job(handler, job))``;
trio_worker's realtime route answers the job-done body of the queue worker's
``JobRunner``. For every result shape a handler returns, the two are compared here, in
process: the route over ASGI, runpod's ``run_job`` called directly. A raising handler's
``error`` is a JSON string in both, naming the same message (trio_worker's carries more
fields: the category, the output tail).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import trio

from trio_worker import Timings as _Timings
from trio_worker._app._realtime import RealtimeApp, _Discarded
from trio_worker._config import Settings
from trio_worker._options import worker_options
from trio_worker._payloads import Payloads
from trio_worker._runner import JobRunner, JobSpec
from trio_worker._scopes import Scopes

if TYPE_CHECKING:
    from collections.abc import Callable, MutableMapping

HANDLERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "dict": lambda job: {"text": job["input"]["prompt"]},
    "string": lambda job: "plain text",
    "list": lambda job: [1, 2, 3],
    "number": lambda job: 4.5,
    "bool": lambda job: False,
    "none": lambda job: None,
    "error key": lambda job: {"error": "the prompt is empty"},
    "error key and output": lambda job: {"error": "partial", "text": "half"},
    "empty dict": lambda job: {},
}


async def realtime_answer(handler: Callable[[dict[str, Any]], Any], job: dict[str, Any]) -> Any:
    options = worker_options(handler, capture_logs="off")
    settings = Settings.from_environ({}, capture_logs="off")
    runner = JobRunner(
        JobSpec.from_options(options),
        settings,
        Payloads.for_worker(settings),
        _Discarded(),
        None,
        Scopes(_Timings()),
        lambda: False,
    )
    app = RealtimeApp(runner, "ep", 1)
    sent: list[dict[str, Any]] = []
    body = json.dumps(job).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope = {"type": "http", "method": "POST", "path": "/ep/realtime", "headers": []}
    await app(scope, receive, send)
    assert sent[0]["status"] == 200
    return json.loads(sent[1]["body"])


async def reference_answer(handler: Callable[[dict[str, Any]], Any], job: dict[str, Any]) -> Any:
    from fastapi.encoders import jsonable_encoder
    from runpod.serverless.modules.rp_job import run_job

    result = await trio.to_thread.run_sync(
        lambda: __import__("asyncio").run(run_job(handler, dict(job)))
    )
    return json.loads(json.dumps(jsonable_encoder(result)))


@pytest.mark.parametrize("shape", list(HANDLERS))
async def test_the_answer_is_runpods_for_every_result_shape(shape: str) -> None:
    job = {"id": "j1", "input": {"prompt": "hi"}}
    handler = HANDLERS[shape]
    assert await realtime_answer(handler, job) == await reference_answer(handler, job)


async def test_a_raising_handler_is_an_error_string_naming_the_same_message() -> None:
    def handler(job: dict[str, Any]) -> None:
        raise ValueError("bad prompt")

    job = {"id": "j1", "input": {}}
    ours = await realtime_answer(handler, job)
    theirs = await reference_answer(handler, job)
    assert set(ours) == set(theirs) == {"error"}
    assert (
        json.loads(ours["error"])["error_message"] == json.loads(theirs["error"])["error_message"]
    )

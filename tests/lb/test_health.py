"""The phase table of ``_app/_health.py``, by hand-built sequences (as h11's test_state)."""

from __future__ import annotations

import json

import pytest

from trio_worker._app._health import Failure, Health, IllegalTransition, Phase

OOM = Failure("out_of_memory", "RuntimeError", "CUDA out of memory")


def test_loading_ready_draining() -> None:
    health = Health()
    seen: list[Phase] = []
    health.observers.append(seen.append)
    assert health.ping().status == 204
    assert health.refusal().status == 503
    assert dict(health.refusal().headers)[b"retry-after"] == b"5"
    health.become(Phase.READY)
    assert health.ping().status == 200
    health.become(Phase.DRAINING)
    assert health.ping().status == 503
    assert json.loads(health.refusal().body)["status"] == "draining"
    assert seen == [Phase.READY, Phase.DRAINING]


def test_a_failure_is_what_ping_and_the_routes_say() -> None:
    health = Health()
    health.fail(OOM)
    for answer in (health.ping(), health.refusal()):
        body = json.loads(answer.body)
        assert answer.status == 503
        assert body["error_category"] == "out_of_memory"
        assert body["error_type"] == "RuntimeError"
        assert body["error"].endswith("CUDA out of memory")


@pytest.mark.parametrize(
    ("path", "illegal"),
    [
        ([Phase.READY], "fail"),  # a worker that served never reports a load failure
        ([Phase.READY, Phase.DRAINING], Phase.READY),
        ([Phase.DRAINING], Phase.READY),
        ([Phase.DRAINING], "fail"),
        (["fail"], Phase.READY),
        (["fail"], Phase.DRAINING),
        ([], Phase.FAILED),  # only fail() carries the reason
    ],
)
def test_what_the_table_forbids(path: list[Phase | str], illegal: Phase | str) -> None:
    health = Health()
    for step in path:
        health.fail(OOM) if step == "fail" else health.become(Phase(step))
    with pytest.raises(IllegalTransition):
        health.fail(OOM) if illegal == "fail" else health.become(Phase(illegal))


def test_staying_in_a_phase_is_no_change() -> None:
    health = Health()
    seen: list[Phase] = []
    health.observers.append(seen.append)
    health.become(Phase.LOADING)
    assert seen == [] and health.phase is Phase.LOADING

"""The recommended fake wiring of the platform's environment variables, for the
configuration tests (tests/test_config*.py)."""

from __future__ import annotations

H = "http://platform.test/v2/ep1"
WIRING = {
    "RUNPOD_WEBHOOK_GET_JOB": f"{H}/job-take/$ID?gpu=A100",
    "RUNPOD_WEBHOOK_POST_OUTPUT": f"{H}/job-done/$RUNPOD_POD_ID/$ID?gpu=A100",
    "RUNPOD_WEBHOOK_POST_STREAM": f"{H}/job-stream/$RUNPOD_POD_ID/$ID?gpu=A100",
    "RUNPOD_WEBHOOK_PING": f"{H}/ping/$RUNPOD_POD_ID?gpu=A100",
    "RUNPOD_AI_API_KEY": "rpa_key",
    "RUNPOD_POD_ID": "w1",
    "RUNPOD_PING_INTERVAL": "1000",
}


def env(**overrides: str | None) -> dict[str, str]:
    """The recommended fake wiring, with *overrides* (None removes a variable)."""
    out = dict(WIRING)
    for name, value in overrides.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out

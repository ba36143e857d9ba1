"""A handler in the shape of runpod-workers/worker-faster_whisper's ``rp_handler.py``.

The reference's utilities stay in use: ``@rp_debugger.FunctionTimer`` and
``rp_debugger.LineTimer`` around each step, an ``rp_validator`` schema, ``rp_cleanup``
after the job, ``RunPodLogger`` for the job's log lines. Only the model is a stub, and the
last line is trio_worker's ``start`` in the reference's one-dict form.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from runpod.serverless.modules.rp_logger import RunPodLogger
from runpod.serverless.utils import rp_cleanup, rp_debugger
from runpod.serverless.utils.rp_validator import validate

import trio_worker

INPUT_VALIDATIONS: dict[str, dict[str, Any]] = {
    "audio": {"type": str, "required": True},
    "model": {
        "type": str,
        "required": False,
        "default": "base",
        "constraints": lambda model: model in ("tiny", "base", "small"),
    },
    "temperature": {"type": float, "required": False, "default": 0.0},
    "with_timings": {"type": bool, "required": False, "default": False},
}

logger = RunPodLogger()


class Predictor:
    """Stands in for faster_whisper's WhisperModel."""

    def predict(self, audio_path: str, model: str, temperature: float) -> dict[str, Any]:
        text = Path(audio_path).read_text(encoding="utf-8")
        if text == "corrupt":
            raise RuntimeError("could not decode audio: invalid data found")
        return {"transcription": f"text of {text}", "model": model, "temperature": temperature}


MODEL = Predictor()


@rp_debugger.FunctionTimer
def run_whisper_job(job: dict[str, Any]) -> dict[str, Any]:
    job_input = job["input"]

    with rp_debugger.LineTimer("validation_step"):
        input_validation = validate(job_input, INPUT_VALIDATIONS)
        if "errors" in input_validation:
            return {"error": input_validation["errors"]}
        job_input = input_validation["validated_input"]

    logger.info(f"transcribing {job_input['audio']}", job["id"])

    with rp_debugger.LineTimer("download_step"):
        # rp_download.download_files_from_urls would write here: input_objects/<job id>/.
        folder = Path("input_objects") / job["id"]
        folder.mkdir(parents=True, exist_ok=True)
        audio_path = folder / "audio.wav"
        audio_path.write_text(job_input["audio"], encoding="utf-8")

    with rp_debugger.LineTimer("prediction_step"):
        try:
            result = MODEL.predict(str(audio_path), job_input["model"], job_input["temperature"])
        except RuntimeError as exc:
            logger.error(f"prediction failed: {exc}", job["id"])
            raise

    with rp_debugger.LineTimer("cleanup_step"):
        rp_cleanup.clean(["input_objects"])

    result["leftover_input_objects"] = os.path.exists("input_objects")
    if job_input["with_timings"]:
        # What --rp_debugger adds in the reference, asked for by the handler itself.
        result["rp_debugger"] = rp_debugger.get_debugger_output()
    return result


if __name__ == "__main__":
    trio_worker.start({"handler": run_whisper_job})

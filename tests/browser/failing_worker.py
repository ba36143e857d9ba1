"""A worker whose handler fails the way a missing model file does (the browser test's)."""

from __future__ import annotations

from typing import Any

import trio_worker


def handler(job: dict[str, Any]) -> dict[str, Any]:
    path = str(job["input"].get("model", "/models/missing.bin"))
    print(f"loading weights from {path}", flush=True)
    with open(path, "rb") as weights:  # raises FileNotFoundError: category file_not_found
        return {"size": len(weights.read())}


if __name__ == "__main__":
    trio_worker.start(handler)

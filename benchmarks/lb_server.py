"""One no-op FastAPI app, served the three ways ``lb_figures`` compares.

``python benchmarks/lb_server.py MODE PORT``, MODE one of:

* ``start_app``: ``trio_worker.start_app(app, initializer=...)``, an initializer that
  returns at once (the load-balancing worker: ``/ping``, the gate, the watchdog);
* ``hypercorn``: the app under hypercorn alone (its asyncio worker, as ``hypercorn
  module:app`` runs it), with a hand-written ``/ping``;
* ``uvicorn``: the app under uvicorn alone, what Runpod's tutorial runs, with the same
  hand-written ``/ping``.
"""

from __future__ import annotations

import sys

from fastapi import FastAPI, Response

app = FastAPI()


@app.get("/noop")
async def noop() -> dict[str, bool]:
    return {"ok": True}


def _hand_written_ping(target: FastAPI) -> None:
    # The tutorial's route (there behind a model_ready flag; the model is ready at once).
    @target.get("/ping")
    async def ping() -> Response:
        return Response(status_code=200)


def main() -> None:
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "start_app":
        import os

        import trio_worker

        os.environ["PORT"] = str(port)
        trio_worker.start_app(app, initializer=lambda: None, capture_logs="off")
    _hand_written_ping(app)
    if mode == "hypercorn":
        import asyncio

        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.accesslog = None
        config.errorlog = None
        asyncio.run(serve(app, config))  # type: ignore[arg-type]
    elif mode == "uvicorn":
        import uvicorn

        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()

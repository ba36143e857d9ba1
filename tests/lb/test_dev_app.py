"""``trio-worker dev --app module:app`` (a load-balancing worker locally) and ``--allow-host``,
as a user runs them: the installed ``trio-worker`` command, real processes, no PYTHONPATH."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from tests.integration.conftest import kill_all, open_worker
from tests.lb.test_process import env
from tests.lb.test_realtime import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TRIO_WORKER = Path(sys.executable).with_name("trio-worker")


async def test_dev_app_serves_the_example_with_its_ping(nursery: trio.Nursery) -> None:
    port = free_port()
    argv = [str(TRIO_WORKER), "dev", "--app", "examples.lb_fastapi_worker:app", "--port", str(port)]
    worker = await open_worker(nursery, argv, env(), REPO)
    try:
        await worker.until_output("/ping answers 200")
        async with httpx.AsyncClient(timeout=10, base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/ping")).status_code == 200
            answer = await client.post("/generate", json={"prompt": "a b c"})
        assert answer.json() == {"model": "tiny-echo", "text": "c b a"}
        worker.signal(signal.SIGTERM)
        assert await worker.wait() == 0
    finally:
        await kill_all([worker])


def test_dev_app_that_cannot_be_imported_is_one_line_and_status_2() -> None:
    done = subprocess.run(
        [str(TRIO_WORKER), "dev", "--app", "no_such_module:app"],
        capture_output=True,
        text=True,
        env=env(),
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert re.fullmatch(r"trio-worker: error: --app no_such_module:app: .*\n", done.stderr)


async def test_dev_allow_host_serves_a_compose_service_name(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    handler = tmp_path / "worker.py"
    handler.write_text(
        "import trio_worker\ntrio_worker.start(lambda job: {'echo': job['input']})\n"
    )
    port = free_port()
    argv = [str(TRIO_WORKER), "dev", str(handler), "--port", str(port), "--allow-host", "worker"]
    worker = await open_worker(nursery, argv, env(), tmp_path)
    try:
        await worker.until_output("trio_worker local endpoint:")
        async with httpx.AsyncClient(timeout=30, base_url=f"http://127.0.0.1:{port}") as client:
            named = await client.post(
                "/runsync", json={"input": {"n": 1}}, headers={"host": f"worker:{port}"}
            )
            other = await client.get("/health", headers={"host": f"db:{port}"})
        assert named.json()["output"] == {"echo": {"n": 1}}
        assert other.status_code == 403 and "--allow-host db" in other.json()["error"]
    finally:
        await kill_all([worker])

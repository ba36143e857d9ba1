"""The local endpoint is safe beside the developer's browser (docs/security.md).

Any page the developer opens can send requests to ``localhost``: these tests make them,
against a real ``--rp_serve_api`` process, as such a page (or an outsider on loopback)
would, and check each is refused with a 4xx and a one-line reason, and changes nothing.
The read deadlines, the cap on requests in flight and the checks made on the request head
are tested against the endpoint's hypercorn server in
``tests/test_local_endpoint_hypercorn.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from trio_worker._endpoint import Guard
from trio_worker._endpoint._guard import Refusal
from trio_worker._local import local_endpoint_app

if TYPE_CHECKING:
    from collections.abc import Iterator

REPO = Path(__file__).resolve().parents[1]
BANNER = "trio_worker local endpoint: "
EP = "/v2/local"

pytestmark = pytest.mark.timeout(60)

# A job with {"hold": s} keeps the only slot for s seconds, so the next job stays queued.
WORKER = """
import time
import trio_worker

def handler(job):
    time.sleep(job["input"].get("hold", 0))
    return {"echo": job["input"]}

trio_worker.start({"handler": handler})
"""


class Endpoint:
    def __init__(self, base: str) -> None:
        self.base = base
        self.host = base.removeprefix("http://")
        self.client = httpx.Client(base_url=base, timeout=20)

    def queued(self) -> int:
        jobs = self.client.get("/health").json()["jobs"]
        return int(jobs["inQueue"])

    def run(self, input: dict[str, object]) -> str:
        answer = self.client.post("/run", json={"input": input})
        assert answer.status_code == 200, answer.text
        return str(answer.json()["id"])

    def status(self, job_id: str) -> str:
        return str(self.client.get(f"/status/{job_id}").json()["status"])

    def wait_status(self, job_id: str, wanted: str) -> None:
        for _ in range(4000):  # the worker takes a job within milliseconds
            if self.status(job_id) == wanted:
                return
            time.sleep(0.005)
        raise AssertionError(f"{job_id} never reached {wanted}")


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    script = tmp_path_factory.mktemp("endpoint") / "worker.py"
    script.write_text(WORKER)
    # The installed package, as a user's process finds it: no checkout on PYTHONPATH.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "TW_", "PYTHONPATH"))
    }
    # A key in the developer's environment must not be what the local routes accept.
    env.update(PYTHONUNBUFFERED="1", RUNPOD_AI_API_KEY="env-key")
    args = ["--rp_serve_api", "--rp_api_host", "127.0.0.1", "--rp_api_port", "0"]
    process = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    found: list[str] = []
    ready = threading.Event()

    def read() -> None:  # also drains the pipe, so the worker never blocks on it
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith(BANNER) and not found:
                found.append(line.removeprefix(BANNER).strip())
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(30) and found, "no endpoint URL printed"
        served = Endpoint(found[0])
        yield served
        served.client.close()
    finally:
        process.kill()
        process.wait()
        reader.join(timeout=5)
        assert process.stdout is not None
        process.stdout.close()


def refused(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    reason = response.json()["error"]
    assert words in reason
    assert "\n" not in reason


def test_run_refuses_a_body_that_is_not_typed_json(endpoint: Endpoint) -> None:
    # text/plain is what a page may send with no preflight (FastAPI's CVE-2021-32677).
    before = endpoint.queued()
    body = json.dumps({"input": {"x": 1}})
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        answer = endpoint.client.post("/run", content=body, headers={"Content-Type": kind})
        refused(answer, 415, "application/json")
    refused(endpoint.client.post("/runsync", content=body), 415, "application/json")
    assert endpoint.queued() == before
    typed = {"Content-Type": "application/json; charset=utf-8"}
    assert endpoint.client.post("/run", content=body, headers=typed).status_code == 200


def test_a_cross_origin_page_cannot_queue_a_job_or_choose_a_webhook(endpoint: Endpoint) -> None:
    before = endpoint.queued()
    body = {"input": {"x": 1}, "webhook": "http://attacker.example/collect"}
    for headers in (
        {"Origin": "http://attacker.example"},
        {"Origin": "null"},
        {"Origin": f"http://{endpoint.host.replace('127.0.0.1', 'localhost')}"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ):
        answer = endpoint.client.post("/run", json=body, headers=headers)
        refused(answer, 403, "cross-origin")
    assert endpoint.queued() == before


def test_a_cross_origin_page_cannot_read_or_cancel(endpoint: Endpoint) -> None:
    job_id = endpoint.run({})
    page = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
    refused(endpoint.client.get(f"/status/{job_id}", headers=page), 403, "cross-origin")
    refused(endpoint.client.get(f"/stream/{job_id}", headers=page), 403, "cross-origin")
    origin = {"Origin": "http://attacker.example"}
    refused(endpoint.client.post("/purge-queue", headers=origin), 403, "cross-origin")
    # The page itself, from its own origin, is served.
    own = {"Origin": endpoint.base, "Sec-Fetch-Site": "same-origin"}
    assert endpoint.client.get(f"/status/{job_id}", headers=own).status_code == 200


def test_a_rebound_host_name_cannot_read_a_status(endpoint: Endpoint) -> None:
    # DNS rebinding: attacker.example now resolves to 127.0.0.1, so the page is
    # "same-origin" with the endpoint, but its requests carry the attacker's Host.
    job_id = endpoint.run({})
    port = endpoint.host.rsplit(":", 1)[1]
    for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.nip.io:{port}"):
        answer = endpoint.client.get(f"/status/{job_id}", headers={"Host": host})
        refused(answer, 403, "Host")
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        answer = endpoint.client.get(f"/status/{job_id}", headers={"Host": host})
        assert answer.status_code == 200, (host, answer.text)


def test_an_outsider_can_neither_forge_a_result_nor_take_a_job(endpoint: Endpoint) -> None:
    running = endpoint.run({"hold": 30})
    endpoint.wait_status(running, "IN_PROGRESS")
    queued = endpoint.run({"x": "mine"})
    forged = json.dumps({"output": "forged"})
    for key in ({}, {"Authorization": "wrong"}, {"Authorization": "env-key"}):
        done = endpoint.client.post(
            f"{EP}/job-done/local-worker/{running}?gpu=x", content=forged, headers=key
        )
        refused(done, 401, "key")
        take = endpoint.client.get(f"{EP}/job-take/outsider?gpu=x", headers=key)
        refused(take, 401, "key")
        ping = endpoint.client.get(f"{EP}/ping/outsider?job_id={running}", headers=key)
        refused(ping, 401, "key")
        stream = endpoint.client.post(
            f"{EP}/job-stream/local-worker/{running}?gpu=x", content=forged, headers=key
        )
        refused(stream, 401, "key")
    assert endpoint.status(running) == "IN_PROGRESS"
    assert endpoint.status(queued) == "IN_QUEUE"
    endpoint.client.post(f"/cancel/{running}")
    endpoint.client.post(f"/cancel/{queued}")


def test_the_page_may_not_be_framed_by_another(endpoint: Endpoint) -> None:
    # A framed page's clicks would be the framing page's; a <meta> policy cannot say so.
    page = endpoint.client.get("/")
    assert page.status_code == 200
    assert page.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


def test_each_run_makes_its_own_key_and_gives_it_to_its_worker() -> None:
    first, second = local_endpoint_app("localhost"), local_endpoint_app("localhost")
    assert first.api_key is not None and second.api_key is not None
    assert first.api_key != second.api_key
    assert len(first.api_key) >= 43  # 32 random bytes, URL-safe base64
    wiring = first.worker_env("http://localhost:8000", worker_id="local-worker")
    assert wiring["RUNPOD_AI_API_KEY"] == first.api_key
    assert first.guard == Guard.for_host("localhost")


# -- the guard's rules, one by one ----------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "port", "allowed"),
    [
        ("localhost:8000", 8000, True),
        ("LOCALHOST:8000", 8000, True),
        ("127.0.0.1:8000", 8000, True),
        ("[::1]:8000", 8000, True),
        ("localhost:8001", 8000, False),  # another server on this machine
        ("localhost", 8000, False),
        ("localhost", 80, True),  # a browser leaves out port 80
        ("[::1]", 80, True),
        ("attacker.example:8000", 8000, False),
        ("127.0.0.2:8000", 8000, False),
        ("::1:8000", 8000, False),
        ("", 8000, False),
        ("dev-box:8000", 8000, True),  # the --rp_api_host name
        ("0.0.0.0:8000", 8000, False),
    ],
)
def test_only_this_machine_on_this_port_is_a_host(host: str, port: int, allowed: bool) -> None:
    assert Guard.for_host("dev-box").allows_host(host, port) is allowed


def test_an_ipv6_api_host_is_matched_in_brackets() -> None:
    guard = Guard.for_host("fd00::5")
    assert guard.allows_host("[fd00::5]:8000", 8000)
    assert not guard.allows_host("fd00::5:8000", 8000)


def test_a_link_to_the_page_opens_it_but_nothing_else() -> None:
    guard = Guard.for_host("localhost")
    link = {
        "host": "localhost:8000",
        "sec-fetch-site": "cross-site",
        "sec-fetch-mode": "navigate",
        "sec-fetch-dest": "document",
    }
    assert guard.check("page", "GET", link, 8000) is None
    framed = {**link, "sec-fetch-dest": "iframe"}
    assert guard.check("page", "GET", framed, 8000) == Refusal(
        403, "cross-origin request refused: the endpoint serves its own page"
    )
    for route in ("api_status", "api_health", "openapi"):
        refused_ = guard.check(route, "GET", link, 8000)
        assert refused_ is not None and refused_.status == 403


def test_an_empty_post_needs_no_type_but_a_body_does() -> None:
    guard = Guard.for_host("localhost")
    tool = {"host": "localhost:8000"}  # curl -X POST, no body
    assert guard.check("api_cancel", "POST", tool, 8000) is None
    typed = {**tool, "content-length": "2", "content-type": "text/plain"}
    assert guard.check("api_cancel", "POST", typed, 8000) == Refusal(
        415, "the body must be sent as Content-Type: application/json"
    )
    # Worker routes are kept by the key instead: the worker sends its reports form-typed,
    # as the reference SDK does.
    assert guard.check("done", "POST", typed, 8000) is None

"""The local endpoint's page, driven in a real headless browser (Debian's chromium).

Real worker processes serve the local endpoint (``--rp_serve_api --rp_api_port 0``); the
page is used as a person would: type a request, press a button, watch the status and the
chunks, read the result or the error. Run by ``tox -e browser`` (which installs selenium);
skipped when selenium, chromium or chromedriver is missing.

``TRIO_WORKER_PAGE_SCREENSHOT=docs/local-endpoint.png`` also saves the screenshot the
tutorial shows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("selenium")

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BANNER = "trio_worker local endpoint: "
WAIT = 30.0

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def _browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium-driver)")
    return chromium, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    chromium, driver_path = _browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1200,640")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _serve(script: Path) -> Iterator[str]:
    """Run *script* as a local endpoint on a free port; yield its base URL."""
    # The installed package, as a user's script finds it: no checkout on PYTHONPATH.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for name in [n for n in env if n.startswith("RUNPOD_") or n == "PYTHONPATH"]:
        del env[name]
    args = [sys.executable, str(script), "--rp_serve_api", "--rp_api_host", "127.0.0.1"]
    process = subprocess.Popen(
        [*args, "--rp_api_port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert process.stdout is not None
    found: list[str] = []
    ready = threading.Event()

    def read() -> None:  # also keeps draining the pipe, so the worker never blocks on it
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith(BANNER) and not found:
                found.append(line.removeprefix(BANNER).strip())
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(WAIT) and found, f"{script.name} printed no endpoint URL"
        yield found[0]
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(timeout=5)
        process.stdout.close()


@pytest.fixture(scope="module")
def streaming_endpoint() -> Iterator[str]:
    yield from _serve(HERE / "slow_stream_worker.py")


@pytest.fixture(scope="module")
def failing_endpoint() -> Iterator[str]:
    yield from _serve(HERE / "failing_worker.py")


def _text(driver: webdriver.Chrome, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def _send(driver: webdriver.Chrome, base: str, body: str, button: str) -> None:
    if not driver.current_url.startswith(base):
        driver.get(base + "/")
    box = driver.find_element(By.ID, "body")
    box.clear()
    box.send_keys(body)
    driver.find_element(By.ID, button).click()


def _wait_status(driver: webdriver.Chrome, *statuses: str) -> str:
    WebDriverWait(driver, WAIT, poll_frequency=0.05).until(lambda d: _text(d, "status") in statuses)
    return _text(driver, "status")


def test_a_streaming_job_shows_its_chunks_as_they_come_then_the_result(
    browser: webdriver.Chrome, streaming_endpoint: str
) -> None:
    _send(browser, streaming_endpoint, '{"input": {"words": 5, "pause": 0.4}}', "run")
    WebDriverWait(browser, WAIT, poll_frequency=0.05).until(
        lambda d: _text(d, "chunk-count") not in ("", "0")
    )
    midway = (_text(browser, "status"), int(_text(browser, "chunk-count")))
    assert _wait_status(browser, "COMPLETED", "FAILED") == "COMPLETED"
    chunks = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#chunks li")]
    output = json.loads(_text(browser, "output"))
    assert midway[0] == "IN_PROGRESS" and midway[1] < 5  # watched while it ran
    assert chunks == [f"token-{i}" for i in range(5)]
    assert output == chunks  # return_aggregate_stream
    assert _text(browser, "job-id")
    assert "execution" in _text(browser, "times")
    assert not browser.find_element(By.ID, "error").is_displayed()
    screenshot = os.environ.get("TRIO_WORKER_PAGE_SCREENSHOT")
    if screenshot:
        browser.save_screenshot(screenshot)


def test_runsync_answers_with_the_result_and_the_chunks(
    browser: webdriver.Chrome, streaming_endpoint: str
) -> None:
    _send(browser, streaming_endpoint, '{"input": {"words": 2, "pause": 0.05}}', "runsync")
    assert _wait_status(browser, "COMPLETED", "FAILED") == "COMPLETED"
    WebDriverWait(browser, WAIT).until(lambda d: _text(d, "chunk-count") == "2")
    assert json.loads(_text(browser, "output")) == ["token-0", "token-1"]


def test_a_failed_job_shows_type_category_message_and_logs(
    browser: webdriver.Chrome, failing_endpoint: str
) -> None:
    _send(browser, failing_endpoint, '{"input": {"model": "/models/missing.bin"}}', "run")
    assert _wait_status(browser, "COMPLETED", "FAILED") == "FAILED"
    assert browser.find_element(By.ID, "error").is_displayed()
    assert _text(browser, "error-type") == "FileNotFoundError"
    assert _text(browser, "error-category") == "file_not_found"
    assert "/models/missing.bin" in _text(browser, "error-message")
    assert "loading weights from /models/missing.bin" in _text(browser, "error-logs")
    assert "failing_worker.py" in _text(browser, "error-traceback")
    assert not browser.find_element(By.ID, "result").is_displayed()


def test_a_refused_request_says_why_and_queues_nothing(
    browser: webdriver.Chrome, failing_endpoint: str
) -> None:
    _send(browser, failing_endpoint, '{"input": "not an object"}', "run")
    assert _wait_status(browser, "REFUSED") == "REFUSED"
    assert "400" in _text(browser, "problem")
    assert '"input" must be a JSON object' in _text(browser, "problem")
    _send(browser, failing_endpoint, '{"input": ', "runsync")
    assert _wait_status(browser, "REFUSED") == "REFUSED"
    assert "not valid JSON" in _text(browser, "problem")
    assert _text(browser, "job-id") == ""


def test_the_page_fetches_nothing_from_elsewhere(
    browser: webdriver.Chrome, streaming_endpoint: str
) -> None:
    browser.get(streaming_endpoint + "/docs")
    origin = streaming_endpoint.rstrip("/")
    resources = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert all(str(name).startswith(origin) for name in resources)
    csp = browser.find_element(By.CSS_SELECTOR, "meta[http-equiv='Content-Security-Policy']")
    assert "default-src 'none'" in str(csp.get_attribute("content"))
    schema = json.loads(
        browser.execute_script(
            "const r = await fetch('/openapi.json'); return JSON.stringify(await r.json());"
        )
    )
    assert {"/run", "/runsync", "/status/{id}", "/stream/{id}"} <= set(schema["paths"])


_ELSEWHERE = """<!doctype html><html><head><title>waiting</title></head><body><script>
const target = %s;
const body = JSON.stringify({input: {from: "elsewhere"}, webhook: "http://127.0.0.1:9/x"});
Promise.allSettled([
  fetch(target + "/run", {method: "POST", mode: "no-cors",
                          headers: {"Content-Type": "text/plain"}, body}),
  fetch(target + "/runsync", {method: "POST", mode: "no-cors", body: new Blob([body])}),
  fetch(target + "/purge-queue", {method: "POST", mode: "no-cors"}),
  fetch(target + "/health", {mode: "no-cors"}),
]).then(() => { document.title = "sent"; });
</script></body></html>"""


@pytest.fixture
def page_elsewhere(streaming_endpoint: str) -> Iterator[str]:
    """A page on another origin (another port of 127.0.0.1) that calls the endpoint."""
    page = (_ELSEWHERE % json.dumps(streaming_endpoint)).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _jobs_seen(endpoint: str) -> int:
    with urllib.request.urlopen(endpoint + "/health", timeout=WAIT) as answer:
        counts = json.load(answer)["jobs"]
    return sum(int(counts[key]) for key in ("completed", "failed", "inProgress", "inQueue"))


def test_a_page_from_elsewhere_can_queue_nothing(
    browser: webdriver.Chrome, streaming_endpoint: str, page_elsewhere: str
) -> None:
    # What FastAPI's CVE-2021-32677 allowed: a page sends the endpoint JSON typed
    # text/plain, which needs no preflight, with a webhook of its choosing.
    before = _jobs_seen(streaming_endpoint)
    browser.get(page_elsewhere)
    WebDriverWait(browser, WAIT, poll_frequency=0.05).until(lambda d: d.title == "sent")
    assert _jobs_seen(streaming_endpoint) == before
    # The endpoint's own page, in the same browser, still queues and runs a job.
    _send(browser, streaming_endpoint, '{"input": {"words": 1, "pause": 0}}', "run")
    assert _wait_status(browser, "COMPLETED", "FAILED") == "COMPLETED"
    assert _jobs_seen(streaming_endpoint) == before + 1

"""What a worker imports: nothing a plain http worker with no proxy never uses.

httpx is for a configured proxy (``_platform/_proxy.py``) and the local endpoint's
webhooks only, and asyncio for the asyncio backend only (``_backends.BACKENDS``): together
about 45 ms of ``python -X importtime`` at every start; hypercorn (about 40 ms more) for
a server only, when it starts serving. Each check runs in a fresh
interpreter, since this test process has imported both long before. (``ssl`` is not among
them: trio imports it itself.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .script_worker import run_script_job

REPO = Path(__file__).resolve().parents[1]
WAIT = 30.0  # a safety bound on each wait; never reached when the code is right

# Imported by no worker on the trio backend without a proxy; hypercorn only by a server
# (start_app, the realtime route, the local endpoint), once it serves.
UNUSED = ("httpx", "asyncio", "hypercorn")


def _python(code: str, **env: str) -> list[str]:
    # The installed package, as a user's process imports it: no PYTHONPATH, and not run from
    # the checkout, whose directory ``-c`` would put first on sys.path.
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().endswith("_PROXY") and k != "PYTHONPATH"
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env},
        cwd=REPO / "docs",
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


# The package, and the local endpoint (``trio-worker dev``, ``--rp_serve_api``), which
# imports httpx only once a job names a webhook.
@pytest.mark.parametrize("module", ["trio_worker", "trio_worker._endpoint"])
def test_importing_leaves_httpx_and_asyncio_out(module: str) -> None:
    code = (
        f"import json, sys, {module}\n"
        f"print(json.dumps([m for m in {(*UNUSED, module)!r} if m in sys.modules]))\n"
    )
    assert _python(code) == [module]


def test_the_package_alone_imports_no_sdk_until_a_public_name_is_used() -> None:
    """The launcher (``python -m trio_worker``) and the crash watchdog import the package
    and stay small: trio and the SDK load at the first public name a worker uses."""
    code = (
        "import json, sys, trio_worker\n"
        "before = [m for m in ('trio', 'trio_worker._start') if m in sys.modules]\n"
        "trio_worker.start\n"
        "after = [m for m in ('trio', 'trio_worker._start') if m in sys.modules]\n"
        "print(json.dumps([before, after, trio_worker.Timings.__module__]))\n"
    )
    assert _python(code) == [[], ["trio", "trio_worker._start"], "trio_worker"]


def test_a_proxy_still_gets_the_httpx_client_and_only_for_a_proxied_origin() -> None:
    code = (
        "import json, sys\n"
        "from trio_worker._platform._http import make_backend\n"
        "backend = make_backend({})\n"
        "seen = [type(backend).__name__]\n"
        "for url in ('https://direct.test/x', 'https://platform.test/x'):\n"
        "    if hasattr(backend, 'route'):\n"
        "        seen.append(type(backend.route(url)).__name__)\n"
        "    seen.append('httpx' in sys.modules)\n"
        "print(json.dumps(seen))\n"
    )
    behind_a_proxy = _python(code, HTTPS_PROXY="http://proxy.test:3128", NO_PROXY="direct.test")
    assert behind_a_proxy == ["ProxyRoutes", "HttpPool", False, "HttpxHttp", True]
    assert _python(code) == ["HttpPool", False, False]


# A production worker (trio_worker.start, the trio backend for a sync handler) reports, as
# its first job's output, which of UNUSED it has imported by then.
WORKER = f"""
import sys, trio_worker

def handler(job):
    return {{"loaded": [m for m in {UNUSED!r} if m in sys.modules]}}

trio_worker.start(handler)
"""


@pytest.mark.slow
async def test_a_started_worker_runs_its_first_job_without_httpx_or_asyncio(
    tmp_path: Path,
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    record, _ = await run_script_job(script, {})
    assert (record.status, record.output) == ("COMPLETED", {"loaded": []})

"""Proxies: one reading of the variables for every connection, SOCKS, and a proxy's 407.

The rules are ``trio_worker._proxies``'s (docs/reference.md, "Proxies"); the worker goes
through real proxies on loopback (``tests/proxy_servers.py``) to a fake platform whose
URL names a host only the proxy can reach.
"""

from __future__ import annotations

import functools
import logging
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING, Any

import pytest
import trio

import trio_worker
import trio_worker.testing
from trio_worker import ConfigurationError, Timings
from trio_worker._config import platform_from_env
from trio_worker._fitness._reach import dial_target
from trio_worker._platform._client import PlatformClient
from trio_worker._platform._heartbeat import HeartbeatThread
from trio_worker._platform._http import HttpPool
from trio_worker._platform._proxy import HttpxHttp, ProxyRoutes
from trio_worker._proxies import check_proxies, proxy_for
from trio_worker.testing import FakePlatform, run_platform_server

from .proxy_servers import ForwardedRequest, ForwardProxy, Socks5Proxy, serving

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.timeout(30)

PLATFORM = "https://api.runpod.ai/v2/ep/job-take/w"


def shown(url: str, environ: dict[str, str]) -> str | None:
    proxy = proxy_for(url, environ)
    return None if proxy is None else proxy.shown


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"HTTPS_PROXY": "http://p:1"}, "http://p:1"),
        ({"HTTP_PROXY": "http://p:1"}, None),  # the scheme's own variable
        ({"ALL_PROXY": "socks5://p:1"}, "socks5://p:1"),
        ({"ALL_PROXY": "http://all:1", "HTTPS_PROXY": "http://own:1"}, "http://own:1"),
        ({"HTTPS_PROXY": "http://upper:1", "https_proxy": "http://lower:1"}, "http://lower:1"),
        ({"HTTPS_PROXY": "", "ALL_PROXY": "http://all:1"}, "http://all:1"),
        ({"HTTPS_PROXY": "p:3128"}, "http://p:3128"),
        ({"HTTPS_PROXY": "http://user:secret@p:1"}, "http://***@p:1"),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "api.runpod.ai"}, None),
        ({"HTTPS_PROXY": "http://p:1", "no_proxy": "runpod.ai"}, None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".runpod.ai"}, None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*.runpod.ai"}, None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "x.org api.runpod.ai"}, None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "api.runpod.ai:443"}, None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*"}, None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "pod.ai"}, "http://p:1"),  # not a suffix
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "api.runpod.ai:8443"}, "http://p:1"),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "runpod.ai.evil"}, "http://p:1"),
    ],
)
def test_which_proxy_a_platform_url_goes_through(
    environ: dict[str, str], expected: str | None
) -> None:
    assert shown(PLATFORM, environ) == expected


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/x",
        "http://127.9.9.9/x",
        "http://[::1]:8000/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://localhost:8000/x",
        "http://LOCALHOST./x",
        "http://api.localhost/x",
    ],
)
def test_loopback_never_goes_through_a_proxy(url: str) -> None:
    everything = {"HTTP_PROXY": "http://p:1", "ALL_PROXY": "http://p:1", "NO_PROXY": ""}
    assert proxy_for(url, everything) is None


@pytest.mark.parametrize(
    ("host", "no_proxy", "direct"),
    [
        ("10.1.2.3", "10.0.0.0/8", True),
        ("10.1.2.3", "10.1.2.3", True),
        ("11.1.2.3", "10.0.0.0/8", False),
        ("[fd00::5]", "fd00::/8", True),
        ("[fd00::5]", "[fd00::5]:80", True),
        ("10.1.2.3", "example.com", False),
        ("example.com", "10.0.0.0/8", False),
    ],
)
def test_no_proxy_matches_addresses_and_blocks(host: str, no_proxy: str, direct: bool) -> None:
    environ = {"HTTP_PROXY": "http://p:1", "NO_PROXY": no_proxy}
    assert (proxy_for(f"http://{host}/x", environ) is None) is direct


@pytest.mark.parametrize("value", ["http://", "http://:3128", "http://p:port", "http://p:99999"])
def test_a_proxy_value_that_is_no_url_is_a_configuration_error(value: str) -> None:
    with pytest.raises(ConfigurationError, match="HTTPS_PROXY is not a proxy URL"):
        proxy_for(PLATFORM, {"HTTPS_PROXY": value})


def test_a_socks_proxy_without_the_extra_is_refused_with_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "socksio", None)  # as if it were not installed
    with pytest.raises(ConfigurationError) as caught:
        check_proxies([PLATFORM], {"ALL_PROXY": "socks5://user:secret@p:1080"})
    message = str(caught.value)
    assert message == (
        "ALL_PROXY is a SOCKS proxy (socks5://***@p:1080), which needs the socks extra: "
        "pip install 'trio_worker[socks]'"
    )
    # A SOCKS proxy the platform does not go through is none of the worker's business.
    check_proxies([PLATFORM], {"ALL_PROXY": "socks5://p:1080", "NO_PROXY": "runpod.ai"})


def test_with_the_extra_a_socks_proxy_is_accepted() -> None:
    pytest.importorskip("socksio")
    check_proxies([PLATFORM], {"ALL_PROXY": "socks5h://p:1080"})


def test_an_unsupported_proxy_scheme_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match=r"a socks4:// proxy \(socks4://\*\*\*@p:1\)"):
        check_proxies([PLATFORM], {"HTTPS_PROXY": "socks4://u:pw@p:1"})


def test_serve_refuses_a_proxy_it_cannot_use_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "socksio", None)
    environ = {**FakePlatform().worker_env("http://platform.test"), "ALL_PROXY": "socks5://p:1"}

    async def main() -> None:
        await trio_worker.serve(lambda job: "ok", environ=environ, handle_signals=False)

    with pytest.raises(ConfigurationError, match=r"pip install 'trio_worker\[socks\]'"):
        trio.run(main)


WORKER_WITHOUT_SOCKSIO = """
import sys
sys.modules["socksio"] = None  # as in an image installed without the socks extra
import trio_worker
trio_worker.start(lambda job: "ok", crash_watch=False)
"""


def test_start_says_what_to_install_in_one_line_without_a_traceback(tmp_path: Path) -> None:
    # It was httpx's ImportError traceback and exit 1 on every start.
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER_WITHOUT_SOCKSIO))
    environ = {
        **FakePlatform().worker_env("http://platform.test"),
        "ALL_PROXY": "socks5://user:hunter22@127.0.0.1:1",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, str(script)], env=environ, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "hunter22" not in done.stderr + done.stdout
    [line] = [line for line in done.stderr.splitlines() if "socks" in line.lower()]
    assert line.endswith(
        "configuration error: ALL_PROXY is a SOCKS proxy (socks5://***@127.0.0.1:1), which "
        "needs the socks extra: pip install 'trio_worker[socks]'"
    )


# -- through real proxies ----------------------------------------------------------------

FAST = Timings(error_backoff_min=0.01, error_backoff_max=0.05, report_backoff_max=0.05)


async def run_one_job(
    platform: FakePlatform, url: str, proxies: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Any:
    """One job through a worker whose platform is *url*, with *proxies* set (also in the
    process's environment, where the reference, and main's httpx, read them)."""
    for name, value in proxies.items():
        monkeypatch.setenv(name, value)
    environ = {**platform.worker_env(url), **proxies}
    async with trio.open_nursery() as nursery:
        await nursery.start(
            functools.partial(
                trio_worker.testing.serve,
                lambda job: {"echo": job["input"]},
                environ=environ,
                timings=FAST,
                heartbeat="off",
                handle_signals=False,
                capture_logs="off",
            )
        )
        job_id = platform.enqueue({"n": 1})
        with trio.fail_after(20):
            record = await platform.wait_for_status(job_id, "COMPLETED")
        nursery.cancel_scope.cancel()
    return record


def proxied_url(base: str) -> str:
    # Not loopback (never proxied), and a name only the proxy resolves.
    return base.replace("127.0.0.1", "platform.test")


async def test_a_proxys_407_on_an_http_platform_is_retried_and_explained_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trio_worker")
    refusals = iter([True, True, True])

    def refuse(request: ForwardedRequest) -> bool:
        return "/job-done/" in request.target and next(refusals, False)

    proxy = ForwardProxy(refuse=refuse)
    platform = FakePlatform(take_hold=0.2)
    async with run_platform_server(platform) as base, serving(proxy) as address:
        proxies = {"HTTP_PROXY": f"http://user:hunter22@{address}"}
        record = await run_one_job(platform, proxied_url(base), proxies, monkeypatch)
    assert record.output == {"echo": {"n": 1}}
    assert proxy.refused == 3
    explained = [m for m in caplog.messages if "put its user name and password" in m]
    assert len(explained) == 1
    assert explained[0].startswith(
        f"the proxy http://***@{address} (from HTTP_PROXY) answered 407 Proxy Authentication "
        "Required: put its user name and password in HTTP_PROXY"
    )
    assert "RESULT LOST" not in caplog.text
    assert "hunter22" not in caplog.text
    # The credentials went to the proxy, as Proxy-Authorization, and nowhere else.
    assert all(request.proxy_authorization for request in proxy.requests)


async def test_a_loopback_platform_never_goes_through_the_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The local endpoint's embedded worker, or a sidecar: this machine, which a proxy
    # cannot reach on the worker's behalf, whatever NO_PROXY forgot to list.
    proxy = ForwardProxy(refuse=lambda request: True)  # a proxy that would refuse all
    platform = FakePlatform(take_hold=0.2)
    async with run_platform_server(platform) as base, serving(proxy) as address:
        url = base.replace("127.0.0.1", "localhost")
        proxies = {"HTTP_PROXY": f"http://{address}", "ALL_PROXY": f"http://{address}"}
        record = await run_one_job(platform, url, proxies, monkeypatch)
    assert record.output == {"echo": {"n": 1}}
    assert proxy.requests == []


async def test_every_client_of_the_worker_follows_no_proxy_for_the_platform() -> None:
    environ = {
        **FakePlatform().worker_env("https://api.runpod.ai"),
        "RUNPOD_WEBHOOK_PING": "https://api.runpod.ai/v2/ep/ping/$RUNPOD_POD_ID",
        "HTTPS_PROXY": "http://dead.proxy:1",
        "NO_PROXY": "runpod.ai",
    }
    platform = platform_from_env(environ)
    client = PlatformClient(platform, Timings())
    pinger = HeartbeatThread(platform.ping_url or "", "key", 1.0, tuple, proxies=platform.proxies)
    backends = [client.polls, client._reports, pinger.make_backend()]
    try:
        for backend in backends:
            assert isinstance(backend, ProxyRoutes)
            for url in (*platform.urls, "https://api.runpod.ai/v2/ep/job-done/w/j"):
                assert isinstance(backend.route(url), HttpPool), url
            assert isinstance(backend.route("https://huggingface.co/x"), HttpxHttp)
    finally:
        await client.aclose()
        await backends[-1].aclose()
    assert dial_target(platform) == ("api.runpod.ai", 443, True)


async def test_a_job_goes_through_a_socks5_proxy_with_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("socksio")
    proxy = Socks5Proxy()
    platform = FakePlatform(take_hold=0.2)
    async with run_platform_server(platform) as base, serving(proxy) as address:
        proxies = {"ALL_PROXY": f"socks5h://{address}"}
        record = await run_one_job(platform, proxied_url(base), proxies, monkeypatch)
    assert record.output == {"echo": {"n": 1}}
    assert "platform.test" in proxy.hosts

"""Local modes (docs/design.md §10) and start()'s argument handling, through real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
WORKER_APP = REPO / "tests" / "integration" / "worker_app.py"
ECHO = REPO / "examples" / "echo_worker.py"
STREAMING = REPO / "examples" / "streaming_worker.py"
VLLM_STYLE = REPO / "examples" / "vllm_style_worker.py"


def run(
    script: Path, *args: str, cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    # The installed package, as a user runs it: no PYTHONPATH.
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "TW_", "PYTHONPATH"))
    }
    clean.update(env)
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean,
        cwd=cwd or REPO,
        check=False,
    )


def last_json(stdout: str) -> dict[str, object]:
    line = stdout.strip().splitlines()[-1]
    value = json.loads(line)
    assert isinstance(value, dict)
    return value


def test_test_input_runs_initializer_then_handler() -> None:
    done = run(ECHO, "--test_input", '{"input": {"prompt": "hello"}}')
    assert done.returncode == 0, done.stderr
    assert last_json(done.stdout) == {
        "output": {"text": "hello from the model: hello", "length": 5}
    }


def test_test_input_json_file_is_used_when_no_flag(tmp_path: Path) -> None:
    (tmp_path / "test_input.json").write_text('{"input": {"prompt": "from file"}}')
    done = run(ECHO, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert last_json(done.stdout)["output"] == {
        "text": "hello from the model: from file",
        "length": 9,
    }


def test_no_test_input_and_no_platform_fails_with_a_clear_message(tmp_path: Path) -> None:
    done = run(ECHO, cwd=tmp_path)
    assert done.returncode == 1
    assert "test_input" in done.stderr


def test_bad_test_input_json_fails_naming_the_flag() -> None:
    done = run(ECHO, "--test_input", "{not json")
    assert done.returncode == 2
    assert done.stderr == (
        "echo_worker.py: error: --test_input must be JSON: Expecting property name enclosed"
        " in double quotes: line 1 column 2 (char 1)\n"
    )


def test_generator_is_iterated_and_chunks_printed() -> None:
    done = run(STREAMING, "--test_input", '{"input": {"words": 3}}')
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert lines[:3] == [{"stream": f"token-{i}"} for i in range(3)]
    assert lines[3] == {"output": ["token-0", "token-1", "token-2"]}


def test_handler_error_exits_1_with_the_error_payload() -> None:
    done = run(WORKER_APP, "--test_input", '{"input": 7}', TW_HANDLER="raises")
    assert done.returncode == 1
    error = json.loads(str(last_json(done.stdout)["error"]))
    assert error["error_type"] == "ValueError"
    assert "child stderr local_test" in error["logs"]


def test_init_failure_in_local_mode_exits_1_with_init_failed() -> None:
    done = run(WORKER_APP, "--test_input", '{"input": 1}', TW_INIT="oom", TW_INIT_SECONDS="0")
    assert done.returncode == 1
    error = json.loads(str(last_json(done.stdout)["error"]))
    assert error["event"] == "init_failed"
    assert error["error_category"] == "out_of_memory"


def test_init_timeout_in_local_mode() -> None:
    done = run(WORKER_APP, "--test_input", '{"input": 1}', TW_INIT="hang", TW_INIT_TIMEOUT="0.2")
    assert done.returncode == 1
    error = json.loads(str(last_json(done.stdout)["error"]))
    assert error["error_type"] == "InitTimeout"
    assert error["error_category"] == "timeout"


ASYNCIO_ENGINE = (
    "import asyncio, trio_worker\n"
    "engine = {}\n"
    "async def init():\n"
    "    engine['loop'] = asyncio.get_running_loop()\n"
    "async def h(job):\n"
    "    await asyncio.sleep(0)\n"
    "    return {'same_loop': asyncio.get_running_loop() is engine['loop'],\n"
    "            'got': job['input']}\n"
)


def test_async_backend_asyncio_runs_asyncio_code_in_local_mode(tmp_path: Path) -> None:
    script = tmp_path / "w.py"
    script.write_text(
        ASYNCIO_ENGINE + "trio_worker.start(h, initializer=init, async_backend='asyncio')\n"
    )
    done = run(script, "--test_input", '{"input": 1}')
    assert done.returncode == 0, done.stderr
    assert last_json(done.stdout) == {"output": {"same_loop": True, "got": 1}}


def test_both_forms_run_async_code_on_asyncio_unless_told_trio(tmp_path: Path) -> None:
    script = tmp_path / "w.py"
    for start in (
        "trio_worker.start({'handler': h, 'initializer': init})",
        "trio_worker.start(h, initializer=init)",
    ):
        script.write_text(ASYNCIO_ENGINE + start + "\n")
        done = run(script, "--test_input", '{"input": 2}')
        assert done.returncode == 0, done.stderr
        assert last_json(done.stdout) == {"output": {"same_loop": True, "got": 2}}
    script.write_text(ASYNCIO_ENGINE + "trio_worker.start(h, async_backend='trio')\n")
    done = run(script, "--test_input", '{"input": 2}')
    assert done.returncode == 1
    error = json.loads(str(last_json(done.stdout)["error"]))
    assert error["error_type"] == "trio_worker.AsyncioUnderTrio"
    assert 'async_backend="asyncio"' in error["error_message"]


def test_asyncio_code_under_trio_names_the_option() -> None:
    done = run(WORKER_APP, "--test_input", '{"input": 1}', TW_HANDLER="async_uses_asyncio")
    assert done.returncode == 1
    error = json.loads(str(last_json(done.stdout)["error"]))
    assert "async_backend" in error["error_message"]


def test_the_vllm_style_example_streams_tokens_from_its_asyncio_engine() -> None:
    done = run(VLLM_STYLE, "--test_input", '{"input": {"prompt": "hi", "tokens": 3}}')
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert lines == [
        {"stream": "hi-0"},
        {"stream": "hi-1"},
        {"stream": "hi-2"},
        {"output": ["hi-0", "hi-1", "hi-2"]},
    ]


def test_reference_one_dict_form(tmp_path: Path) -> None:
    script = tmp_path / "w.py"
    script.write_text(
        "import trio_worker\n"
        "def h(job): return {'got': job['input']}\n"
        "trio_worker.start({'handler': h, 'concurrency_modifier': lambda c: 2})\n"
    )
    done = run(script, "--test_input", '{"input": 5}')
    assert done.returncode == 0, done.stderr
    assert last_json(done.stdout) == {"output": {"got": 5}}


def test_local_endpoint_serves_the_endpoint_api_with_a_real_worker(tmp_path: Path) -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "TW_", "PYTHONPATH"))
    }
    # The command the install puts beside this interpreter, as a user types it.
    trio_worker_command = str(Path(sys.executable).with_name("trio-worker"))
    process = subprocess.Popen(
        [trio_worker_command, "dev", str(ECHO), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        assert "local endpoint" in banner, banner
        base = banner.strip().rsplit(" ", 1)[-1]
        with httpx.Client(base_url=base, timeout=20) as client:
            result = client.post("/runsync", json={"input": {"prompt": "hi"}}).json()
            assert result["status"] == "COMPLETED"
            assert result["output"] == {"text": "hello from the model: hi", "length": 2}
            queued = client.post("/run", json={"input": {"prompt": "later"}}).json()
            deadline = time.monotonic() + 20
            status = client.get(f"/status/{queued['id']}").json()
            while status["status"] != "COMPLETED" and time.monotonic() < deadline:
                status = client.get(f"/status/{queued['id']}?wait=1000").json()
            assert status["output"]["length"] == 5
            assert client.get("/health").json()["jobs"]["completed"] == 2
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


@pytest.mark.parametrize("flag", ["--rp_log_level", "RUNPOD_LOG_LEVEL"])
def test_bad_log_level_names_its_source(flag: str) -> None:
    if flag.startswith("--"):
        done = run(ECHO, "--test_input", '{"input": {}}', flag, "LOUD")
    else:
        done = run(ECHO, "--test_input", '{"input": {}}', RUNPOD_LOG_LEVEL="LOUD")
    assert done.returncode == 1
    assert flag in done.stderr


# --- one job path: local mode fails where the platform would ------------------------------


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "w.py"
    path.write_text("import os\nimport trio_worker\n" + body)
    return path


def test_a_non_json_chunk_fails_locally_as_on_the_platform(tmp_path: Path) -> None:
    worker = script(
        tmp_path,
        "def h(job):\n    yield 'fine'\n    yield {1, 2}\ntrio_worker.start(h)\n",
    )
    done = run(worker, "--test_input", '{"input": 1}')
    assert done.returncode == 1, done.stdout
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert lines[0] == {"stream": "fine"}
    error = json.loads(str(lines[-1]["error"]))
    assert error["error_type"] == "OutputNotSerializable"


def test_an_error_chunk_is_redacted_locally_as_on_the_platform(tmp_path: Path) -> None:
    from trio_worker._capture._redact import REDACTED

    secret = "sk-local-0123456789abcdef"
    # capture_logs="off": nothing but the job runner stands between the chunk and stdout.
    worker = script(
        tmp_path,
        "def h(job):\n"
        "    yield {'error': 'bad key ' + os.environ['RUNPOD_AI_API_KEY']}\n"
        "trio_worker.start(h, capture_logs='off')\n",
    )
    done = run(worker, "--test_input", '{"input": 1}', RUNPOD_AI_API_KEY=secret)
    assert done.returncode == 1
    assert secret not in done.stdout
    assert last_json(done.stdout) == {"error": f"bad key {REDACTED}"}


def test_refresh_worker_marks_the_local_result_as_the_platform_sees_it(tmp_path: Path) -> None:
    worker = script(tmp_path, "trio_worker.start(lambda job: 1, refresh_worker=True)\n")
    done = run(worker, "--test_input", '{"input": 1}')
    assert done.returncode == 0, done.stderr
    assert last_json(done.stdout) == {"output": 1, "stopPod": True}


def test_start_rejects_bad_arguments_in_local_mode_too(tmp_path: Path) -> None:
    worker = script(tmp_path, "trio_worker.start(lambda job: 1, concurrency=0)\n")
    done = run(worker, "--test_input", '{"input": 1}')
    assert done.returncode == 1
    assert "concurrency" in done.stderr

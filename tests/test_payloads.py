"""``_payloads``: every body the worker posts for a job, in the reference's shapes
(docs/protocol.md §3), encoded by one policy (§3.8), each error redacted (docs/design.md §8)
and built by one builder from a :class:`JobError`."""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from trio_worker._capture._redact import REDACTED, Redactor
from trio_worker._payloads import (
    MAX_ERROR_BODY_BYTES,
    JobError,
    Payloads,
    ResultEncodingError,
    WorkerIdentity,
    chunk_body,
    encode_body,
    notice,
    progress_body,
    result_body,
)

IDENTITY = WorkerIdentity(worker_id="w-123", hostname="gpu-host-7", sdk_version="0.1.0")
NO_SECRETS = Redactor([])
SECRET = "hf_SuperSecretToken0123456789"
REDACTOR = Redactor([SECRET])
HANDLER_KEYS = [
    "error_type",
    "error_message",
    "error_traceback",
    "error_category",
    "hostname",
    "worker_id",
    "sdk_version",
    "runpod_version",
    "logs",
]


def raised(exc: BaseException) -> BaseException:
    """*exc* with a real traceback."""
    try:
        raise exc
    except BaseException as caught:
        return caught
    raise AssertionError("unreachable")


def error_of(error: JobError, redactor: Redactor = NO_SECRETS, **kwargs: Any) -> bytes:
    return Payloads(IDENTITY, redactor).error(error, **kwargs)


def inner_of(data: bytes) -> dict[str, Any]:
    """Parse a body as the platform does: the bytes, then the error string's JSON."""
    outer = json.loads(data)
    assert isinstance(outer["error"], str)
    inner = json.loads(outer["error"])
    assert isinstance(inner, dict)
    return inner


def error_for(body: dict[str, Any], **kwargs: Any) -> ResultEncodingError:
    with pytest.raises(ResultEncodingError) as info:
        encode_body(body, **kwargs)
    return info.value


# --- results: the reference's shapes --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"error": "x", "a": 1}, {"output": {"a": 1}, "error": "x"}),
        ({}, {}),
        ({"refresh_worker": True}, {"stopPod": True}),
        ({"a": 1}, {"output": {"a": 1}}),
        ({"error": "", "a": 1}, {"output": {"a": 1}}),
        ({"error": None}, {}),
        ({"error": {"code": 7, "detail": ["x"]}}, {"error": {"code": 7, "detail": ["x"]}}),
        ({"refresh_worker": False, "a": 1}, {"output": {"a": 1}}),
        (None, {"output": None}),
        (False, {"output": False}),
        (0, {"output": 0}),
        ("text", {"output": "text"}),
        ([1, 2], {"output": [1, 2]}),
        ([], {"output": []}),
    ],
)
def test_result_body_shapes(value: object, expected: dict[str, Any]) -> None:
    assert result_body(value, NO_SECRETS) == expected
    assert Payloads(IDENTITY, NO_SECRETS).result(value) == expected


@pytest.mark.parametrize(
    "value", [{"error": "boom"}, {"a": 1}, {}, None, [1], {"refresh_worker": 1}]
)
def test_stop_pod_marks_any_result(value: object) -> None:
    body = Payloads(IDENTITY, NO_SECRETS, stop_pod=True).result(value)
    assert body["stopPod"] is True
    assert list(body)[-1] == "stopPod"


def test_the_users_dict_is_not_mutated() -> None:
    """Unlike the reference, which pops the keys from the returned dict itself."""
    cached = {"error": "x", "refresh_worker": True, "a": 1}
    body = result_body(cached, NO_SECRETS)
    assert body == {"output": {"a": 1}, "error": "x", "stopPod": True}
    assert cached == {"error": "x", "refresh_worker": True, "a": 1}


def test_no_copy_without_special_keys() -> None:
    value = {"a": 1}
    assert result_body(value, NO_SECRETS)["output"] is value


def test_ambiguous_truthiness_counts_as_present() -> None:
    class ArrayLike:
        def __bool__(self) -> bool:
            raise ValueError("The truth value of an array with more than one element is ambiguous")

    error = ArrayLike()
    assert result_body({"error": error}, NO_SECRETS) == {"error": error}


def test_stream_final_body() -> None:
    chunks: list[object] = [1, {"t": "a"}]
    payloads = Payloads(IDENTITY, NO_SECRETS)
    assert payloads.stream_final(chunks) == {"output": [1, {"t": "a"}]}
    assert payloads.stream_final(None) == {"output": []}
    assert payloads.stream_final([]) == {"output": []}
    aggregated = payloads.stream_final(chunks)["output"]
    assert aggregated is not chunks  # later appends by the caller do not change the body
    assert payloads.stream_final(None, [4, 1]) == {
        "output": [],
        "undelivered_chunk_count": 2,
        "undelivered_chunks": [4, 1],
    }
    lost = list(range(1500))
    final = Payloads(IDENTITY, NO_SECRETS, stop_pod=True).stream_final(None, lost)
    assert final["undelivered_chunk_count"] == 1500
    assert final["undelivered_chunks"] == lost[:1000]
    assert final["stopPod"] is True


# --- a returned error is redacted; the output is not -------------------------------------------


def test_a_returned_error_string_is_redacted() -> None:
    body = result_body({"error": f"login failed with {SECRET!r}"}, REDACTOR)
    assert body == {"error": f"login failed with '{REDACTED}'"}


def test_a_returned_error_object_is_redacted_everywhere_keys_included() -> None:
    error = {"code": 7, SECRET: [f"a {SECRET}", (SECRET, 1.5), None, {"n": SECRET}], "ok": True}
    body = result_body({"error": error}, REDACTOR)
    assert body == {
        "error": {
            "code": 7,
            REDACTED: [f"a {REDACTED}", [REDACTED, 1.5], None, {"n": REDACTED}],
            "ok": True,
        }
    }
    assert SECRET.encode() not in encode_body(body)


def test_the_returned_error_object_is_not_mutated() -> None:
    error = {"detail": [SECRET]}
    result_body({"error": error}, REDACTOR)
    assert error == {"detail": [SECRET]}


def test_the_output_is_the_users_data_and_is_not_redacted() -> None:
    """Outputs are not redacted: a result may legitimately contain anything (docs/design.md §8)."""
    body = result_body({"error": SECRET, "echo": SECRET}, REDACTOR)
    assert body == {"output": {"echo": SECRET}, "error": REDACTED}
    assert result_body(SECRET, REDACTOR) == {"output": SECRET}


def test_a_cyclic_error_object_stays_cyclic_and_is_refused_without_leaking() -> None:
    error: list[object] = [SECRET]
    error.append(error)
    body = result_body({"error": error}, REDACTOR)
    copy = body["error"]
    assert copy[0] == REDACTED
    assert copy[1] is copy
    err = error_for(body)
    assert err.error_type == "OutputNotSerializable"
    assert SECRET not in str(err)


def test_a_deep_error_object_is_redacted_without_recursion() -> None:
    error: list[object] = []
    inner = error
    for _ in range(50_000):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    inner.append(SECRET)
    copy = result_body({"error": error}, REDACTOR)["error"]
    for _ in range(50_000):
        copy = copy[0]
    assert copy == [REDACTED]


def test_values_json_cannot_hold_are_left_for_encode_body_to_refuse() -> None:
    body = result_body({"error": {"when": datetime.date(2024, 1, 2), "b": b"x"}}, REDACTOR)
    assert body["error"] == {"when": datetime.date(2024, 1, 2), "b": b"x"}
    assert error_for(body).error_type == "OutputNotSerializable"


# --- the one encoding policy ----------------------------------------------------------------------


def test_encode_body_is_utf8_json() -> None:
    body = {"output": {"text": "héllo 画像", "n": [1, 2.5, True, None]}}
    data = encode_body(body)
    assert data == json.dumps(body, ensure_ascii=False).encode()
    assert json.loads(data) == body
    assert encode_body({"error": "é"}) == '{"error": "é"}'.encode()


def test_tuples_and_subclasses_encode_as_json_does() -> None:
    class Tag(str):
        pass

    data = encode_body({"output": {"pair": (1, 2), "tag": Tag("x"), 3: "int key"}})
    assert json.loads(data) == {"output": {"pair": [1, 2], "tag": "x", "3": "int key"}}


def test_happy_path_walks_the_value_once() -> None:
    class CountingDict(dict[str, Any]):
        items_calls = 0

        def items(self) -> Any:
            CountingDict.items_calls += 1
            return super().items()

    value = CountingDict(a=1, b=[1, 2, 3])
    encode_body(result_body(value, NO_SECRETS))
    assert CountingDict.items_calls == 1


def test_lone_surrogates_are_sent_escaped() -> None:
    data = encode_body({"output": "bad \ud800 byte"})
    data.decode("utf-8")  # valid UTF-8 on the wire
    assert json.loads(data) == {"output": "bad \ud800 byte"}


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused_by_every_body(number: float) -> None:
    """One policy (docs/protocol.md §3.8): NaN is not JSON, and the platform refuses it."""
    encodings: list[Callable[[], bytes]] = [
        lambda: encode_body({"output": {"loss": number}}),
        lambda: chunk_body([1, number]),
        lambda: progress_body({"eta": number}),
        lambda: encode_body(Payloads(IDENTITY, NO_SECRETS).result({"error": number})),
    ]
    for encode in encodings:
        with pytest.raises(ResultEncodingError, match="NaN and Infinity"):
            encode()


def test_the_sdks_own_numbers_are_made_finite() -> None:
    error = JobError("InitTimeout", "late", shape="init", elapsed=math.nan, init_timeout=math.inf)
    data = error_of(error)
    assert b"NaN" not in data
    assert b"Infinity" not in data
    inner = inner_of(data)
    assert (inner["elapsed_s"], inner["init_timeout"]) == (None, None)


def test_chunk_and_progress_bodies() -> None:
    assert json.loads(chunk_body({"token": "é"})) == {"output": {"token": "é"}}
    assert json.loads(progress_body(0.5)) == {"status": "IN_PROGRESS", "output": 0.5}


# --- error bodies: one builder, the reference's shapes --------------------------------------------


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


def test_unprintable_exception_still_reports() -> None:
    inner = inner_of(error_of(JobError.raised(raised(Unprintable()))))
    assert inner["error_message"] == "<Unprintable: str() failed>"
    assert "Unprintable" in inner["error_traceback"]


def test_handler_error_body_shape() -> None:
    exc = raised(ValueError("prompt must be a string"))
    data = error_of(JobError.raised(exc, logs="loading...\nfailed\n"))
    assert list(json.loads(data)) == ["error"]
    inner = inner_of(data)
    assert list(inner) == HANDLER_KEYS
    assert inner["error_type"] == "ValueError"
    assert inner["error_message"] == "prompt must be a string"
    assert inner["error_traceback"].startswith("Traceback (most recent call last):")
    assert inner["error_traceback"].rstrip().endswith("ValueError: prompt must be a string")
    assert inner["error_category"] == "unknown"
    assert inner["hostname"] == "gpu-host-7"
    assert inner["worker_id"] == "w-123"
    assert inner["sdk_version"] == inner["runpod_version"] == "0.1.0"
    assert inner["logs"] == "loading...\nfailed\n"


def test_handler_error_body_keeps_empty_logs_key() -> None:
    assert inner_of(error_of(JobError.raised(raised(ValueError("x")))))["logs"] == ""


def test_non_ascii_stays_readable_and_the_body_is_utf8() -> None:
    error = JobError.raised(raised(ValueError("画像が大きすぎます")), logs="température élevée")
    data = error_of(error)
    assert "画像が大きすぎます".encode() in data
    assert inner_of(data)["logs"] == "température élevée"


def test_every_text_field_is_redacted() -> None:
    identity = WorkerIdentity(worker_id=f"w-{SECRET}", hostname=SECRET, sdk_version="0.1.0")
    exc = raised(RuntimeError(f"auth failed with token {SECRET}"))
    error = JobError.raised(exc, logs=f"export HF_TOKEN={SECRET}\n", category=SECRET)
    data = Payloads(identity, REDACTOR).error(error)
    assert SECRET.encode() not in data
    inner = inner_of(data)
    assert inner["error_message"] == f"auth failed with token {REDACTED}"
    assert REDACTED in inner["error_traceback"]
    assert inner["logs"] == f"export HF_TOKEN={REDACTED}\n"
    assert inner["hostname"] == REDACTED


ESCAPED_SECRET = 'db-"pa\\ss\nwörd'


def _forms_of(secret: str) -> list[str]:
    import urllib.parse

    return [
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret)[1:-1],
        ascii(secret)[1:-1],
        urllib.parse.quote(secret, safe=""),
    ]


@pytest.mark.parametrize("shown", _forms_of(ESCAPED_SECRET))
def test_escaped_forms_and_url_passwords_never_reach_any_error_body(shown: str) -> None:
    """The message, traceback and logs may hold a secret already escaped (a repr, a JSON log
    line, a URL); the body escapes it again, twice for the handler shape. None survives."""
    redactor = Redactor([ESCAPED_SECRET])
    text = f"connect(password={shown}) to postgres://app:url-pw-4242@db/x failed"
    exc = raised(RuntimeError(text))
    handler = JobError.raised(exc, logs=text)
    errors = [
        handler,
        JobError.raised(exc, logs=text, shape="stream"),
        JobError("RuntimeError", text, handler.traceback, logs=text, shape="init", elapsed=1.0),
        JobError("error chunk", text, shape="chunk"),
        notice("WorkerCrashed", logs=text, job_id="j", how="exited", where="here"),
    ]
    for error in errors:
        data = error_of(error, redactor).decode()
        # Decode the body back to the texts it carries, then look for every form there.
        texts = [data, json.loads(data)["error"]]
        try:
            texts += [str(v) for v in json.loads(texts[1]).values()]
        except ValueError:
            pass  # the generator and chunk shapes are plain text
        for carried in texts:
            assert "url-pw-4242" not in carried
            for form in _forms_of(ESCAPED_SECRET):
                assert form not in carried
        assert REDACTED in texts[1]


def test_generator_error_body_reference_shape() -> None:
    exc = raised(ValueError("bad chunk"))
    data = error_of(JobError.raised(exc, logs="step 1\nstep 2\n", shape="stream"))
    body = json.loads(data)
    assert list(body) == ["error"]
    error = body["error"]
    assert error.startswith("handler: bad chunk \ntraceback: Traceback (most recent call last):")
    assert error.endswith("ValueError: bad chunk\n\nlogs:\nstep 1\nstep 2\n")


def test_error_chunk_body_is_its_redacted_clipped_text() -> None:
    text = f"the prompt was refused ({SECRET})"
    assert json.loads(error_of(JobError("error chunk", text, shape="chunk"), REDACTOR)) == {
        "error": f"the prompt was refused ({REDACTED})"
    }


def test_init_failed_body_shape() -> None:
    error = JobError(
        "RuntimeError",
        "weights missing",
        "Traceback ...\nRuntimeError: weights missing\n",
        "file_not_found",
        "downloading\n",
        "init",
        3.14159265,
        600.0,
    )
    # The worker exits after an init failure: its bodies ask no stopPod, refresh_worker or not.
    data = Payloads(IDENTITY, NO_SECRETS, stop_pod=True).error(error)
    assert list(json.loads(data)) == ["error"]
    assert inner_of(data) == {
        "event": "init_failed",
        "error_type": "RuntimeError",
        "error_message": "weights missing",
        "error_traceback": "Traceback ...\nRuntimeError: weights missing\n",
        "error_category": "file_not_found",
        "logs": "downloading\n",
        "hostname": "gpu-host-7",
        "worker_id": "w-123",
        "sdk_version": "0.1.0",
        "runpod_version": "0.1.0",
        "elapsed_s": 3.142,
        "init_timeout": 600.0,
    }


def test_init_failed_body_omits_empty_logs() -> None:
    error = JobError("InitTimeout", "did not finish within 0 s", "", "timeout", "", "init", 0.0)
    inner = inner_of(error_of(error))
    assert "logs" not in inner
    assert inner["init_timeout"] is None


def test_shutdown_error_body() -> None:
    inner = inner_of(error_of(notice("WorkerShutdown", job_id="job-42", grace_s=30.0)))
    assert list(inner) == HANDLER_KEYS
    assert inner["error_type"] == "WorkerShutdown"
    assert inner["error_category"] == "worker_shutdown"
    assert "job-42" in inner["error_message"]
    assert "30 s" in inner["error_message"]
    assert inner["worker_id"] == "w-123"


def test_refused_and_crashed_notices() -> None:
    refused = notice("ResultRefused", job_id="j-1", status=413, reason="payload too large", size=9)
    inner = inner_of(error_of(refused))
    assert (inner["error_type"], inner["error_category"]) == ("ResultRefused", "unknown")
    assert (
        "job j-1 with HTTP 413 (payload too large): the report was 9 bytes"
        in (inner["error_message"])
    )
    crashed = notice(
        "WorkerCrashed", category="segfault", logs="last\n", job_id="j-2", how="died", where="here"
    )
    inner = inner_of(error_of(crashed))
    assert (inner["error_type"], inner["error_category"]) == ("WorkerCrashed", "segfault")
    assert inner["error_message"].startswith("The worker process died here (job j-2)")
    assert inner["logs"] == "last\n"


def test_stop_pod_and_undelivered_chunks_close_an_error_body() -> None:
    payloads = Payloads(IDENTITY, NO_SECRETS, stop_pod=True)
    body = json.loads(payloads.error(JobError("error chunk", "x", shape="chunk"), undelivered=[2]))
    assert body == {
        "error": "x",
        "undelivered_chunk_count": 1,
        "undelivered_chunks": [2],
        "stopPod": True,
    }
    assert "stopPod" not in json.loads(payloads.error(JobError("X", "y"), stop_pod=False))


# --- output errors ----------------------------------------------------------------------------


def test_output_error_body_shape() -> None:
    err = error_for({"output": {"image": b"x"}})
    inner = inner_of(error_of(JobError.output(err)))
    assert list(inner) == HANDLER_KEYS
    assert inner["error_type"] == "OutputNotSerializable"
    assert inner["error_message"] == str(err)
    assert inner["error_category"] == "unknown"
    assert inner["worker_id"] == "w-123"


def test_output_error_body_too_large_and_refresh() -> None:
    err = error_for({"output": "z" * 100}, max_bytes=10)
    data = Payloads(IDENTITY, NO_SECRETS, stop_pod=True).error(JobError.output(err))
    assert json.loads(data)["stopPod"] is True
    assert len(data) <= MAX_ERROR_BODY_BYTES
    assert inner_of(data)["error_type"] == "OutputTooLarge"


def test_output_error_body_is_redacted_and_bounded() -> None:
    secret = "sk-live-0123456789abcdef"
    err = ResultEncodingError(
        f"output[{secret!r}] is bytes" + "\x01" * 100_000, error_type="OutputNotSerializable"
    )
    payloads = Payloads(IDENTITY, Redactor([secret]), stop_pod=True)
    data = payloads.error(JobError.output(err))
    assert len(data) <= MAX_ERROR_BODY_BYTES
    assert secret.encode() not in data
    assert REDACTED in inner_of(data)["error_message"]

"""Result bodies (docs/protocol.md §3.2, §3.4) and their encoding: non-JSON and oversized results
become clear errors on the job, never a silently dropped report (docs/design.md §5)."""

from __future__ import annotations

import datetime
import decimal
import json
from typing import Any

import pytest

from trio_worker._capture._redact import REDACTED, Redactor
from trio_worker._errors import MAX_ERROR_BODY_BYTES, WorkerIdentity, encode_body
from trio_worker._results import (
    MAX_RESULT_BYTES,
    ResultEncodingError,
    encode_result,
    output_error_body,
    result_body,
    stream_final_body,
    with_stop_pod,
)

IDENTITY = WorkerIdentity(worker_id="w-1", hostname="host-1", sdk_version="0.1.0")
NO_SECRETS = Redactor([])

# --- result_body: the reference's shapes ---------------------------------------------------------


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
    assert result_body(value, redactor=NO_SECRETS) == expected


@pytest.mark.parametrize("value", [{"error": "boom"}, {"a": 1}, {}, None, [1]])
def test_stop_pod_marks_any_result(value: object) -> None:
    # The runner marks every body this way under refresh_worker (tests/test_runner.py).
    body = result_body(value, redactor=NO_SECRETS)
    assert with_stop_pod(body) is body
    assert body["stopPod"] is True


def test_the_users_dict_is_not_mutated() -> None:
    """Unlike the reference, which pops the keys from the returned dict itself."""
    cached = {"error": "x", "refresh_worker": True, "a": 1}
    body = result_body(cached, redactor=NO_SECRETS)
    assert body == {"output": {"a": 1}, "error": "x", "stopPod": True}
    assert cached == {"error": "x", "refresh_worker": True, "a": 1}


def test_no_copy_without_special_keys() -> None:
    value = {"a": 1}
    assert result_body(value, redactor=NO_SECRETS)["output"] is value


def test_ambiguous_truthiness_counts_as_present() -> None:
    class ArrayLike:
        def __bool__(self) -> bool:
            raise ValueError("The truth value of an array with more than one element is ambiguous")

    error = ArrayLike()
    assert result_body({"error": error}, redactor=NO_SECRETS) == {"error": error}


# --- a returned error is redacted; the output is not -------------------------------------------

SECRET = "pw-0123456789"
REDACTOR = Redactor([SECRET])


def test_a_returned_error_string_is_redacted() -> None:
    body = result_body({"error": f"login failed with {SECRET!r}"}, redactor=REDACTOR)
    assert body == {"error": f"login failed with '{REDACTED}'"}


def test_a_returned_error_object_is_redacted_everywhere_keys_included() -> None:
    error = {"code": 7, SECRET: [f"a {SECRET}", (SECRET, 1.5), None, {"n": SECRET}], "ok": True}
    body = result_body({"error": error}, redactor=REDACTOR)
    assert body == {
        "error": {
            "code": 7,
            REDACTED: [f"a {REDACTED}", [REDACTED, 1.5], None, {"n": REDACTED}],
            "ok": True,
        }
    }
    assert SECRET.encode() not in encode_result(body)


def test_the_returned_error_object_is_not_mutated() -> None:
    error = {"detail": [SECRET]}
    result_body({"error": error}, redactor=REDACTOR)
    assert error == {"detail": [SECRET]}


def test_the_output_is_the_users_data_and_is_not_redacted() -> None:
    """Outputs are not redacted: a result may legitimately contain anything (docs/design.md §8)."""
    body = result_body({"error": SECRET, "echo": SECRET}, redactor=REDACTOR)
    assert body == {"output": {"echo": SECRET}, "error": REDACTED}
    assert result_body(SECRET, redactor=REDACTOR) == {"output": SECRET}


def test_a_cyclic_error_object_stays_cyclic_and_is_refused_without_leaking() -> None:
    error: list[object] = [SECRET]
    error.append(error)
    body = result_body({"error": error}, redactor=REDACTOR)
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
    copy = result_body({"error": error}, redactor=REDACTOR)["error"]
    for _ in range(50_000):
        copy = copy[0]
    assert copy == [REDACTED]


def test_values_json_cannot_hold_are_left_for_encode_result_to_refuse() -> None:
    body = result_body({"error": {"when": datetime.date(2024, 1, 2), "b": b"x"}}, redactor=REDACTOR)
    assert body["error"] == {"when": datetime.date(2024, 1, 2), "b": b"x"}
    assert error_for(body).error_type == "OutputNotSerializable"


# --- streaming ---------------------------------------------------------------------------------


def test_stream_final_body() -> None:
    chunks: list[object] = [1, {"t": "a"}]
    assert stream_final_body(chunks, aggregate=True) == {"output": [1, {"t": "a"}]}
    assert stream_final_body(chunks, aggregate=False) == {"output": []}
    assert stream_final_body(None, aggregate=True) == {"output": []}
    assert stream_final_body([], aggregate=True) == {"output": []}
    aggregated = stream_final_body(chunks, aggregate=True)["output"]
    assert aggregated is not chunks  # later appends by the caller do not change the body


# --- encode_result: the happy path --------------------------------------------------------------


def test_encode_result_is_utf8_json() -> None:
    body = {"output": {"text": "héllo 画像", "n": [1, 2.5, True, None]}}
    data = encode_result(body)
    assert data == json.dumps(body, ensure_ascii=False).encode()
    assert json.loads(data) == body


def test_tuples_and_subclasses_encode_as_json_does() -> None:
    class Tag(str):
        pass

    data = encode_result({"output": {"pair": (1, 2), "tag": Tag("x"), 3: "int key"}})
    assert json.loads(data) == {"output": {"pair": [1, 2], "tag": "x", "3": "int key"}}


def test_happy_path_walks_the_value_once() -> None:
    class CountingDict(dict[str, Any]):
        items_calls = 0

        def items(self) -> Any:
            CountingDict.items_calls += 1
            return super().items()

    value = CountingDict(a=1, b=[1, 2, 3])
    encode_result(result_body(value, redactor=NO_SECRETS))
    assert CountingDict.items_calls == 1


def test_lone_surrogates_are_sent_escaped() -> None:
    data = encode_result({"output": "bad \ud800 byte"})
    data.decode("utf-8")  # valid UTF-8 on the wire
    assert json.loads(data) == {"output": "bad \ud800 byte"}


# --- encode_result: values that are not JSON ----------------------------------------------------


class FakeArray:
    """Looks like a numpy array to the hint: has .tolist()."""

    __module__ = "numpy"

    def tolist(self) -> list[int]:
        return [1, 2]


FakeArray.__qualname__ = "ndarray"


@pytest.mark.parametrize(
    ("body", "path", "words"),
    [
        ({"output": {"image": b"\x89PNG"}}, "output['image']", ["is bytes", "base64", "URL"]),
        ({"output": {"tags": {"a", "b"}}}, "output['tags']", ["is set", "list"]),
        (
            {"output": {"at": datetime.datetime(2024, 1, 1)}},
            "output['at']",
            ["datetime.datetime", "isoformat"],
        ),
        ({"output": decimal.Decimal("1.5")}, "output", ["decimal.Decimal", "float or a string"]),
        ({"output": [1, {"x": FakeArray()}]}, "output[1]['x']", ["numpy.ndarray", ".tolist()"]),
        ({"output": {"loss": float("nan")}}, "output['loss']", ["nan", "NaN and Infinity"]),
        ({"output": [float("inf")]}, "output[0]", ["inf", "not valid JSON"]),
        ({"output": {"a": 1}, "error": object()}, "error", ["is object", "not JSON"]),
        ({"output": {(1, 2): "x"}}, "output", ["key (1, 2)", "tuple", "keys must be strings"]),
        ({"output": {float("nan"): 1}}, "output", ["key nan"]),
        ({"output": ValueError("x")}, "output", ["ValueError", "str(error)"]),
    ],
)
def test_not_serializable_names_path_type_and_fix(
    body: dict[str, Any], path: str, words: list[str]
) -> None:
    with pytest.raises(ResultEncodingError) as info:
        encode_result(body)
    err = info.value
    assert err.error_type == "OutputNotSerializable"
    assert err.path == path
    assert str(err).startswith(path + " ")
    for word in words:
        assert word in str(err)


def test_the_first_offender_in_encoding_order_is_named() -> None:
    body = {"output": {"a": [1, 2, {"deep": b"first"}], "b": {1, 2}}}
    with pytest.raises(ResultEncodingError, match=r"^output\['a'\]\[2\]\['deep'\] is bytes"):
        encode_result(body)


def test_circular_reference() -> None:
    loop: list[object] = [1]
    loop.append({"back": loop})
    with pytest.raises(ResultEncodingError, match=r"circular reference") as info:
        encode_result({"output": loop})
    assert info.value.path == "output[1]['back']"


def test_generator_output_hints_at_streaming() -> None:
    gen = (i for i in range(3))
    with pytest.raises(ResultEncodingError, match="generator function"):
        encode_result({"output": gen})


def test_unawaited_coroutine_is_named() -> None:
    async def handler() -> int:
        return 1

    coro = handler()
    try:
        with pytest.raises(ResultEncodingError, match="never awaited"):
            encode_result({"output": coro})
    finally:
        coro.close()


def test_too_deep_nesting() -> None:
    value: list[object] = []
    for _ in range(100_000):
        value = [value]
    with pytest.raises(ResultEncodingError, match="nested too deeply") as info:
        encode_result({"output": value})
    assert info.value.error_type == "OutputNotSerializable"


# --- encode_result: size --------------------------------------------------------------------------


def test_result_over_the_limit() -> None:
    body = {"output": "x" * (MAX_RESULT_BYTES + 1)}
    with pytest.raises(ResultEncodingError) as info:
        encode_result(body)
    err = info.value
    assert err.error_type == "OutputTooLarge"
    assert err.path is None
    assert "over the platform limit of 20 MiB (20971520 bytes)" in str(err)
    assert "return a URL" in str(err)


def test_size_is_measured_in_encoded_bytes() -> None:
    body = {"output": "é" * 40}  # 40 characters, 80 bytes
    size = len(json.dumps(body, ensure_ascii=False).encode())
    assert encode_result(body, max_bytes=size) == json.dumps(body, ensure_ascii=False).encode()
    with pytest.raises(ResultEncodingError, match=rf"^result is {size} bytes, over"):
        encode_result(body, max_bytes=size - 1)


def test_human_sizes_in_the_message() -> None:
    with pytest.raises(
        ResultEncodingError, match=r"result is 2\.4 MiB \(\d+ bytes\), over .* 1 MiB"
    ):
        encode_result({"output": "y" * 2_500_000}, max_bytes=1024 * 1024)


# --- output_error_body ----------------------------------------------------------------------


def error_for(body: dict[str, Any], **kwargs: Any) -> ResultEncodingError:
    with pytest.raises(ResultEncodingError) as info:
        encode_result(body, **kwargs)
    return info.value


def test_output_error_body_shape() -> None:
    err = error_for({"output": {"image": b"x"}})
    body = output_error_body(err, category="unknown", identity=IDENTITY, redactor=Redactor([]))
    assert list(body) == ["error"]
    inner = json.loads(json.loads(encode_body(body))["error"])
    assert list(inner) == [
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
    assert inner["error_type"] == "OutputNotSerializable"
    assert inner["error_message"] == str(err)
    assert inner["error_category"] == "unknown"
    assert inner["worker_id"] == "w-1"


def test_output_error_body_too_large_and_refresh() -> None:
    err = error_for({"output": "z" * 100}, max_bytes=10)
    body = with_stop_pod(
        output_error_body(err, category="unknown", identity=IDENTITY, redactor=Redactor([]))
    )
    assert body["stopPod"] is True
    assert len(encode_body(body)) <= MAX_ERROR_BODY_BYTES
    inner = json.loads(body["error"])
    assert inner["error_type"] == "OutputTooLarge"


def test_output_error_body_is_redacted_and_bounded() -> None:
    secret = "sk-live-0123456789abcdef"
    err = ResultEncodingError(
        f"output[{secret!r}] is bytes" + "\x01" * 100_000, error_type="OutputNotSerializable"
    )
    body = with_stop_pod(
        output_error_body(err, category="unknown", identity=IDENTITY, redactor=Redactor([secret]))
    )
    data = encode_body(body)
    assert len(data) <= MAX_ERROR_BODY_BYTES
    assert secret.encode() not in data
    assert REDACTED in json.loads(json.loads(data)["error"])["error_message"]

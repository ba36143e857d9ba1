"""``_json_problems``: a body that cannot be posted is refused with an error naming the first
offending value by its path, why JSON cannot hold it and what to return instead, or its size
over the limit (docs/design.md §5), through the payloads' one encoder."""

from __future__ import annotations

import datetime
import decimal
import json
from typing import Any

import pytest

from trio_worker._payloads import MAX_RESULT_BYTES, ResultEncodingError, encode_body

# --- values that are not JSON -------------------------------------------------------------------


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
        encode_body(body)
    err = info.value
    assert err.error_type == "OutputNotSerializable"
    assert err.path == path
    assert str(err).startswith(path + " ")
    for word in words:
        assert word in str(err)


def test_the_first_offender_in_encoding_order_is_named() -> None:
    body = {"output": {"a": [1, 2, {"deep": b"first"}], "b": {1, 2}}}
    with pytest.raises(ResultEncodingError, match=r"^output\['a'\]\[2\]\['deep'\] is bytes"):
        encode_body(body)


def test_circular_reference() -> None:
    loop: list[object] = [1]
    loop.append({"back": loop})
    with pytest.raises(ResultEncodingError, match=r"circular reference") as info:
        encode_body({"output": loop})
    assert info.value.path == "output[1]['back']"


def test_generator_output_hints_at_streaming() -> None:
    gen = (i for i in range(3))
    with pytest.raises(ResultEncodingError, match="generator function"):
        encode_body({"output": gen})


def test_unawaited_coroutine_is_named() -> None:
    async def handler() -> int:
        return 1

    coro = handler()
    try:
        with pytest.raises(ResultEncodingError, match="never awaited"):
            encode_body({"output": coro})
    finally:
        coro.close()


def test_too_deep_nesting() -> None:
    value: list[object] = []
    for _ in range(100_000):
        value = [value]
    with pytest.raises(ResultEncodingError, match="nested too deeply") as info:
        encode_body({"output": value})
    assert info.value.error_type == "OutputNotSerializable"


# --- size --------------------------------------------------------------------------


def test_result_over_the_limit() -> None:
    body = {"output": "x" * (MAX_RESULT_BYTES + 1)}
    with pytest.raises(ResultEncodingError) as info:
        encode_body(body)
    err = info.value
    assert err.error_type == "OutputTooLarge"
    assert err.path is None
    assert "over the platform limit of 20 MiB (20971520 bytes)" in str(err)
    assert "return a URL" in str(err)


def test_size_is_measured_in_encoded_bytes() -> None:
    body = {"output": "é" * 40}  # 40 characters, 80 bytes
    size = len(json.dumps(body, ensure_ascii=False).encode())
    assert encode_body(body, max_bytes=size) == json.dumps(body, ensure_ascii=False).encode()
    with pytest.raises(ResultEncodingError, match=rf"^result is {size} bytes, over"):
        encode_body(body, max_bytes=size - 1)


def test_human_sizes_in_the_message() -> None:
    with pytest.raises(
        ResultEncodingError, match=r"result is 2\.4 MiB \(\d+ bytes\), over .* 1 MiB"
    ):
        encode_body({"output": "y" * 2_500_000}, max_bytes=1024 * 1024)

"""Parsing take and stop answers, one row of docs/protocol.md §2.1 / §2.5 at a time."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_worker._platform._client import MAX_JOB_ID_LENGTH, TakeResponse, parse_take
from trio_worker._platform._wire import parse_stop

JSON = "application/json"


def take(document: object, content_type: str = JSON, status: int = 200) -> TakeResponse:
    return parse_take(status, content_type, json.dumps(document).encode())


def assert_nothing(response: TakeResponse) -> None:
    assert response.empty
    assert response.jobs == []
    assert response.malformed == []
    assert response.unaddressable == []


# --- "no job" rows ------------------------------------------------------------------------


def test_204_is_no_job_even_with_a_body() -> None:
    response = parse_take(204, JSON, b'{"id": "a", "input": 1}')
    assert_nothing(response)
    assert response.garbled is None


@pytest.mark.parametrize("content_type", [JSON, "text/plain", ""])
def test_empty_body_is_no_job(content_type: str) -> None:
    response = parse_take(200, content_type, b"")
    assert_nothing(response)
    assert response.garbled is None


def test_null_is_no_job_and_not_garbled() -> None:
    response = parse_take(200, JSON, b"null")
    assert_nothing(response)
    assert response.garbled is None


def test_empty_array_is_no_job_and_not_garbled() -> None:
    response = parse_take(200, JSON, b"[]")
    assert_nothing(response)
    assert response.garbled is None


@pytest.mark.parametrize("document", [42, 1.5, "a job", True, False])
def test_other_json_types_are_no_job(document: object) -> None:
    response = take(document)
    assert_nothing(response)
    assert response.garbled is not None
    assert type(document).__name__ in response.garbled


# --- answers that are not understood -------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/html", "text/plain; charset=utf-8", ""])
def test_non_json_content_type_is_garbled(content_type: str) -> None:
    response = parse_take(200, content_type, b'{"id": "a", "input": 1}')
    assert_nothing(response)
    assert response.garbled is not None
    assert "content type" in response.garbled


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8", "APPLICATION/JSON", "text/json"],
)
def test_json_content_type_variants_are_accepted(content_type: str) -> None:
    response = parse_take(200, content_type, b'{"id": "a", "input": 1}')
    assert [job["id"] for job in response.jobs] == ["a"]


@pytest.mark.parametrize("body", [b"{", b"{'id': 'a'}", b"<html>busy</html>", b"\xff\xfe\x00"])
def test_unparsable_json_is_garbled(body: bytes) -> None:
    response = parse_take(200, JSON, body)
    assert_nothing(response)
    assert response.garbled is not None
    assert "not JSON" in response.garbled


def test_an_unparsable_answer_has_its_ids_recovered_and_failed() -> None:
    response = parse_take(200, JSON, b'{"id": "a"} x')
    assert response.jobs == []
    assert response.malformed == [("a", "the take answer carrying the job is not JSON")]
    assert response.garbled is not None
    assert "not JSON" in response.garbled


def test_deeply_nested_json_is_garbled_not_raised() -> None:
    response = parse_take(200, JSON, b"[" * 100_000)
    assert response.empty
    assert response.garbled is not None


# --- a single job object ------------------------------------------------------------------


def test_object_job_is_returned_as_the_same_dict_with_every_key() -> None:
    document = {"id": "job-1", "input": {"prompt": "hi"}, "webhook": "http://x", "extra": [1]}
    response = take(document)
    assert response.jobs == [document]
    assert response.malformed == []
    assert response.unaddressable == []
    assert response.garbled is None
    assert not response.empty


@pytest.mark.parametrize("value", [None, 0, "", [], {}, False])
def test_any_input_value_counts_as_present(value: object) -> None:
    response = take({"id": "j", "input": value})
    assert response.jobs == [{"id": "j", "input": value}]


def test_object_missing_input_is_malformed_with_its_id() -> None:
    response = take({"id": "job-2", "inputs": {}})
    assert response.jobs == []
    assert len(response.malformed) == 1
    job_id, reason = response.malformed[0]
    assert job_id == "job-2"
    assert "input" in reason
    # Malformed jobs are owed an error report, so the answer is not "empty".
    assert not response.empty


def test_object_missing_id_is_unaddressable() -> None:
    response = take({"input": {"x": 1}})
    assert response.jobs == []
    assert response.malformed == []
    assert len(response.unaddressable) == 1
    assert "id" in response.unaddressable[0]
    assert response.empty


@pytest.mark.parametrize(
    "job_id",
    [
        5,
        5.0,
        None,
        True,
        ["a"],
        {"v": "a"},
        "",
        "x" * (MAX_JOB_ID_LENGTH + 1),
        "line\nbreak",
        "nul\x00",
    ],
)
def test_unusable_ids_are_unaddressable(job_id: object) -> None:
    response = take({"id": job_id, "input": {}})
    assert response.jobs == []
    assert response.malformed == []
    assert len(response.unaddressable) == 1


def test_unusable_id_without_input_is_still_unaddressable() -> None:
    response = take({"id": 7})
    assert response.malformed == []
    assert len(response.unaddressable) == 1


@pytest.mark.parametrize("job_id", ["a", "x" * MAX_JOB_ID_LENGTH, "sync-1f2e-\u00e9\u4e2d"])
def test_usable_ids(job_id: str) -> None:
    assert take({"id": job_id, "input": 1}).jobs == [{"id": job_id, "input": 1}]


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ({"input": 1}, "the job has no 'id'"),
        ({"id": 5, "input": 1}, "the id is not a string but int"),
        ({"id": None, "input": 1}, "the id is not a string but NoneType"),
        ({"id": "", "input": 1}, "the id is empty"),
        ({"id": "x" * 513, "input": 1}, "the id has 513 characters, over 512"),
        ({"id": "a\r\nb", "input": 1}, "the id holds a control or unprintable character"),
        ({"id": "a\x1b[31m", "input": 1}, "the id holds a control or unprintable character"),
        ({"id": "\ud800", "input": 1}, "the id holds a control or unprintable character"),
        ({"id": "a\u2028b", "input": 1}, "the id holds a control or unprintable character"),
    ],
)
def test_each_unaddressable_item_says_why(item: dict[str, object], reason: str) -> None:
    [line] = take(item).unaddressable
    assert line.startswith(reason + ": {")


# Odd but addressable: sent percent-encoded as one path segment (tests/test_job_urls.py).
@pytest.mark.parametrize("job_id", ["a?x=1", "a#b", "a&isStream=true", "a b", "café", "w/x", "😀"])
def test_odd_printable_ids_are_jobs(job_id: str) -> None:
    assert take({"id": job_id, "input": 1}).jobs == [{"id": job_id, "input": 1}]


def test_preview_of_a_huge_item_is_bounded() -> None:
    response = take({"id": "x" * 100_000, "input": "y" * 100_000})
    assert len(response.unaddressable) == 1
    assert len(response.unaddressable[0]) < 500


# --- arrays (batch; also accepted on the single route) ------------------------------------


def test_array_batch_with_mixed_items_classifies_each_in_order() -> None:
    items: list[Any] = [
        {"id": "ok-1", "input": 1},
        {"id": "no-input"},
        {"input": "no id"},
        "a string",
        None,
        [{"id": "nested", "input": 1}],
        {"id": 12, "input": 1},
        {"id": "ok-2", "input": {"k": "v"}},
        {"id": "also-no-input", "output": 3},
    ]
    response = take(items)
    assert [job["id"] for job in response.jobs] == ["ok-1", "ok-2"]
    assert [job_id for job_id, _ in response.malformed] == ["no-input", "also-no-input"]
    assert len(response.unaddressable) == 5
    assert "not an object" in response.unaddressable[1]
    assert response.garbled is None
    assert not response.empty


def test_array_of_good_jobs_keeps_every_item_even_duplicates() -> None:
    items = [{"id": f"j{i}", "input": i} for i in range(5)] + [{"id": "j0", "input": 0}]
    response = take(items)
    assert response.jobs == items


def test_array_with_only_unaddressable_items_is_empty() -> None:
    response = take([{"input": 1}, 3])
    assert response.empty
    assert len(response.unaddressable) == 2


def test_any_2xx_status_other_than_204_is_parsed() -> None:
    response = parse_take(201, JSON, b'[{"id": "a", "input": 1}]')
    assert [job["id"] for job in response.jobs] == ["a"]


# A recursive JSON strategy of bounded depth.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(["id", "input", "x"]), children, max_size=3)
    ),
    max_leaves=20,
)


@given(st.lists(json_values, max_size=8))
def test_every_batch_item_lands_in_exactly_one_bucket(items: list[object]) -> None:
    response = take(items)
    assert len(response.jobs) + len(response.malformed) + len(response.unaddressable) == len(items)
    for job in response.jobs:
        assert isinstance(job["id"], str)
        assert "input" in job
    for job_id, _reason in response.malformed:
        assert isinstance(job_id, str)
        assert job_id


@given(json_values)
def test_parse_take_never_raises_on_any_json(document: object) -> None:
    response = take(document)
    assert isinstance(response, TakeResponse)


# --- stop answers -------------------------------------------------------------------------


def stop(document: object, content_type: str = JSON) -> tuple[list[str], str | None]:
    return parse_stop(content_type, json.dumps(document).encode())


def test_stop_list_of_ids() -> None:
    assert stop({"jobsToStop": ["a", "b"]}) == (["a", "b"], None)


def test_stop_empty_list_is_no_warning() -> None:
    assert stop({"jobsToStop": []}) == ([], None)


def test_stop_non_string_entries_are_dropped_with_a_warning() -> None:
    ids, warning = stop({"jobsToStop": ["a", 1, None, {"id": "b"}, ["c"], "d"]})
    assert ids == ["a", "d"]
    assert warning is not None
    assert "non-string" in warning


def test_stop_extra_keys_are_ignored() -> None:
    assert stop({"jobsToStop": ["a"], "other": 1}) == (["a"], None)


@pytest.mark.parametrize(
    "document",
    [{}, {"jobs": ["a"]}, {"jobsToStop": "a"}, {"jobsToStop": None}, ["a"], "a", None, 3],
)
def test_stop_missing_or_wrong_key_is_empty_with_a_warning(document: object) -> None:
    ids, warning = stop(document)
    assert ids == []
    assert warning is not None
    assert "jobsToStop" in warning


def test_stop_empty_body_is_empty_without_warning() -> None:
    assert parse_stop(JSON, b"") == ([], None)


def test_stop_non_json_content_type() -> None:
    ids, warning = parse_stop("text/html", b'{"jobsToStop": ["a"]}')
    assert ids == []
    assert warning is not None
    assert "content type" in warning


@pytest.mark.parametrize("body", [b"{", b"jobsToStop=a", b"\xff"])
def test_stop_unparsable_body(body: bytes) -> None:
    ids, warning = parse_stop(JSON, body)
    assert ids == []
    assert warning is not None
    assert "not JSON" in warning


def test_stop_deeply_nested_json_is_a_warning_not_raised() -> None:
    ids, warning = parse_stop(JSON, b'{"jobsToStop": ' + b"[" * 100_000)
    assert ids == []
    assert warning is not None


# --- one job's input never costs another job (docs/security.md) ---------------------------

DEEP = b"[" * 5_000 + b"]" * 5_000  # about 10 KB, past any JSON decoder's recursion limit


def test_a_job_nested_too_deep_is_malformed_and_the_rest_of_its_batch_runs() -> None:
    # Before: RecursionError on the whole answer; every job of the batch dropped.
    body = (
        b'[{"id": "a", "input": 1}, {"id": "deep", "input": ' + DEEP + b"}, "
        b'{"id": "c", "input": {"s": "]},\\"[{"}}]'
    )
    response = parse_take(200, JSON, body)
    assert [job["id"] for job in response.jobs] == ["a", "c"]
    assert response.jobs[1]["input"] == {"s": ']},"[{'}
    assert response.malformed == [
        ("deep", "the job cannot be decoded: its JSON is nested too deep to decode")
    ]
    assert response.garbled is None


def test_a_single_job_nested_too_deep_is_malformed() -> None:
    response = parse_take(200, JSON, b'{"input": ' + DEEP + b', "id": "a/b?c"}')
    assert response.jobs == []
    assert [job_id for job_id, _ in response.malformed] == ["a/b?c"]


def test_a_job_that_is_not_json_is_malformed_and_the_others_run() -> None:
    body = b'[{"id": "a", "input": 1}, {"id": "b", "input": nope}, {"id": "c", "input": 2}]'
    response = parse_take(200, JSON, body)
    assert [job["id"] for job in response.jobs] == ["a", "c"]
    ((job_id, reason),) = response.malformed
    assert job_id == "b"
    assert reason.startswith("the job cannot be decoded: it is not JSON")


def test_a_truncated_batch_has_every_readable_id_failed() -> None:
    # Ids nested inside an input are not jobs; an escaped id is read as its value.
    body = (
        b'[{"id": "a", "input": {"id": "not-a-job"}}, {"input": 1, "id": "q\\"uote"}, '
        b'{"id": "cut", "input": [1, 2'
    )
    response = parse_take(200, JSON, body)
    assert response.jobs == []
    assert [job_id for job_id, _ in response.malformed] == ["a", 'q"uote', "cut"]
    assert response.garbled is not None


def test_unusable_ids_are_not_recovered() -> None:
    body = b'[{"id": "", "input": 1}, {"id": "x\\u0000y"}, {"id": 7}, {"id": "ok"'
    response = parse_take(200, JSON, body)
    assert [job_id for job_id, _ in response.malformed] == ["ok"]


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "id": st.text(min_size=1, max_size=8),
                "input": st.recursive(
                    st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: (
                        st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=4), inner, max_size=3)
                    ),
                    max_leaves=8,
                ),
            }
        ),
        max_size=5,
    )
)
def test_the_scan_finds_the_same_jobs_as_the_decoder(jobs: list[dict[str, Any]]) -> None:
    # One deep job appended forces the scan; every other job must come out as decoded.
    body = json.dumps([*jobs, "DEEP"]).encode().replace(b'"DEEP"', DEEP)
    response = parse_take(200, JSON, body)
    expected = take(jobs)
    assert response.jobs == expected.jobs
    assert response.malformed == expected.malformed
    assert response.garbled is not None  # the deep item has no id: said, not dropped

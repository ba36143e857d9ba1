"""``_fitting``: clipping (docs/protocol.md §3.7), redaction before any cut (docs/design.md §8)
and the 64 KiB bound on every error body, whatever its input (I6), ``stopPod`` and the names
of undelivered chunks included."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_worker._capture._redact import REDACTED
from trio_worker._fitting import MAX_ERROR_BODY_BYTES, MAX_FIELD_CHARS, clip
from trio_worker._payloads import JobError, Payloads, WorkerIdentity
from trio_worker._tracebacks import format_traceback

from .test_payloads import IDENTITY, NO_SECRETS, REDACTOR, SECRET, error_of, inner_of, raised

# --- clip -------------------------------------------------------------------------------------


def test_clip_reference_algorithm() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(100))
    clipped = clip(text, 10)
    assert clipped == text[:5] + "\n...[90 characters truncated]...\n" + text[-5:]


@pytest.mark.parametrize("text", ["", "short", "x" * MAX_FIELD_CHARS])
def test_clip_leaves_short_text_alone(text: str) -> None:
    assert clip(text) is text


def test_clip_default_limit_bounds_length() -> None:
    clipped = clip("y" * 1_000_000)
    assert MAX_FIELD_CHARS < len(clipped) <= MAX_FIELD_CHARS + 100  # the reference's allowance
    assert clipped.startswith("y" * (MAX_FIELD_CHARS // 2) + "\n...[")


@pytest.mark.parametrize("limit", [0, 1])
def test_clip_degenerate_limits_keep_no_text(limit: int) -> None:
    assert clip("abcdef", limit) == "\n...[6 characters truncated]...\n"


# --- clipping fields, redaction first -----------------------------------------------------------


# Cut points: the head clip (8192), the logs' tail clip (len - 16384), and for huge text the
# pre-cut spans (16384 + 65536 = 81920 from either end).
@pytest.mark.parametrize(
    "position", [0, 3000, 8180, 8192, 8200, 23640, 40000, 81910, 150000, 218100, 283640]
)
def test_a_secret_cut_by_clipping_never_leaks_in_part(position: int) -> None:
    """Redaction happens before any cut, so a secret straddling a cut point cannot leave
    half of itself behind, neither at the final clip nor at the cheap pre-cut of huge text."""
    for total in (40_000, 300_000):
        if position >= total:
            continue
        text = "." * position + SECRET + "." * (total - position)
        error = JobError.raised(raised(RuntimeError(text)), logs=text)
        data = Payloads(IDENTITY, REDACTOR).error(error).decode()
        for i in range(len(SECRET) - 5):
            assert SECRET[i : i + 6] not in data, (position, total, SECRET[i : i + 6])


def test_logs_keep_their_tail() -> None:
    logs = "".join(f"line {i}\n" for i in range(10_000))
    inner = inner_of(error_of(JobError.raised(raised(ValueError("x")), logs=logs)))
    assert inner["logs"].endswith("line 9999\n")
    assert inner["logs"].startswith("...[")
    assert "characters truncated]...\n" in inner["logs"]
    assert len(inner["logs"]) <= MAX_FIELD_CHARS + 100


def test_long_message_keeps_head_and_tail() -> None:
    message = "HEAD" + "m" * 100_000 + "TAIL"
    inner = inner_of(error_of(JobError.raised(raised(ValueError(message)))))
    assert inner["error_message"] == clip(message)


def test_small_bodies_are_not_shrunk() -> None:
    error = JobError.raised(raised(ValueError("v" * 15_000)), logs="l" * 15_000)
    inner = inner_of(error_of(error))
    assert inner["error_message"] == "v" * 15_000
    assert inner["logs"] == "l" * 15_000


# --- I6: bounded, whatever the input -------------------------------------------------------------

NASTY = '"\\\x00\x01\x1f\u2028é€😀\ud800\udfff'


def huge_inputs() -> tuple[BaseException, str]:
    message = "MSG-HEAD" + (NASTY * 200_000)[:2_000_000] + "MSG-TAIL"
    logs = (("log line " + NASTY + "\n") * 500_000)[:5_000_000] + "LOGS-TAIL"
    return raised(RuntimeError(message)), logs


PAYLOADS = Payloads(IDENTITY, REDACTOR)


def bounded(error: JobError, payloads: Payloads = PAYLOADS, **kwargs: Any) -> bytes:
    """*error*'s body, checked within the bound with and without ``stopPod``."""
    with_stop = payloads.error(error, stop_pod=True, **kwargs)
    assert len(with_stop) <= MAX_ERROR_BODY_BYTES
    assert json.loads(with_stop)["stopPod"] is True
    data = payloads.error(error, stop_pod=False, **kwargs)
    assert len(data) <= MAX_ERROR_BODY_BYTES
    data.decode("utf-8")  # strict: no surrogates on the wire
    return data


def test_huge_handler_error_fits_and_keeps_what_matters() -> None:
    exc, logs = huge_inputs()
    inner = inner_of(bounded(JobError.raised(exc, logs=logs)))
    assert inner["error_message"].startswith("MSG-HEAD")
    assert inner["error_message"].endswith("MSG-TAIL")
    assert "characters truncated" in inner["error_message"]
    assert inner["logs"].endswith("LOGS-TAIL")
    assert inner["error_traceback"].rstrip().endswith("MSG-TAIL")
    assert "\ufffd" in inner["error_message"]  # lone surrogates replaced, not dropped
    # The budget is shared: each large field keeps a useful amount.
    for key in ("error_message", "error_traceback", "logs"):
        assert len(inner[key]) > 1000, key
    assert inner["worker_id"] == "w-123"


def test_huge_generator_error_fits_and_keeps_what_matters() -> None:
    exc, logs = huge_inputs()
    error = json.loads(bounded(JobError.raised(exc, logs=logs, shape="stream")))["error"]
    assert error.startswith("handler: MSG-HEAD")
    assert "MSG-TAIL \ntraceback: Traceback (most recent call last):" in error
    assert "\nlogs:\n" in error
    assert error.endswith("LOGS-TAIL")


def test_huge_init_failed_fits() -> None:
    exc, logs = huge_inputs()
    error = JobError(
        "RuntimeError", str(exc), format_traceback(exc), "cuda_error", logs, "init", 12.3, 600
    )
    inner = inner_of(bounded(error))
    assert inner["event"] == "init_failed"
    assert inner["error_message"].startswith("MSG-HEAD")
    assert inner["error_message"].endswith("MSG-TAIL")
    assert inner["logs"].endswith("LOGS-TAIL")


@pytest.mark.parametrize("ch", ["\x01", '"', "\\", "😀", "\ud800", "€"])
def test_an_error_chunk_of_the_costliest_characters_fits(ch: str) -> None:
    """16 K characters of control characters take 6 bytes each once escaped: clipping the
    text in characters alone would post almost 100 KB."""
    data = bounded(JobError("error chunk", ch * 40_000, shape="chunk"), undelivered=[3, 9])
    body = json.loads(data)
    assert body["undelivered_chunk_count"] == 2
    assert body["undelivered_chunks"] == [3, 9]
    assert body["error"].startswith(ch if ch != "\ud800" else "\ufffd")


def test_worst_case_characters_at_default_limits_fit() -> None:
    """16 K characters of the most expensive kind in every large field: about 7 bytes each
    after the double escape, so the fields must be shrunk, not just clipped."""
    for ch in ("\x01", '"', "\\", "😀", "\ud800", "€"):
        text = ch * MAX_FIELD_CHARS
        identity = WorkerIdentity(worker_id=text, hostname=text, sdk_version=text)
        error = JobError(text, text, text, text, text, "init", 1.0)
        inner_of(bounded(error, Payloads(identity, NO_SECRETS)))


def test_the_names_of_undelivered_chunks_fit_beside_a_huge_error() -> None:
    exc, logs = huge_inputs()
    lost = list(range(0, 5_000_000, 4000))  # 1250 chunks, the last indexes 7 digits long
    body = json.loads(bounded(JobError.raised(exc, logs=logs), undelivered=lost))
    assert body["undelivered_chunk_count"] == 1250
    assert body["undelivered_chunks"] == lost[:1000]
    assert json.loads(body["error"])["error_message"].endswith("MSG-TAIL")


_TEXT = st.text(alphabet=st.one_of(st.characters(), st.sampled_from(list(NASTY))))
_BIG_TEXT = st.builds(lambda s, n: s * n, _TEXT, st.integers(min_value=0, max_value=3000))


def _sanitized(text: str) -> str:
    return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=_BIG_TEXT, logs=_BIG_TEXT, tb=_BIG_TEXT, small=_TEXT, category=_TEXT)
def test_property_every_body_is_bounded_and_parses(
    message: str, logs: str, tb: str, small: str, category: str
) -> None:
    identity = WorkerIdentity(worker_id=small, hostname=small * 50, sdk_version=small)
    payloads = Payloads(identity, NO_SECRETS)
    exc = RuntimeError(message)
    handler = bounded(JobError.raised(exc, logs=logs, category=category), payloads)
    assert inner_of(handler)["error_category"] == clip(_sanitized(category), 200)
    init = bounded(JobError(small, message, tb, category, logs, "init", 0.5), payloads)
    assert inner_of(init)["event"] == "init_failed"
    generator = bounded(JobError.raised(exc, logs=logs, shape="stream"), payloads)
    assert isinstance(json.loads(generator)["error"], str)
    chunk = bounded(JobError("error chunk", message, shape="chunk"), payloads)
    assert isinstance(json.loads(chunk)["error"], str)


def test_redaction_happens_in_every_field_even_when_fitted() -> None:
    text = (SECRET + '"') * 20_000
    data = bounded(JobError.raised(raised(RuntimeError(text)), logs=text, category=SECRET))
    assert SECRET.encode() not in data
    assert REDACTED in inner_of(data)["error_message"]

"""Error payloads: shapes (docs/protocol.md §3.3, §3.4, §3.6), clipping (§3.7), redaction
(docs/design.md §8) and the 64 KiB bound on every error body whatever the input (I6)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_worker._capture._redact import REDACTED, Redactor
from trio_worker._errors import (
    MAX_ERROR_BODY_BYTES,
    MAX_FIELD_CHARS,
    WorkerIdentity,
    clip,
    encode_body,
    error_type_name,
    format_traceback,
    generator_error_body,
    handler_error_body,
    init_failed_body,
    shutdown_error_body,
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


def sanitized(text: str) -> str:
    return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)


def inner_of(body: dict[str, Any]) -> dict[str, Any]:
    """Parse a body as the platform does: the bytes, then the error string's JSON."""
    outer = json.loads(encode_body(body))
    assert set(outer) == {"error"}
    assert isinstance(outer["error"], str)
    inner = json.loads(outer["error"])
    assert isinstance(inner, dict)
    return inner


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


# --- names and tracebacks ---------------------------------------------------------------------


class LibraryError(Exception):
    pass


LibraryError.__module__ = "somelib.errors"


def test_error_type_name() -> None:
    assert error_type_name(RuntimeError("x")) == "RuntimeError"
    assert error_type_name(LibraryError()) == "somelib.errors.LibraryError"
    main_cls = type("BadInput", (ValueError,), {"__module__": "__main__"})
    assert error_type_name(main_cls()) == "BadInput"
    private = type("ConnectError", (Exception,), {"__module__": "somelib._exceptions"})
    assert error_type_name(private()) == "somelib.ConnectError"
    assert error_type_name(trio.TooSlowError()) == "trio.TooSlowError"
    assert error_type_name(httpx.ConnectError("x")) == "httpx.ConnectError"


def test_format_traceback_includes_the_chain() -> None:
    try:
        try:
            raise KeyError("inner-cause")
        except KeyError as inner:
            raise RuntimeError("outer-failure") from inner
    except RuntimeError as outer:
        text = format_traceback(outer)
    assert "KeyError: 'inner-cause'" in text
    assert "direct cause of the following exception" in text
    assert text.rstrip().endswith("RuntimeError: outer-failure")


def test_format_traceback_of_an_exception_group() -> None:
    group = raised(ExceptionGroup("two failed", [ValueError("first"), OSError("second")]))
    text = format_traceback(group)
    assert "ValueError: first" in text
    assert "OSError: second" in text


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


def test_unprintable_exception_still_reports() -> None:
    inner = inner_of(
        handler_error_body(
            raised(Unprintable()),
            logs="",
            category="unknown",
            identity=IDENTITY,
            redactor=NO_SECRETS,
        )
    )
    assert inner["error_message"] == "<Unprintable: str() failed>"
    assert "Unprintable" in inner["error_traceback"]


# --- handler error body -------------------------------------------------------------------------


def test_handler_error_body_shape() -> None:
    exc = raised(ValueError("prompt must be a string"))
    body = handler_error_body(
        exc, logs="loading...\nfailed\n", category="unknown", identity=IDENTITY, redactor=NO_SECRETS
    )
    assert list(body) == ["error"]
    inner = inner_of(body)
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
    inner = inner_of(
        handler_error_body(
            raised(ValueError("x")),
            logs="",
            category="unknown",
            identity=IDENTITY,
            redactor=NO_SECRETS,
        )
    )
    assert inner["logs"] == ""


def test_non_ascii_stays_readable_and_the_body_is_utf8() -> None:
    body = handler_error_body(
        raised(ValueError("画像が大きすぎます")),
        logs="température élevée",
        category="unknown",
        identity=IDENTITY,
        redactor=NO_SECRETS,
    )
    data = encode_body(body)
    assert "画像が大きすぎます".encode() in data
    assert inner_of(body)["logs"] == "température élevée"


def test_every_text_field_is_redacted() -> None:
    identity = WorkerIdentity(worker_id=f"w-{SECRET}", hostname=SECRET, sdk_version="0.1.0")
    exc = raised(RuntimeError(f"auth failed with token {SECRET}"))
    body = handler_error_body(
        exc,
        logs=f"export HF_TOKEN={SECRET}\n",
        category=SECRET,
        identity=identity,
        redactor=REDACTOR,
    )
    data = encode_body(body)
    assert SECRET.encode() not in data
    inner = inner_of(body)
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
    bodies = [
        handler_error_body(
            exc, logs=text, category="unknown", identity=IDENTITY, redactor=redactor
        ),
        generator_error_body(exc, logs=text, redactor=redactor),
        init_failed_body(
            error_type="RuntimeError",
            message=text,
            traceback=format_traceback(exc),
            category="unknown",
            logs=text,
            elapsed_s=1.0,
            identity=IDENTITY,
            redactor=redactor,
        ),
    ]
    for body in bodies:
        data = encode_body(body).decode()
        # Decode the body back to the texts it carries, then look for every form there.
        texts = [data, json.loads(data)["error"]]
        try:
            texts += [str(v) for v in json.loads(texts[1]).values()]
        except ValueError:
            pass  # the generator shape is plain text
        for carried in texts:
            assert "url-pw-4242" not in carried
            for form in _forms_of(ESCAPED_SECRET):
                assert form not in carried
        assert REDACTED in texts[1]


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
        body = handler_error_body(
            raised(RuntimeError(text)),
            logs=text,
            category="unknown",
            identity=IDENTITY,
            redactor=REDACTOR,
        )
        data = encode_body(body).decode()
        for i in range(len(SECRET) - 5):
            assert SECRET[i : i + 6] not in data, (position, total, SECRET[i : i + 6])


def test_logs_keep_their_tail() -> None:
    logs = "".join(f"line {i}\n" for i in range(10_000))
    inner = inner_of(
        handler_error_body(
            raised(ValueError("x")),
            logs=logs,
            category="unknown",
            identity=IDENTITY,
            redactor=NO_SECRETS,
        )
    )
    assert inner["logs"].endswith("line 9999\n")
    assert inner["logs"].startswith("...[")
    assert "characters truncated]...\n" in inner["logs"]
    assert len(inner["logs"]) <= MAX_FIELD_CHARS + 100


def test_long_message_keeps_head_and_tail() -> None:
    message = "HEAD" + "m" * 100_000 + "TAIL"
    inner = inner_of(
        handler_error_body(
            raised(ValueError(message)),
            logs="",
            category="unknown",
            identity=IDENTITY,
            redactor=NO_SECRETS,
        )
    )
    assert inner["error_message"] == clip(message)


# --- I6: bounded, whatever the input -------------------------------------------------------------

NASTY = '"\\\x00\x01\x1f\u2028é€😀\ud800\udfff'


def huge_inputs() -> tuple[BaseException, str]:
    message = "MSG-HEAD" + (NASTY * 200_000)[:2_000_000] + "MSG-TAIL"
    logs = (("log line " + NASTY + "\n") * 500_000)[:5_000_000] + "LOGS-TAIL"
    return raised(RuntimeError(message)), logs


def assert_bounded(body: dict[str, Any]) -> bytes:
    data = encode_body(body)
    assert len(data) <= MAX_ERROR_BODY_BYTES
    with_stop = dict(body, stopPod=True)  # the caller may still add stopPod
    assert len(encode_body(with_stop)) <= MAX_ERROR_BODY_BYTES
    data.decode("utf-8")  # strict: no surrogates on the wire
    return data


def test_huge_handler_error_fits_and_keeps_what_matters() -> None:
    exc, logs = huge_inputs()
    body = handler_error_body(
        exc, logs=logs, category="unknown", identity=IDENTITY, redactor=REDACTOR
    )
    assert_bounded(body)
    inner = inner_of(body)
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
    body = generator_error_body(exc, logs=logs, redactor=REDACTOR)
    data = assert_bounded(body)
    error = json.loads(data)["error"]
    assert error.startswith("handler: MSG-HEAD")
    assert "MSG-TAIL \ntraceback: Traceback (most recent call last):" in error
    assert "\nlogs:\n" in error
    assert error.endswith("LOGS-TAIL")


def test_huge_init_failed_fits() -> None:
    exc, logs = huge_inputs()
    body = init_failed_body(
        error_type="RuntimeError",
        message=str(exc),
        traceback=format_traceback(exc),
        category="cuda_error",
        logs=logs,
        elapsed_s=12.3456789,
        identity=IDENTITY,
        redactor=REDACTOR,
        init_timeout=600,
    )
    assert_bounded(body)
    inner = inner_of(body)
    assert inner["event"] == "init_failed"
    assert inner["error_message"].startswith("MSG-HEAD")
    assert inner["error_message"].endswith("MSG-TAIL")
    assert inner["logs"].endswith("LOGS-TAIL")


def test_worst_case_characters_at_default_limits_fit() -> None:
    """16 K characters of the most expensive kind in every large field: about 7 bytes each
    after the double escape, so the fields must be shrunk, not just clipped."""
    for ch in ("\x01", '"', "\\", "😀", "\ud800", "€"):
        text = ch * MAX_FIELD_CHARS
        body = init_failed_body(
            error_type=text,
            message=text,
            traceback=text,
            category=text,
            logs=text,
            elapsed_s=1.0,
            identity=WorkerIdentity(worker_id=text, hostname=text, sdk_version=text),
            redactor=NO_SECRETS,
        )
        assert_bounded(body)
        inner_of(body)


def test_small_bodies_are_not_shrunk() -> None:
    exc = raised(ValueError("v" * 15_000))
    body = handler_error_body(
        exc, logs="l" * 15_000, category="unknown", identity=IDENTITY, redactor=NO_SECRETS
    )
    inner = inner_of(body)
    assert inner["error_message"] == "v" * 15_000
    assert inner["logs"] == "l" * 15_000


_TEXT = st.text(alphabet=st.one_of(st.characters(), st.sampled_from(list(NASTY))))
_BIG_TEXT = st.builds(lambda s, n: s * n, _TEXT, st.integers(min_value=0, max_value=3000))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=_BIG_TEXT, logs=_BIG_TEXT, tb=_BIG_TEXT, small=_TEXT, category=_TEXT)
def test_property_every_body_is_bounded_and_parses(
    message: str, logs: str, tb: str, small: str, category: str
) -> None:
    identity = WorkerIdentity(worker_id=small, hostname=small * 50, sdk_version=small)
    exc = RuntimeError(message)
    handler = handler_error_body(
        exc, logs=logs, category=category, identity=identity, redactor=NO_SECRETS
    )
    assert_bounded(handler)
    assert inner_of(handler)["error_category"] == clip(sanitized(category), 200)
    init = init_failed_body(
        error_type=small,
        message=message,
        traceback=tb,
        category=category,
        logs=logs,
        elapsed_s=0.5,
        identity=identity,
        redactor=NO_SECRETS,
    )
    assert_bounded(init)
    assert inner_of(init)["event"] == "init_failed"
    generator = generator_error_body(exc, logs=logs, redactor=NO_SECRETS)
    assert isinstance(json.loads(assert_bounded(generator))["error"], str)


# --- generator, init, shutdown --------------------------------------------------------------------


def test_generator_error_body_reference_shape() -> None:
    exc = raised(ValueError("bad chunk"))
    body = generator_error_body(exc, logs="step 1\nstep 2\n", redactor=NO_SECRETS)
    assert list(body) == ["error"]
    error = body["error"]
    assert error.startswith("handler: bad chunk \ntraceback: Traceback (most recent call last):")
    assert error.endswith("ValueError: bad chunk\n\nlogs:\nstep 1\nstep 2\n")


def test_init_failed_body_shape() -> None:
    body = init_failed_body(
        error_type="RuntimeError",
        message="weights missing",
        traceback="Traceback ...\nRuntimeError: weights missing\n",
        category="file_not_found",
        logs="downloading\n",
        elapsed_s=3.14159265,
        identity=IDENTITY,
        redactor=NO_SECRETS,
        init_timeout=600.0,
    )
    inner = inner_of(body)
    assert inner == {
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


def test_init_failed_body_omits_empty_logs_and_handles_odd_numbers() -> None:
    body = init_failed_body(
        error_type="InitTimeout",
        message="the initializer did not finish within 0 s",
        traceback="",
        category="timeout",
        logs="",
        elapsed_s=float("nan"),
        identity=IDENTITY,
        redactor=NO_SECRETS,
    )
    inner = inner_of(body)
    assert "logs" not in inner
    assert inner["elapsed_s"] is None
    assert inner["init_timeout"] is None
    assert b"NaN" not in encode_body(body)


def test_shutdown_error_body() -> None:
    inner = inner_of(
        shutdown_error_body(job_id="job-42", grace_s=30.0, identity=IDENTITY, redactor=NO_SECRETS)
    )
    assert list(inner) == HANDLER_KEYS
    assert inner["error_type"] == "WorkerShutdown"
    assert inner["error_category"] == "worker_shutdown"
    assert "job-42" in inner["error_message"]
    assert "30 s" in inner["error_message"]
    assert inner["worker_id"] == "w-123"


def test_encode_body() -> None:
    assert encode_body({"error": "é"}) == '{"error": "é"}'.encode()
    # A body this module did not build may hold lone surrogates: still valid UTF-8 JSON.
    data = encode_body({"error": "\ud800"})
    assert json.loads(data) == {"error": "\ud800"}

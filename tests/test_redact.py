"""Redaction (docs/design.md §8): which values are secrets, every form in which a secret is
found, passwords in URLs, and a handler's returned error reaching the platform redacted."""

from __future__ import annotations

import json
import os
import string
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import trio_worker
from trio_worker._capture._redact import (
    REDACTED,
    Redactor,
    is_secret_name,
    redact_from,
    secret_values,
    url_passwords,
)
from trio_worker.testing import FakePlatform, run_platform_server

# --- which variables hold secrets -------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "RUNPOD_AI_API_KEY",
        "HF_TOKEN",
        "APIKEY",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "DB_PASSWD",
        "PASSWD",
        "SSH_PASSPHRASE",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "DB_PASS",
        "PASS",
        "SMTP_PASS2",
        "PASS_FILE_CONTENT",
        "MYSQL_PWD",
        "db_pass",
        "redis.pass",
        "x-pass",
    ],
)
def test_names_that_hold_secrets(name: str) -> None:
    assert is_secret_name(name)
    assert secret_values({name: "value-1234"}) == ["value-1234"]


@pytest.mark.parametrize(
    "name",
    [
        "PASSENGER_COUNT",
        "COMPASS_DIR",
        "BYPASS_CACHE",
        "PASSTHROUGH",
        "SURPASS",
        "PASSES",
        "PWD",
        "OLDPWD",
        "PWDX",
        "HOME",
        "PATH",
        "AUTH_URL",
        "DATABASE_URL",
        "SENTRY_DSN",
    ],
)
def test_names_that_do_not(name: str) -> None:
    assert not is_secret_name(name)
    assert secret_values({name: "value-1234"}) == []


def test_short_values_are_not_secrets_and_the_longest_comes_first() -> None:
    env = {"A_KEY": "abc", "B_KEY": "abcd", "C_TOKEN": "abcdefgh", "D_PASS": ""}
    assert secret_values(env) == ["abcdefgh", "abcd"]


def test_a_value_with_surrounding_whitespace_is_also_a_secret_without_it() -> None:
    """A token read from a file keeps its newline; the library that sends it strips it."""
    assert secret_values({"HF_TOKEN": "hf_abcdef\n"}) == ["hf_abcdef\n", "hf_abcdef"]
    assert Redactor.from_environ({"HF_TOKEN": " hf_abcdef\n"}).redact("t=hf_abcdef.") == (
        f"t={REDACTED}."
    )


def test_url_passwords_in_any_variable_are_secrets_as_written_and_decoded() -> None:
    env = {
        "DATABASE_URL": "postgres://app:p%40ss-word@db:5432/main",
        "CACHE": "redis://:r3dis-pw@cache:6379/0",
        "BROKERS": "amqp://u:first-pw@h1/v amqp://u:second-pw@h2/v",
        "PUBLIC": "https://example.com/a:b@c",  # after the path: not credentials
        "GIT_REMOTE": "ssh://git@github.com/x",
    }
    assert sorted(secret_values(env)) == sorted(
        ["p%40ss-word", "p@ss-word", "r3dis-pw", "first-pw", "second-pw"]
    )
    redactor = Redactor.from_environ(env)
    # Printed without its URL, decoded, as a library that connects would show it.
    assert redactor.redact("auth failed for p@ss-word") == f"auth failed for {REDACTED}"
    # The user name is not a secret.
    assert redactor.redact("role app denied") == "role app denied"


def test_url_password_containing_at_signs_runs_to_the_last_one() -> None:
    assert list(url_passwords("mongodb+srv://u:p@ss@w0rd@host/db")) == ["p@ss@w0rd"] * 2


# --- passwords in URLs anywhere in the text ----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgres://u:pw@h/db", f"postgres://u:{REDACTED}@h/db"),
        ("redis://:pw@cache:6379", f"redis://:{REDACTED}@cache:6379"),
        ("x=mongodb+srv://u:p@ss@h/?a=1 y", f"x=mongodb+srv://u:{REDACTED}@h/?a=1 y"),
        ('{"url": "amqp://guest:guest@rabbit"}', f'{{"url": "amqp://guest:{REDACTED}@rabbit"}}'),
        ("a http://u:1@h b https://v:2@i", f"a http://u:{REDACTED}@h b https://v:{REDACTED}@i"),
        ("https://u:p:q@h", f"https://u:{REDACTED}@h"),
    ],
)
def test_any_url_password_is_redacted(text: str, expected: str) -> None:
    assert Redactor([]).redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "https://example.com:8080/path",
        "ssh://git@github.com/org/repo",
        "https://example.com/a:b@c",
        "https://example.com/?q=a:b@c",
        "git@github.com:org/repo.git",
        "user:pw@host",
        "mail me at a:b@example.com",
        "https://u:p\n@h",
        "",
    ],
)
def test_text_without_url_credentials_is_left_alone(text: str) -> None:
    assert Redactor([]).redact(text) == text


# --- every form of a secret --------------------------------------------------------------------

FORMS: dict[str, Callable[[str], str]] = {
    "as is": lambda s: s,
    "json": lambda s: json.dumps(s)[1:-1],
    "json utf-8": lambda s: json.dumps(s, ensure_ascii=False)[1:-1],
    "json in json": lambda s: json.dumps(json.dumps(s))[3:-3],
    "repr": lambda s: repr(s)[1:-1],
    "repr, other quote": lambda s: repr(s + "'\"")[1:-4],
    "ascii": lambda s: ascii(s)[1:-1],
    "bytes repr": lambda s: repr(s.encode("utf-8", "surrogatepass"))[2:-1],
    "repr of json": lambda s: repr(json.dumps(s))[2:-2],
    "quote": lambda s: urllib.parse.quote(s, safe="", errors="surrogatepass"),
    "quote, default safe": lambda s: urllib.parse.quote(s, errors="surrogatepass"),
    "quote_plus": lambda s: urllib.parse.quote_plus(s, errors="surrogatepass"),
    "quote, lower-case hex": lambda s: _lower_hex(urllib.parse.quote(s, errors="surrogatepass")),
}
SPECIAL = 'p@ss "w\\rd"\n\t\x00é€😀 %+/\'~'


def _lower_hex(quoted: str) -> str:
    parts = quoted.split("%")
    return parts[0] + "".join("%" + p[:2].lower() + p[2:] for p in parts[1:])


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("secret", [SPECIAL, "sk-live-0123456789abcdef", "\\\\share", '"lead'])
def test_each_form_of_a_secret_is_redacted(form: str, secret: str) -> None:
    shown = FORMS[form](secret)
    out = Redactor([secret]).redact(f"before <{shown}> after")
    assert out == f"before <{REDACTED}> after"


def test_forms_are_matched_in_upper_case_hex_too() -> None:
    secret = "é-secret\n"
    for shown in ("\\u00E9-secret\\u000A", "%C3%A9-secret%0A", "\\xC3\\xA9-secret\\x0A"):
        assert Redactor([secret]).redact(shown) == REDACTED


def test_a_secret_inside_a_longer_secret_is_replaced_whole() -> None:
    redactor = Redactor(["abcd", "xxabcdyy"])
    assert redactor.redact("xxabcdyy abcd") == f"{REDACTED} {REDACTED}"


def test_a_run_of_backslashes_longer_than_escaping_makes_still_loses_the_secret() -> None:
    out = Redactor(['"quoted']).redact("\\" * 40 + '"quoted')
    assert out == "\\" * 40 + REDACTED


def test_a_window_cut_through_an_escaped_secret_shows_no_part_of_it() -> None:
    secret = 'tok"en-12345'
    text = "x" * 50 + json.dumps(secret) + "y" * 50
    shown = json.dumps(secret)[1:-1]
    redactor = Redactor([secret])
    for start in range(len(text)):
        out = redact_from(redactor, text, start)
        assert shown[4:] not in out  # no tail of the escaped secret


@pytest.mark.timeout(60)
@pytest.mark.parametrize("secret", ["\\" * 6 + "x", '\\"\\"\\"x', '"\\"\\n\\"'])
def test_adversarial_backslash_runs_cannot_stall_redaction(secret: str) -> None:
    """Text the worker does not control (an exception echoing a job's input) made of
    backslash runs: a pattern letting adjacent escapes split a run any way would backtrack
    through every split, for hours here. The guard is the test timeout, not a timing."""
    text = ("\\" * 40 + "a") * 6000 + ("\\" * 40 + '"') * 6000
    redactor = Redactor([secret])
    assert redactor.redact(text) == text
    assert redactor.redact(text + json.dumps(secret)) == text + f'"{REDACTED}"'


# --- properties ------------------------------------------------------------------------------

secrets = st.text(min_size=4, max_size=24).filter(lambda s: "[" not in s and "]" not in s)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    secret=secrets,
    other=secrets,
    before=st.text(max_size=40),
    after=st.text(max_size=40),
    form=st.sampled_from(sorted(FORMS)),
)
@example(secret='"ab\\', other="zzzz", before="\\" * 20, after="", form="json")
@example(secret="aaaa", other="aaaaa", before="a", after="a", form="as is")
def test_no_secret_survives_in_any_form(
    secret: str, other: str, before: str, after: str, form: str
) -> None:
    assume(secret not in REDACTED)
    shown = FORMS[form](secret)
    out = Redactor([secret, other]).redact(before + shown + after)
    assert shown not in out
    assert secret not in out


@settings(max_examples=300, deadline=None)
@given(secret=secrets, data=st.data())
def test_text_without_the_secret_is_left_as_it_was(secret: str, data: st.DataObject) -> None:
    # Every form of the secret starts with its first character, a backslash, a percent
    # sign or (for a space) a plus sign; a URL password needs "://".
    excluded = {secret[0], "\\", "%", "+", ":"}
    alphabet = st.characters(blacklist_characters="".join(excluded))
    text = data.draw(st.text(alphabet, max_size=200))
    assert Redactor([secret]).redact(text) == text


@given(st.text(string.printable, max_size=200))
def test_redaction_is_idempotent(text: str) -> None:
    redactor = Redactor(["secret-value", 'q"uote'])
    once = redactor.redact(text)
    assert redactor.redact(once) == once


# --- end to end: a returned error reaches the platform redacted -------------------------------

DB_PASS = 'db-"pass\\word-1'
URL_PASSWORD = "url-pw-98765"


async def run_jobs(handler: Any, inputs: list[dict[str, Any]]) -> FakePlatform:
    """Run *inputs* through a worker over loopback HTTP with the secrets in its environment;
    the platform, once every job failed."""
    platform = FakePlatform(take_hold=0.2, stop_hold=0.2)
    async with run_platform_server(platform) as url, trio.open_nursery() as nursery:
        env = {
            **platform.worker_env(url),
            "DB_PASS": DB_PASS,
            "DATABASE_URL": f"postgres://u:{URL_PASSWORD}@h/db",
        }
        await nursery.start(
            lambda task_status: trio_worker.serve(
                handler,
                environ=env,
                capture_logs="off",
                handle_signals=False,
                task_status=task_status,
            )
        )
        job_ids = [platform.enqueue(job_input) for job_input in inputs]
        with trio.fail_after(30):
            for job_id in job_ids:
                await platform.wait_for_status(job_id, "FAILED")
        nursery.cancel_scope.cancel()
    return platform


def assert_no_secret_sent(platform: FakePlatform, reports: int) -> None:
    done = [r.body for r in platform.requests if r.route == "done"]
    assert len(done) == reports
    assert all(REDACTED.encode() in body for body in done)
    sent = [r.path.encode() + r.body for r in platform.requests]
    leaked = [
        (form, data)
        for data in sent
        for secret in (DB_PASS, URL_PASSWORD)
        for form, show in FORMS.items()
        if show(secret).encode() in data or show(secret) in data.decode()
    ]
    assert leaked == []


async def test_the_platform_receives_no_secret_from_a_returned_or_raised_error() -> None:
    """A non-streaming handler's returned ``{"error": ...}`` is the job's error: it goes out
    redacted like a raised one (the reference posted it as is)."""

    def handler(job: dict[str, Any]) -> object:
        password = os.environ.get("DB_PASS", DB_PASS)  # as the handler would read it
        if job["input"]["how"] == "return":
            return {
                "error": {
                    "message": f"failed with {password} and postgres://u:{URL_PASSWORD}@h/db",
                    "detail": {"repr": repr(password), "json": json.dumps(password)},
                }
            }
        raise RuntimeError(f"failed with {password!r} for postgres://u:{URL_PASSWORD}@h/db")

    platform = await run_jobs(handler, [{"how": "return"}, {"how": "raise"}])
    assert_no_secret_sent(platform, reports=2)


async def test_the_platform_receives_no_secret_from_a_stream_error() -> None:
    """An error chunk ends the stream as ``{"error": str(error)}``: a dict's str() holds the
    repr of each string, the escaped form of the secret."""

    async def handler(job: dict[str, Any]) -> Any:
        yield {"step": 1}
        if job["input"]["how"] == "chunk":
            yield {"error": {"password": DB_PASS, "url": f"redis://:{URL_PASSWORD}@c"}}
        raise RuntimeError(f"failed with {DB_PASS!r} for postgres://u:{URL_PASSWORD}@h/db")

    platform = await run_jobs(handler, [{"how": "chunk"}, {"how": "raise"}])
    assert_no_secret_sent(platform, reports=2)

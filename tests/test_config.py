"""Configuration: environment parsing and placeholder rules (docs/protocol.md §1, §1.5), the CLI
flags of the reference, ``test_input.json`` and :class:`Timings` validation."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import socket
import uuid
from typing import TYPE_CHECKING

import pytest

from trio_worker._config import (
    DEFAULT_API_HOST,
    DEFAULT_API_PORT,
    DEFAULT_PING_INTERVAL_MS,
    LocalArgs,
    Settings,
    Timings,
    log_level_from,
    parse_cli,
    platform_from_env,
    read_test_input_file,
    with_query,
)
from trio_worker._exceptions import ConfigurationError

if TYPE_CHECKING:
    from pathlib import Path

H = "http://platform.test/v2/ep1"
WIRING = {
    "RUNPOD_WEBHOOK_GET_JOB": f"{H}/job-take/$ID?gpu=A100",
    "RUNPOD_WEBHOOK_POST_OUTPUT": f"{H}/job-done/$RUNPOD_POD_ID/$ID?gpu=A100",
    "RUNPOD_WEBHOOK_POST_STREAM": f"{H}/job-stream/$RUNPOD_POD_ID/$ID?gpu=A100",
    "RUNPOD_WEBHOOK_PING": f"{H}/ping/$RUNPOD_POD_ID?gpu=A100",
    "RUNPOD_AI_API_KEY": "rpa_key",
    "RUNPOD_POD_ID": "w1",
    "RUNPOD_PING_INTERVAL": "1000",
}


def env(**overrides: str | None) -> dict[str, str]:
    """The recommended fake wiring, with *overrides* (None removes a variable)."""
    out = dict(WIRING)
    for name, value in overrides.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


# --- GET_JOB: take, batch and stop URLs ---------------------------------------------------


def test_get_job_id_becomes_worker_id_and_query_is_kept() -> None:
    config = platform_from_env(env())
    assert config.worker_id == "w1"
    assert config.take_url == f"{H}/job-take/w1?gpu=A100"
    assert config.queue_mode


def test_batch_and_stop_urls_replace_job_take() -> None:
    config = platform_from_env(env())
    assert config.batch_take_url == f"{H}/job-take-batch/w1?gpu=A100"
    assert config.stop_url == f"{H}/job-stop/w1?gpu=A100"


def test_every_id_placeholder_in_get_job_is_replaced() -> None:
    config = platform_from_env(env(RUNPOD_WEBHOOK_GET_JOB=f"{H}/job-take/$ID?w=$ID"))
    assert config.take_url == f"{H}/job-take/w1?w=w1"


def test_get_job_substitutes_only_id_not_pod_id() -> None:
    # docs/protocol.md §1.1: "Nothing else is substituted" in GET_JOB.
    url = f"{H}/job-take/$RUNPOD_POD_ID?gpu=$RUNPOD_GPU_TYPE_ID"
    config = platform_from_env(env(RUNPOD_WEBHOOK_GET_JOB=url))
    assert config.take_url == url


def test_get_job_without_job_take_disables_stop_and_batches_on_same_url() -> None:
    config = platform_from_env(env(RUNPOD_WEBHOOK_GET_JOB=f"{H}/take/$ID?gpu=A100"))
    assert config.take_url == f"{H}/take/w1?gpu=A100"
    assert config.stop_url is None
    assert config.batch_take_url == config.take_url


@pytest.mark.parametrize("value", [None, ""])
def test_get_job_unset_or_empty_is_local_mode(value: str | None) -> None:
    config = platform_from_env(env(RUNPOD_WEBHOOK_GET_JOB=value))
    assert config.take_url is None
    assert config.batch_take_url is None
    assert config.stop_url is None
    assert not config.queue_mode


@pytest.mark.parametrize("value", ["None", "platform.test/job-take/$ID", "ftp://h/job-take/$ID"])
def test_get_job_not_http_is_rejected_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigurationError, match="RUNPOD_WEBHOOK_GET_JOB"):
        platform_from_env(env(RUNPOD_WEBHOOK_GET_JOB=value))


def test_https_get_job_is_accepted() -> None:
    config = platform_from_env(env(RUNPOD_WEBHOOK_GET_JOB="https://p.test/job-take/$ID?g=1"))
    assert config.take_url == "https://p.test/job-take/w1?g=1"


# --- POST_OUTPUT / POST_STREAM ------------------------------------------------------------


def test_done_and_stream_templates_have_pod_id_replaced_at_start_only() -> None:
    config = platform_from_env(env())
    assert config.done_template == f"{H}/job-done/w1/$ID?gpu=A100"
    assert config.stream_template == f"{H}/job-stream/w1/$ID?gpu=A100"


def test_done_url_replaces_job_id_and_appends_is_stream_with_ampersand() -> None:
    config = platform_from_env(env())
    assert config.done_url("j-1", is_stream=False) == f"{H}/job-done/w1/j-1?gpu=A100&isStream=false"
    assert config.done_url("j-1", is_stream=True) == f"{H}/job-done/w1/j-1?gpu=A100&isStream=true"


def test_stream_url_always_says_is_stream_false() -> None:
    # docs/protocol.md §2.4: stream chunks are sent with isStream=false.
    config = platform_from_env(env())
    assert config.stream_url("j-2") == f"{H}/job-stream/w1/j-2?gpu=A100&isStream=false"


def test_template_without_query_gets_a_question_mark() -> None:
    config = platform_from_env(
        env(
            RUNPOD_WEBHOOK_POST_OUTPUT=f"{H}/job-done/$RUNPOD_POD_ID/$ID",
            RUNPOD_WEBHOOK_POST_STREAM=f"{H}/job-stream/$RUNPOD_POD_ID/$ID",
        )
    )
    assert config.done_url("j", is_stream=True) == f"{H}/job-done/w1/j?isStream=true"
    assert config.stream_url("j") == f"{H}/job-stream/w1/j?isStream=false"


def test_done_template_without_job_id_placeholder_is_refused() -> None:
    # The reference's local simulator has no $ID in the done URL: every job would be
    # reported to one URL, so the platform could not tell them apart (docs/protocol.md §1.5).
    with pytest.raises(ConfigurationError, match=r"RUNPOD_WEBHOOK_POST_OUTPUT.*\$ID"):
        platform_from_env(env(RUNPOD_WEBHOOK_POST_OUTPUT=f"{H}/job-done?gpu=A100"))
    with pytest.raises(ConfigurationError, match=r"RUNPOD_WEBHOOK_POST_STREAM.*\$ID"):
        platform_from_env(env(RUNPOD_WEBHOOK_POST_STREAM=f"{H}/job-stream?gpu=A100"))


@pytest.mark.parametrize("value", [None, ""])
def test_post_output_unset_in_queue_mode_is_refused(value: str | None) -> None:
    # The reference starts and loses every result to the literal JOB_DONE_URL.
    with pytest.raises(ConfigurationError, match="RUNPOD_WEBHOOK_POST_OUTPUT"):
        platform_from_env(env(RUNPOD_WEBHOOK_POST_OUTPUT=value))


def test_post_stream_unset_is_derived_from_the_job_done_url() -> None:
    config = platform_from_env(env(RUNPOD_WEBHOOK_POST_STREAM=None))
    assert config.stream_template == f"{H}/job-stream/w1/$ID?gpu=A100"
    assert config.stream_url("j") == f"{H}/job-stream/w1/j?gpu=A100&isStream=false"


def test_post_stream_unset_and_not_derivable_is_refused() -> None:
    environ = env(RUNPOD_WEBHOOK_POST_STREAM=None, RUNPOD_WEBHOOK_POST_OUTPUT=f"{H}/done/$ID")
    with pytest.raises(ConfigurationError, match="RUNPOD_WEBHOOK_POST_STREAM"):
        platform_from_env(environ)


BAD_URLS = [
    "JOB_DONE_URL",
    "/v2/ep/job-done/$ID",
    "ftp://h/job-done/$ID",
    "http:///job-done/$ID",
    "http://:80/job-done/$ID",
    "http://h:port/job-done/$ID",
    "http://h/job done/$ID",
    "http://h/job-done/$ID\r\nX-Evil: 1",
    "http://h/job-done/$ID\x00",
    "http://[::1/job-done/$ID",
]
URL_VARIABLES = [
    "RUNPOD_WEBHOOK_GET_JOB",
    "RUNPOD_WEBHOOK_POST_OUTPUT",
    "RUNPOD_WEBHOOK_POST_STREAM",
    "RUNPOD_WEBHOOK_PING",
]


@pytest.mark.parametrize("name", URL_VARIABLES)
@pytest.mark.parametrize("value", BAD_URLS)
def test_every_url_must_be_absolute_http_with_a_host(name: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match=name) as caught:
        platform_from_env(env(**{name: value}))
    assert "\n" not in str(caught.value).replace("\\n", "")


def test_credentials_in_a_refused_url_are_not_shown() -> None:
    with pytest.raises(ConfigurationError, match="RUNPOD_WEBHOOK_PING") as caught:
        platform_from_env(env(RUNPOD_WEBHOOK_PING="http://user:s3cret@h:port/ping"))
    assert "s3cret" not in str(caught.value)


def test_urls_are_not_checked_in_local_mode() -> None:
    # Without GET_JOB the worker runs locally and never posts: nothing to refuse.
    environ = env(RUNPOD_WEBHOOK_GET_JOB=None, RUNPOD_WEBHOOK_POST_OUTPUT=None)
    assert platform_from_env({**environ, "RUNPOD_WEBHOOK_PING": "nope"}).take_url is None


@pytest.mark.parametrize(
    "key",
    ["rpa_k\ney", "rpa_k\rey", "rpa\x00", "rpa\tkey", "rpa\x7f", "rpa\x1b[0m", "rpa\x85", "clé"],
)
def test_api_key_with_control_or_non_ascii_characters_is_refused_without_showing_it(
    key: str,
) -> None:
    with pytest.raises(ConfigurationError, match="RUNPOD_AI_API_KEY") as caught:
        platform_from_env(env(RUNPOD_AI_API_KEY=key))
    assert "rpa" not in str(caught.value) and "clé" not in str(caught.value)


def test_job_id_per_request_does_not_touch_the_template() -> None:
    config = platform_from_env(env())
    config.done_url("first", is_stream=False)
    assert config.done_url("second", is_stream=False).startswith(f"{H}/job-done/w1/second?")
    assert "$ID" in config.done_template


# --- PING ---------------------------------------------------------------------------------


def test_ping_url_has_pod_id_replaced() -> None:
    assert platform_from_env(env()).ping_url == f"{H}/ping/w1?gpu=A100"


@pytest.mark.parametrize("value", [None, ""])
def test_ping_url_unset_means_no_heartbeat(value: str | None) -> None:
    assert platform_from_env(env(RUNPOD_WEBHOOK_PING=value)).ping_url is None


# --- worker id, key, hostname -------------------------------------------------------------


@pytest.mark.parametrize("value", [None, ""])
def test_missing_pod_id_gives_a_uuid_used_in_every_url(value: str | None) -> None:
    config = platform_from_env(env(RUNPOD_POD_ID=value))
    parsed = uuid.UUID(config.worker_id)
    assert str(parsed) == config.worker_id
    assert config.take_url == f"{H}/job-take/{config.worker_id}?gpu=A100"
    assert config.ping_url == f"{H}/ping/{config.worker_id}?gpu=A100"
    assert config.done_template == f"{H}/job-done/{config.worker_id}/$ID?gpu=A100"


def test_uuid_fallback_differs_between_starts() -> None:
    first = platform_from_env(env(RUNPOD_POD_ID=None)).worker_id
    second = platform_from_env(env(RUNPOD_POD_ID=None)).worker_id
    assert first != second


def test_api_key_is_read_verbatim_and_defaults_to_empty() -> None:
    assert platform_from_env(env(RUNPOD_AI_API_KEY="  k with spaces ")).api_key == (
        "  k with spaces "
    )
    assert platform_from_env(env(RUNPOD_AI_API_KEY=None)).api_key == ""


def test_hostname_from_env_else_the_machine() -> None:
    assert platform_from_env(env(RUNPOD_POD_HOSTNAME="gpu-7")).hostname == "gpu-7"
    assert platform_from_env(env()).hostname == socket.gethostname()


def test_endpoint_id() -> None:
    assert platform_from_env(env(RUNPOD_ENDPOINT_ID="ep1")).endpoint_id == "ep1"
    assert platform_from_env(env()).endpoint_id is None


# --- RUNPOD_PING_INTERVAL (milliseconds) --------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("1000", 1.0), ("10000", 10.0), ("2500", 2.5), ("500", 0.5), ("1", 0.001), (" 750 ", 0.75)],
)
def test_ping_interval_is_milliseconds_including_below_one_second(raw: str, seconds: float) -> None:
    # Below 1000 the reference floors to 0 and kills its heartbeat (docs/protocol.md §8 item 17).
    assert platform_from_env(env(RUNPOD_PING_INTERVAL=raw)).ping_interval == seconds


@pytest.mark.parametrize("value", [None, ""])
def test_ping_interval_default(value: str | None) -> None:
    config = platform_from_env(env(RUNPOD_PING_INTERVAL=value))
    assert config.ping_interval == DEFAULT_PING_INTERVAL_MS / 1000 == 10.0


@pytest.mark.parametrize("raw", ["abc", "0", "-5", "1.5", "10s"])
def test_bad_ping_interval_is_rejected_naming_the_variable(raw: str) -> None:
    with pytest.raises(ConfigurationError, match="RUNPOD_PING_INTERVAL") as info:
        platform_from_env(env(RUNPOD_PING_INTERVAL=raw))
    assert isinstance(info.value, ValueError)


# --- log levels ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "level"),
    [
        ("WARNING", logging.WARNING),
        ("warning", logging.WARNING),
        ("WARN", logging.WARNING),
        ("info", logging.INFO),
        (" Debug ", logging.DEBUG),
        ("TRACE", logging.DEBUG),
        ("NOTSET", logging.NOTSET),
        ("ERROR", logging.ERROR),
        ("CRITICAL", logging.CRITICAL),
    ],
)
def test_log_level_names(raw: str, level: int) -> None:
    assert log_level_from({"RUNPOD_LOG_LEVEL": raw}, None) == level


@pytest.mark.parametrize(
    ("raw", "level"),
    [
        ("0", logging.NOTSET),
        ("1", logging.DEBUG),
        ("2", logging.DEBUG),
        ("3", logging.INFO),
        ("4", logging.WARNING),
        ("5", logging.ERROR),
    ],
)
def test_log_level_index_form(raw: str, level: int) -> None:
    assert log_level_from({"RUNPOD_LOG_LEVEL": raw}, None) == level


@pytest.mark.parametrize("raw", ["6", "-1", "LOUD", "3.0", "WARNINGS"])
def test_bad_log_level_names_the_variable(raw: str) -> None:
    with pytest.raises(ConfigurationError, match="RUNPOD_LOG_LEVEL") as info:
        log_level_from({"RUNPOD_LOG_LEVEL": raw}, None)
    assert repr(raw) in str(info.value)


def test_debug_level_is_the_fallback_and_is_named_when_bad() -> None:
    assert log_level_from({"RUNPOD_DEBUG_LEVEL": "ERROR"}, None) == logging.ERROR
    assert log_level_from({"RUNPOD_LOG_LEVEL": "", "RUNPOD_DEBUG_LEVEL": "4"}, None) == (
        logging.WARNING
    )
    with pytest.raises(ConfigurationError, match="RUNPOD_DEBUG_LEVEL"):
        log_level_from({"RUNPOD_DEBUG_LEVEL": "nope"}, None)


def test_log_level_precedence_cli_then_log_level_then_debug_level() -> None:
    environ = {"RUNPOD_LOG_LEVEL": "ERROR", "RUNPOD_DEBUG_LEVEL": "DEBUG"}
    assert log_level_from(environ, "warning") == logging.WARNING
    assert log_level_from(environ, None) == logging.ERROR
    with pytest.raises(ConfigurationError, match="--rp_log_level"):
        log_level_from(environ, "bogus")


def test_log_level_default_is_info() -> None:
    assert log_level_from({}, None) == logging.INFO


# --- CLI ----------------------------------------------------------------------------------


def test_cli_defaults() -> None:
    assert parse_cli([]) == LocalArgs(
        test_input=None,
        log_level=None,
        serve_api=False,
        api_host=DEFAULT_API_HOST,
        api_port=DEFAULT_API_PORT,
        debugger=False,
    )


@pytest.mark.parametrize(
    "document",
    [{"input": {"prompt": "hi", "n": 2}}, {"input": None}, [1, 2], "text", 3, None],
)
def test_cli_test_input_is_parsed_as_json(document: object) -> None:
    text = json.dumps(document)
    assert parse_cli(["--test_input", text]).test_input == document
    assert parse_cli([f"--test_input={text}"]).test_input == document


def test_cli_bad_test_input_json_names_the_flag() -> None:
    with pytest.raises(ConfigurationError, match="--test_input"):
        parse_cli(["--test_input", "{'input': 1}"])


@pytest.mark.parametrize("port", ["abc", "80.5", ""])
def test_cli_port_not_a_number_names_the_flag(port: str) -> None:
    with pytest.raises(ConfigurationError, match="--rp_api_port") as info:
        parse_cli(["--rp_api_port", port])
    assert repr(port) in str(info.value)


def test_cli_serve_api_flags() -> None:
    args = parse_cli(
        [
            "--rp_serve_api",
            "--rp_api_host",
            "0.0.0.0",
            "--rp_api_port",
            "9001",
            "--rp_log_level",
            "DEBUG",
            "--rp_debugger",
        ]
    )
    assert args.serve_api
    assert args.api_host == "0.0.0.0"
    assert args.api_port == 9001
    assert args.log_level == "DEBUG"
    assert args.debugger


def test_cli_unknown_flags_and_positionals_are_ignored() -> None:
    args = parse_cli(
        ["handler.py", "--model", "llama", "--verbose", "--test_input", '{"input": 1}', "-x"]
    )
    assert args.test_input == {"input": 1}
    assert args.serve_api is False
    assert args.api_port == DEFAULT_API_PORT


def test_cli_unknown_flag_that_prefixes_ours_is_ignored() -> None:
    assert parse_cli(["--test", '{"input": 1}']).test_input is None


def test_cli_unknown_ambiguous_prefix_flag_is_ignored() -> None:
    assert parse_cli(["--rp_api"]) == parse_cli([])


# --- test_input.json ----------------------------------------------------------------------


def test_test_input_file_missing_is_none(tmp_path: Path) -> None:
    assert read_test_input_file(tmp_path) is None


def test_test_input_file_is_read(tmp_path: Path) -> None:
    document = {"input": {"prompt": "caf\u00e9"}, "id": "local"}
    (tmp_path / "test_input.json").write_text(json.dumps(document), encoding="utf-8")
    assert read_test_input_file(tmp_path) == document


def test_test_input_file_bad_json_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "test_input.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"test_input\.json"):
        read_test_input_file(tmp_path)


def test_test_input_directory_is_not_a_file(tmp_path: Path) -> None:
    (tmp_path / "test_input.json").mkdir()
    assert read_test_input_file(tmp_path) is None


# --- with_query ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://h/a", "http://h/a?p=1"),
        ("http://h/a?", "http://h/a?&p=1"),
        ("http://h/a?x=2", "http://h/a?x=2&p=1"),
    ],
)
def test_with_query(url: str, expected: str) -> None:
    assert with_query(url, "p=1") == expected


# --- Timings ------------------------------------------------------------------------------

TIMING_FIELDS = [field.name for field in dataclasses.fields(Timings)]


def test_timings_defaults_are_valid_and_positive() -> None:
    timings = Timings()
    for name in TIMING_FIELDS:
        assert getattr(timings, name) > 0, name
    assert Timings(shutdown_grace=5.0).shutdown_grace == 5.0


@pytest.mark.parametrize("name", TIMING_FIELDS)
def test_timings_reject_negative_values_naming_the_field(name: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        Timings(**{name: -1})


@pytest.mark.parametrize("name", TIMING_FIELDS)
def test_timings_reject_non_numbers_naming_the_field(name: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        Timings(**{name: "5"})  # type: ignore[arg-type]


WHOLE_COUNTS = ("stop_memory_size",)
POSITIVE = ("report_min_rate",)  # a rate: zero would make every attempt's timeout infinite


@pytest.mark.parametrize("name", [n for n in TIMING_FIELDS if n not in WHOLE_COUNTS + POSITIVE])
def test_timings_accept_zero(name: str) -> None:
    assert getattr(Timings(**{name: 0}), name) == 0


@pytest.mark.parametrize("name", WHOLE_COUNTS)
def test_timings_counts_at_least_one(name: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        Timings(**{name: 0})
    with pytest.raises(ConfigurationError, match=name):
        Timings(**{name: 1.5})  # type: ignore[arg-type]
    assert getattr(Timings(**{name: 1}), name) == 1


def test_timings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Timings().shutdown_grace = 1.0  # type: ignore[misc]


def test_timings_reject_nan() -> None:
    with pytest.raises(ConfigurationError, match="report_deadline"):
        Timings(report_deadline=math.nan)


def test_timings_report_min_rate_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="report_min_rate"):
        Timings(report_min_rate=0)
    assert Timings(report_min_rate=0.5).report_attempt_bound(1) == 10.0 + 2.0


# --- Settings -----------------------------------------------------------------------------


def test_settings_from_environ_reads_everything_from_the_given_mapping() -> None:
    settings = Settings.from_environ(env(RUNPOD_LOG_LEVEL="ERROR"))
    assert settings.platform.worker_id == "w1"
    assert settings.log_level == logging.ERROR
    assert settings.timings == Timings()
    assert settings.capture_logs == "on"


def test_settings_explicit_log_level_wins_over_env() -> None:
    settings = Settings.from_environ(env(RUNPOD_LOG_LEVEL="nonsense"), log_level=logging.DEBUG)
    assert settings.log_level == logging.DEBUG


def test_settings_reject_bad_capture_mode() -> None:
    with pytest.raises(ConfigurationError, match="capture_logs"):
        Settings.from_environ(env(), capture_logs="sometimes")  # type: ignore[arg-type]


def test_settings_propagate_env_errors() -> None:
    with pytest.raises(ConfigurationError, match="RUNPOD_PING_INTERVAL"):
        Settings.from_environ(env(RUNPOD_PING_INTERVAL="abc"))


def test_every_route_url_is_built_by_the_platform_config() -> None:
    config = platform_from_env(
        {
            "RUNPOD_POD_ID": "w1",
            "RUNPOD_WEBHOOK_GET_JOB": "https://api/v2/e/job-take/$ID?gpu=a",
            "RUNPOD_WEBHOOK_POST_OUTPUT": "https://api/v2/e/job-done/$RUNPOD_POD_ID/$ID",
        }
    )
    assert config.take_request_url(1, in_progress=True) == (
        "https://api/v2/e/job-take/w1?gpu=a&job_in_progress=1"
    )
    assert config.take_request_url(3, in_progress=False) == (
        "https://api/v2/e/job-take-batch/w1?gpu=a&batch_size=3&job_in_progress=0"
    )
    assert config.done_url("j", is_stream=True) == "https://api/v2/e/job-done/w1/j?isStream=true"


# --- the worker's identity: pod id, endpoint id, hostname (docs/security.md) --------------


@pytest.mark.parametrize("name", ["RUNPOD_POD_ID", "RUNPOD_ENDPOINT_ID", "RUNPOD_POD_HOSTNAME"])
@pytest.mark.parametrize("value", ["w1\r\nX-Forged: 1", "w 1", "w\x00", "wé", "w" * 257])
def test_identity_variables_that_no_url_or_header_can_carry_are_refused_by_name(
    name: str, value: str
) -> None:
    # Before: accepted; a CR/LF in the pod id left take and done working while every
    # ping failed.
    with pytest.raises(ConfigurationError, match=f"^{name} must be printable ASCII"):
        platform_from_env(env(**{name: value}))


def test_identity_variables_are_checked_in_local_mode_too() -> None:
    with pytest.raises(ConfigurationError, match=r"^RUNPOD_POD_ID"):
        platform_from_env({"RUNPOD_POD_ID": "w\n1"})


def test_url_characters_in_the_pod_id_are_percent_encoded_in_every_url() -> None:
    # Before: "w?x=1" put "x=1" and the rest of the path in the query string.
    config = platform_from_env(env(RUNPOD_POD_ID="w?x=1#f/g&h"))
    encoded = "w%3Fx%3D1%23f%2Fg%26h"
    assert config.worker_id == "w?x=1#f/g&h"  # as is in error payloads (JSON)
    assert config.take_url == f"{H}/job-take/{encoded}?gpu=A100"
    assert config.stop_url == f"{H}/job-stop/{encoded}?gpu=A100"
    assert config.done_url("j1", is_stream=False) == (
        f"{H}/job-done/{encoded}/j1?gpu=A100&isStream=false"
    )
    assert config.ping_url == f"{H}/ping/{encoded}?gpu=A100"


def test_identity_variables_that_the_platform_issues_are_unchanged() -> None:
    config = platform_from_env(
        env(RUNPOD_POD_ID="abc123-x_y.z~", RUNPOD_ENDPOINT_ID="ep-1", RUNPOD_POD_HOSTNAME="h-1")
    )
    assert config.take_url == f"{H}/job-take/abc123-x_y.z~?gpu=A100"
    assert (config.endpoint_id, config.hostname) == ("ep-1", "h-1")

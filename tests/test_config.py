"""Configuration: the ping interval, log levels, :class:`Timings` validation and
:class:`Settings` (docs/protocol.md §1). The URLs and the worker's identity:
tests/test_config_urls.py; the CLI and ``test_input.json``: tests/test_config_cli.py."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING

import pytest

from trio_worker._config import (
    DEFAULT_PING_INTERVAL_MS,
    Settings,
    Timings,
    platform_from_env,
)
from trio_worker._exceptions import ConfigurationError
from trio_worker._flags import log_level_from
from trio_worker._platform._client import report_attempt_bound

if TYPE_CHECKING:
    pass

from .config_env import env

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
    assert report_attempt_bound(Timings(report_min_rate=0.5), 1) == 10.0 + 2.0


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

"""Configuration: the reference's CLI flags and ``test_input.json``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from trio_worker._exceptions import ConfigurationError
from trio_worker._flags import (
    DEFAULT_API_HOST,
    DEFAULT_API_PORT,
    LocalArgs,
    parse_cli,
    read_test_input_file,
)

if TYPE_CHECKING:
    from pathlib import Path


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

"""Configuration: the platform's URLs and the worker's identity from the environment,
placeholder rules included (docs/protocol.md §1, §1.5)."""

from __future__ import annotations

import socket
import uuid
from typing import TYPE_CHECKING

import pytest

from trio_worker._config import PlatformConfig, Timings, platform_from_env, with_query
from trio_worker._exceptions import ConfigurationError
from trio_worker._platform._client import PlatformClient

if TYPE_CHECKING:
    pass

from .config_env import H, env


def routes(config: PlatformConfig) -> PlatformClient:
    """The client that builds every route's URL from the config's templates."""
    return PlatformClient(config, Timings())


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
    client = routes(platform_from_env(env()))
    assert client.done_url("j-1", is_stream=False) == f"{H}/job-done/w1/j-1?gpu=A100&isStream=false"
    assert client.done_url("j-1", is_stream=True) == f"{H}/job-done/w1/j-1?gpu=A100&isStream=true"


def test_stream_url_always_says_is_stream_false() -> None:
    # docs/protocol.md §2.4: stream chunks are sent with isStream=false.
    config = platform_from_env(env())
    assert routes(config).stream_url("j-2") == f"{H}/job-stream/w1/j-2?gpu=A100&isStream=false"


def test_template_without_query_gets_a_question_mark() -> None:
    config = platform_from_env(
        env(
            RUNPOD_WEBHOOK_POST_OUTPUT=f"{H}/job-done/$RUNPOD_POD_ID/$ID",
            RUNPOD_WEBHOOK_POST_STREAM=f"{H}/job-stream/$RUNPOD_POD_ID/$ID",
        )
    )
    assert routes(config).done_url("j", is_stream=True) == f"{H}/job-done/w1/j?isStream=true"
    assert routes(config).stream_url("j") == f"{H}/job-stream/w1/j?isStream=false"


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
    assert routes(config).stream_url("j") == f"{H}/job-stream/w1/j?gpu=A100&isStream=false"


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
    routes(config).done_url("first", is_stream=False)
    assert routes(config).done_url("second", is_stream=False).startswith(f"{H}/job-done/w1/second?")
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


def test_every_route_url_is_built_by_the_platform_client() -> None:
    config = platform_from_env(
        {
            "RUNPOD_POD_ID": "w1",
            "RUNPOD_WEBHOOK_GET_JOB": "https://api/v2/e/job-take/$ID?gpu=a",
            "RUNPOD_WEBHOOK_POST_OUTPUT": "https://api/v2/e/job-done/$RUNPOD_POD_ID/$ID",
        }
    )
    assert routes(config).take_url(1, in_progress=True) == (
        "https://api/v2/e/job-take/w1?gpu=a&job_in_progress=1"
    )
    assert routes(config).take_url(3, in_progress=False) == (
        "https://api/v2/e/job-take-batch/w1?gpu=a&batch_size=3&job_in_progress=0"
    )
    assert (
        routes(config).done_url("j", is_stream=True)
        == "https://api/v2/e/job-done/w1/j?isStream=true"
    )


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
    assert routes(config).done_url("j1", is_stream=False) == (
        f"{H}/job-done/{encoded}/j1?gpu=A100&isStream=false"
    )
    assert config.ping_url == f"{H}/ping/{encoded}?gpu=A100"


def test_identity_variables_that_the_platform_issues_are_unchanged() -> None:
    config = platform_from_env(
        env(RUNPOD_POD_ID="abc123-x_y.z~", RUNPOD_ENDPOINT_ID="ep-1", RUNPOD_POD_HOSTNAME="h-1")
    )
    assert config.take_url == f"{H}/job-take/abc123-x_y.z~?gpu=A100"
    assert (config.endpoint_id, config.hostname) == ("ep-1", "h-1")

"""Every knob of the worker: its default, and where it is read (environment, CLI, arguments).

The platform wiring comes from the same environment variables and CLI flags as the
reference SDK (docs/protocol.md §1), with its placeholder rules (docs/protocol.md §1.5):

* ``RUNPOD_WEBHOOK_GET_JOB``: ``$ID`` becomes the worker id; the batch-take and stop URLs are
  derived from it by replacing ``/job-take/``.
* ``RUNPOD_WEBHOOK_POST_OUTPUT`` / ``_POST_STREAM``: ``$RUNPOD_POD_ID`` becomes the worker id
  once; ``$ID`` becomes the job id per request.
* ``RUNPOD_WEBHOOK_PING``: ``$RUNPOD_POD_ID`` becomes the worker id.

Unlike the reference, a template without a ``?`` gets one, so query parameters never land in
the path, and bad values fail at start with a message naming the variable instead of
crashing at import (docs/protocol.md §8 items 17 and 22).

The worker's own internal timeouts live in :class:`Timings`, and the bounds on what the
network can make it hold in :class:`Limits`: value objects with named defaults, in the
manner of ``httpx.Timeout`` and ``httpx.Limits``. The reference's command line and log
level are read in ``_flags.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import uuid
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote, urlsplit

from ._capture import Redactor
from ._exceptions import ConfigurationError
from ._flags import log_level_from
from ._proxies import check_proxies, proxy_variables

if TYPE_CHECKING:
    from collections.abc import Mapping

# Defaults, named so the docs and the code cannot drift apart.
DEFAULT_PING_INTERVAL_MS = 10_000
DEFAULT_TAKE_POLL_BOUND = 90.0  # client bound on one take long-poll, as the reference
DEFAULT_STOP_POLL_BOUND = 90.0
# Once the worker stops (init failed, or shutdown_grace over), a report still gets this long.
DEFAULT_REPORT_DEADLINE = 10.0
DEFAULT_CLAIM_GRACE = 10.0  # the reference's init claim bound (docs/protocol.md §5.1)
DEFAULT_SHUTDOWN_GRACE = 20.0
# On shutdown a take in flight gets this long to answer before its deadline cuts it: a job
# already on the wire lands and runs, an empty long-poll is not waited on (docs/design.md §9, I8).
DEFAULT_TAKE_DRAIN = 0.5
DEFAULT_RATE_LIMIT_PAUSE = 5.0  # the reference's 429 debounce, when no Retry-After says
# Every Retry-After, on every route, is honoured within these (trio_worker/_pacing.py).
DEFAULT_RATE_LIMIT_FLOOR = 1.0
DEFAULT_RATE_LIMIT_CAP = 60.0
DEFAULT_ERROR_BACKOFF_MIN = 0.1
DEFAULT_ERROR_BACKOFF_MAX = 10.0
# A take or stop poll answered empty faster than this waits the rest (docs/protocol.md §5).
DEFAULT_EMPTY_POLL_FLOOR = 0.1
DEFAULT_CONNECT_TIMEOUT = 10.0  # one TCP (and TLS) connect to the platform
DEFAULT_REPORT_BACKOFF_MAX = 2.0  # cap of one wait between two attempts of a report
# A stop for an id not (yet) held is remembered this long, and at most this many: the take
# that delivers it may still be on the wire (the reference forgets it, docs/protocol.md §8).
DEFAULT_STOP_MEMORY = 120.0
DEFAULT_STOP_MEMORY_SIZE = 1024
DEFAULT_SYNC_CLOSE_BOUND = 5.0  # a sync generator's cleanup when its stream ends early
DEFAULT_EXIT_FLUSH_WATCHDOG = 5.0  # flushing logs at exit; os._exit follows regardless
# After the shutdown grace: start() exits this much later at the latest, whatever a handler
# or the event loop does, unless reports are still being delivered (docs/design.md §9).
DEFAULT_EXIT_WATCHDOG = 5.0
DEFAULT_LOGS_TAIL_CHARS = 16 * 1024
# Delivery (docs/design.md §5): a result is retried this long before it is given up, so a
# platform outage shorter than it loses nothing.
DEFAULT_REPORT_BUDGET = 300.0
# One attempt's timeout: this base plus the body's size at the slowest link we still serve.
DEFAULT_REPORT_ATTEMPT_TIMEOUT = 10.0
DEFAULT_REPORT_MIN_RATE = 1024.0 * 1024.0  # bytes per second
# How long a final report waits for the job's progress posts in flight before cutting them.
DEFAULT_PROGRESS_BOUND = 2.0
# One fitness check before the first take; generous, as a cold container may import torch
# and initialize CUDA within it, and too short a bound would retire a healthy host.
DEFAULT_FITNESS_CHECK_TIMEOUT = 120.0
# A load-balancing worker whose load failed answers /ping 503 this long before it exits, so
# the platform's health check sees why (docs/load-balancing.md).
DEFAULT_FAILURE_HOLD = 5.0
CaptureMode = Literal["on", "off"]


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds on what the network and the environment can make the worker hold, in bytes
    or characters (docs/protocol.md §2.0, docs/security.md).

    >>> Limits().take_answer // (1024 * 1024)
    64
    """

    # One take answer: a batch of jobs with large inputs.
    take_answer: int = 64 * 1024 * 1024
    # Any other answer: stop, ping, report acknowledgements.
    answer: int = 1024 * 1024
    # Of an answer refused as too large, this much is read: the ids a take answer names
    # there are failed as too large instead of lost.
    answer_head: int = 64 * 1024
    # The whole ping URL: fits the 8 KiB request line of nginx's and Apache's defaults
    # (docs/protocol.md §2.6); held ids past it take turns, ping by ping.
    ping_url: int = 8000
    # A job id, in characters (at most ~6 KiB once percent-encoded, docs/protocol.md §2.1).
    job_id: int = 512
    # RUNPOD_POD_ID, RUNPOD_ENDPOINT_ID, the hostname: far above what the platform issues,
    # far below what a request line carries.
    identity: int = 256


LIMITS = Limits()
# The names before Limits, for the modules that still read them.
MAX_TAKE_ANSWER_BYTES = LIMITS.take_answer
MAX_ANSWER_BYTES = LIMITS.answer
MAX_PING_URL_BYTES = LIMITS.ping_url


@dataclasses.dataclass(frozen=True)
class Timings:
    """The worker's internal timeouts, in seconds.

    >>> Timings(shutdown_grace=5.0).report_deadline
    10.0
    """

    take_poll_bound: float = DEFAULT_TAKE_POLL_BOUND
    stop_poll_bound: float = DEFAULT_STOP_POLL_BOUND
    report_deadline: float = DEFAULT_REPORT_DEADLINE
    claim_grace: float = DEFAULT_CLAIM_GRACE
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    take_drain: float = DEFAULT_TAKE_DRAIN
    rate_limit_pause: float = DEFAULT_RATE_LIMIT_PAUSE
    rate_limit_floor: float = DEFAULT_RATE_LIMIT_FLOOR
    rate_limit_cap: float = DEFAULT_RATE_LIMIT_CAP
    error_backoff_min: float = DEFAULT_ERROR_BACKOFF_MIN
    error_backoff_max: float = DEFAULT_ERROR_BACKOFF_MAX
    empty_poll_floor: float = DEFAULT_EMPTY_POLL_FLOOR
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    report_backoff_max: float = DEFAULT_REPORT_BACKOFF_MAX
    stop_memory: float = DEFAULT_STOP_MEMORY
    stop_memory_size: int = DEFAULT_STOP_MEMORY_SIZE
    sync_close_bound: float = DEFAULT_SYNC_CLOSE_BOUND
    exit_flush_watchdog: float = DEFAULT_EXIT_FLUSH_WATCHDOG
    exit_watchdog: float = DEFAULT_EXIT_WATCHDOG
    report_budget: float = DEFAULT_REPORT_BUDGET
    report_attempt_timeout: float = DEFAULT_REPORT_ATTEMPT_TIMEOUT
    report_min_rate: float = DEFAULT_REPORT_MIN_RATE
    progress_bound: float = DEFAULT_PROGRESS_BOUND
    fitness_check_timeout: float = DEFAULT_FITNESS_CHECK_TIMEOUT
    failure_hold: float = DEFAULT_FAILURE_HOLD

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"{field.name} must be a number >= 0, got {value!r}")
            if math.isnan(value) or value < 0:
                raise ConfigurationError(f"{field.name} must be a number >= 0, got {value!r}")
        if not isinstance(self.stop_memory_size, int) or self.stop_memory_size < 1:
            raise ConfigurationError(
                f"stop_memory_size must be a whole number >= 1, got {self.stop_memory_size!r}"
            )
        if self.report_min_rate <= 0:
            raise ConfigurationError(
                f"report_min_rate must be a number > 0, got {self.report_min_rate!r}"
            )


@dataclasses.dataclass(frozen=True)
class PlatformConfig:
    """The platform wiring, with every placeholder but the per-job ``$ID`` already applied."""

    worker_id: str
    hostname: str
    api_key: str
    take_url: str | None
    batch_take_url: str | None
    stop_url: str | None
    done_template: str
    stream_template: str
    ping_url: str | None
    ping_interval: float  # seconds
    endpoint_id: str | None
    # The proxy variables (trio_worker._proxies), read with the rest: every connection to
    # the platform (client, heartbeat, fitness check) follows them.
    proxies: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def queue_mode(self) -> bool:
        return self.take_url is not None

    @property
    def urls(self) -> tuple[str, ...]:
        """Every platform URL the worker may reach (the per-job ones as templates)."""
        urls = (self.take_url, self.stop_url, self.ping_url, self.done_template)
        return tuple(url for url in (*urls, self.stream_template) if url)


def with_query(url: str, param: str) -> str:
    """Append a query parameter; the reference's literal '&' needs a '?' already there."""
    return f"{url}{'&' if '?' in url else '?'}{param}"


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be an integer, got {raw!r}") from None


def without_credentials(url: str) -> str:
    """*url* for a log line or an error message: credentials in it (``user:pw@``) hidden."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.partition("@")
    return f"{scheme}{sep}***@{host}" if at and "/" not in userinfo else url


def _shown(url: str) -> str:
    return repr(without_credentials(url))


def _check_identity(name: str, value: str) -> str:
    """*value* of the variable *name*, checked: it goes into URLs, headers and payloads.

    A CR or LF in the pod id once left take and done working while every ping failed, and
    a ``?`` moved the rest of the id into the query string. Printable ASCII without
    spaces is accepted (and percent-encoded where it goes into a URL, as a job id is);
    anything else fails the start with this one line.
    """
    if (
        not value.isascii()
        or len(value) > LIMITS.identity
        or any(ch.isspace() or not ch.isprintable() for ch in value)
    ):
        shown = repr(value if len(value) <= 64 else value[:64] + "...")
        raise ConfigurationError(
            f"{name} must be printable ASCII without spaces, at most "
            f"{LIMITS.identity} characters, got {shown}"
        )
    return value


def _check_url(name: str, value: str) -> None:
    """An absolute http(s) URL with a host, nothing a request line could not carry."""
    shown = _shown(value)
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError as exc:
        raise ConfigurationError(f"{name} is not a usable URL ({exc}): {shown}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"{name} must be an absolute http(s) URL, got {shown}")
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise ConfigurationError(f"{name} contains whitespace or a control character: {shown}")


def _check_api_key(value: str) -> None:
    # Written verbatim into every request's Authorization header: a CR or LF would split
    # the header, anything outside printable ASCII cannot be sent. Never echo the key.
    if any(not (" " <= ch <= "~") for ch in value):
        raise ConfigurationError(
            "RUNPOD_AI_API_KEY contains a control or non-ASCII character (value not shown)"
        )


def _report_templates(environ: Mapping[str, str]) -> tuple[str, str]:
    """POST_OUTPUT and POST_STREAM, checked for queue mode (docs/protocol.md §1.1).

    An unset POST_STREAM is derived from POST_OUTPUT's ``/job-done/`` path, the wiring the
    platform hands out; the reference posts every chunk to a literal placeholder instead.
    """
    done = environ.get("RUNPOD_WEBHOOK_POST_OUTPUT") or ""
    if not done:
        raise ConfigurationError(
            "RUNPOD_WEBHOOK_POST_OUTPUT is not set: no job result could be reported"
        )
    stream = environ.get("RUNPOD_WEBHOOK_POST_STREAM") or ""
    if not stream:
        if "/job-done/" not in done:
            raise ConfigurationError(
                "RUNPOD_WEBHOOK_POST_STREAM is not set and cannot be derived from "
                "RUNPOD_WEBHOOK_POST_OUTPUT (no /job-done/ in it)"
            )
        stream = done.replace("/job-done/", "/job-stream/", 1)
    for name, value in (
        ("RUNPOD_WEBHOOK_POST_OUTPUT", done),
        ("RUNPOD_WEBHOOK_POST_STREAM", stream),
    ):
        _check_url(name, value)
        if "$ID" not in value:
            raise ConfigurationError(
                f"{name} has no $ID placeholder: every job would be reported to one URL"
            )
    return done, stream


def platform_from_env(environ: Mapping[str, str]) -> PlatformConfig:
    """Read the platform wiring from *environ* (docs/protocol.md §1.1 and §1.5).

    In queue mode (``RUNPOD_WEBHOOK_GET_JOB`` set) every URL the worker will need is
    checked here, so a bad one stops the worker before it takes a job it could not report.

    Raises:
        ConfigurationError: when a variable holds a value the worker cannot use; the
            message names the variable (and never shows the API key).
    """
    worker_id = _check_identity("RUNPOD_POD_ID", environ.get("RUNPOD_POD_ID") or str(uuid.uuid4()))
    # One path segment, as a job id is in its routes' URLs (_platform._client): checked
    # printable ASCII, so the standard library's quoting is the whole rule.
    in_url = quote(worker_id, safe="")
    endpoint_id = environ.get("RUNPOD_ENDPOINT_ID") or None
    if endpoint_id is not None:
        _check_identity("RUNPOD_ENDPOINT_ID", endpoint_id)
    if environ.get("RUNPOD_POD_HOSTNAME"):
        hostname = _check_identity("RUNPOD_POD_HOSTNAME", environ["RUNPOD_POD_HOSTNAME"])
    else:
        hostname = _check_identity("the hostname (socket.gethostname())", socket.gethostname())
    api_key = environ.get("RUNPOD_AI_API_KEY", "")
    _check_api_key(api_key)
    get_job = environ.get("RUNPOD_WEBHOOK_GET_JOB")
    take_url = batch_url = stop_url = None
    done, stream = "JOB_DONE_URL", "JOB_STREAM_URL"  # the reference's placeholders
    if get_job:
        _check_url("RUNPOD_WEBHOOK_GET_JOB", get_job)
        take_url = get_job.replace("$ID", in_url)
        if "/job-take/" in take_url:
            batch_url = take_url.replace("/job-take/", "/job-take-batch/")
            stop_url = take_url.replace("/job-take/", "/job-stop/")
        else:
            batch_url = take_url
        done, stream = _report_templates(environ)
    ping_ms = _env_int(environ, "RUNPOD_PING_INTERVAL", DEFAULT_PING_INTERVAL_MS)
    if ping_ms <= 0:
        raise ConfigurationError(
            f"RUNPOD_PING_INTERVAL is in milliseconds and must be > 0, got {ping_ms}"
        )
    ping = environ.get("RUNPOD_WEBHOOK_PING")
    if ping and get_job:
        _check_url("RUNPOD_WEBHOOK_PING", ping)
    return PlatformConfig(
        worker_id=worker_id,
        hostname=hostname,
        api_key=api_key,
        take_url=take_url,
        batch_take_url=batch_url,
        stop_url=stop_url,
        done_template=done.replace("$RUNPOD_POD_ID", in_url),
        stream_template=stream.replace("$RUNPOD_POD_ID", in_url),
        ping_url=ping.replace("$RUNPOD_POD_ID", in_url) if ping else None,
        ping_interval=ping_ms / 1000.0,
        endpoint_id=endpoint_id,
        proxies=proxy_variables(environ),
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the supervisor needs, resolved once at start."""

    platform: PlatformConfig
    timings: Timings
    redactor: Redactor
    capture_logs: CaptureMode = "on"
    logs_tail_chars: int = DEFAULT_LOGS_TAIL_CHARS
    log_level: int = logging.INFO

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        timings: Timings | None = None,
        capture_logs: CaptureMode = "on",
        log_level: int | None = None,
    ) -> Settings:
        env = os.environ if environ is None else environ
        if capture_logs not in ("on", "off"):
            raise ConfigurationError(f"capture_logs must be 'on' or 'off', got {capture_logs!r}")
        platform = platform_from_env(env)
        # A proxy it cannot use would fail every request: one line at start instead.
        check_proxies(platform.urls, platform.proxies)
        return cls(
            platform=platform,
            timings=timings or Timings(),
            redactor=Redactor.from_environ(env),
            capture_logs=capture_logs,
            log_level=log_level_from(env, None) if log_level is None else log_level,
        )

"""The package's exceptions.

::

    TrioWorkerError                 root; not raised itself
     ├── ConfigurationError         (also a ValueError) a setting is invalid; raised at start
     ├── InitializationError        serve(): the initializer failed or timed out; .failure
     ├── PlatformError              a platform route answered with an unusable status; .status
     │    └── RateLimited           429; .retry_after
     ├── TransportError             the platform could not be reached or spoke broken HTTP
     │                              (connect, TLS, a lost connection, bad framing, timeouts)
     │    └── AnswerTooLarge        an answer over its size bound; .size, .head (first bytes)
     └── WorkerInternalError        a bug in trio_worker itself, chained from the cause

    Named by a job's error report, never raised out of ``serve()``:

    MalformedJob (ValueError)       the platform's job could not be given to the handler
    AsyncioUnderTrio (RuntimeError) asyncio code ran on the trio backend; names the option
    TrioUnderAsyncio (RuntimeError) trio code ran on the asyncio backend; names the option

    InitFailure                     the record of an init failure (a value, not raised):
                                    what every held job is failed with
    InitTimeout                     the SDK's own init deadline fired; recorded as the error
                                    type of an init failure, never raised into user code

Cancellation is never subclassed or raised by this package (trio owns ``Cancelled``).
``serve()`` keeps its nursery's ExceptionGroups inside: it returns, or raises one of these.
"""

from __future__ import annotations

from dataclasses import dataclass


def exception_leaves(
    exc: BaseException, *, ignore: type[BaseException] | tuple[type[BaseException], ...] = ()
) -> list[BaseException]:
    """The exceptions inside *exc*, groups looked through at every depth (in order), less
    those of the types *ignore*; an exception that is not a group is its own one leaf.

    The package's one reading of an ExceptionGroup: what a nursery raised is judged by its
    leaves (all ``Cancelled``? one error alone? a ``SystemExit`` among them?).
    """
    if isinstance(exc, BaseExceptionGroup):
        return [
            leaf for member in exc.exceptions for leaf in exception_leaves(member, ignore=ignore)
        ]
    return [] if isinstance(exc, ignore) else [exc]


@dataclass(frozen=True)
class InitFailure:
    """Why the initializer failed: what every held job is failed with."""

    error_type: str
    message: str
    traceback: str
    category: str
    logs: str
    elapsed: float
    init_timeout: float | None
    failed_at: float  # trio.current_time() of the failure


class TrioWorkerError(Exception):
    """Root of the package's exceptions."""

    def __new__(cls, *args: object, **kwargs: object) -> TrioWorkerError:
        if cls is TrioWorkerError:
            raise TypeError("TrioWorkerError is abstract; raise a subclass")
        return super().__new__(cls, *args)


class ConfigurationError(TrioWorkerError, ValueError):
    """A setting is invalid; the message names the variable, flag or argument."""


class InitializationError(TrioWorkerError):
    """Raised by ``serve()`` after an init failure has been reported to every held job."""

    def __init__(self, failure: InitFailure) -> None:
        super().__init__(f"initializer failed: {failure.error_type}: {failure.message}")
        self.failure = failure


class InitTimeout(TrioWorkerError):
    """The SDK's own ``init_timeout`` expired (docs/design.md §4 I4)."""

    def __init__(self, limit: float) -> None:
        super().__init__(f"initializer did not finish within init_timeout={limit:g}s")
        self.limit = limit


class PlatformError(TrioWorkerError):
    """A platform route answered with a status the worker cannot use."""

    def __init__(self, route: str, status: int) -> None:
        super().__init__(f"{route} answered HTTP {status}")
        self.route = route
        self.status = status


class RateLimited(PlatformError):
    """The platform answered 429.

    ``retry_after`` is its ``Retry-After`` as parsed, in seconds, with no floor or cap
    applied (None when absent or unreadable): the wait before asking again is
    :func:`~trio_worker._pacing.rate_limit_wait`'s, the one rule for every route.
    """

    def __init__(self, route: str, retry_after: float | None) -> None:
        super().__init__(route, 429)
        self.retry_after = retry_after


class TransportError(TrioWorkerError):
    """A failure below HTTP: no connection, a lost one, or an answer that is not HTTP.

    Raised by the platform client whichever HTTP backend carries it, so the code above
    the client handles one family; the cause (an ``OSError``, an ``httpx`` error) is
    chained.
    """


class AnswerTooLarge(TransportError):
    """An answer over its size bound, refused unread past its first bytes: ``head`` holds
    at most ``Limits.answer_head`` of them, so the jobs a take answer names there can
    still be failed (docs/security.md); ``size`` is its declared size, or what was read."""

    def __init__(self, message: str, *, status: int, size: int, head: bytes) -> None:
        super().__init__(message)
        self.status = status
        self.size = size
        self.head = head


class WorkerInternalError(TrioWorkerError):
    """A bug in trio_worker; the cause is chained."""


class MalformedJob(ValueError):
    """The platform delivered a job the handler cannot be given (e.g. no ``input``)."""


class AsyncioUnderTrio(RuntimeError):
    """A handler used asyncio code (``asyncio.sleep``, an ``asyncio.Queue``, an asyncio
    library) while the worker runs its async code on trio; the message names
    ``async_backend``, and the asyncio error is chained."""


class TrioUnderAsyncio(RuntimeError):
    """A handler used trio code (``trio.sleep``, a nursery) while the worker runs its async
    code on asyncio; the message names ``async_backend``, and the trio error is chained."""

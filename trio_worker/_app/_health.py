"""What ``/ping`` answers, and when: the load-balancing worker's health, as a pure table.

The phases and their answers are docs/load-balancing.md's table, "What it does"; ``_ALLOWED``
is the only place a phase changes. READY is left only for DRAINING (a worker that served
never reports a load failure); FAILED and DRAINING are final, so ``/ping`` only ever moves
204 -> 200 -> not-200, or 204 -> not-200. No I/O, no clock: the serving tasks drive
:class:`Health` and the ASGI gate (``_gate``) reads it.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["RETRY_AFTER", "Answer", "Failure", "Health", "IllegalTransition", "Phase"]

#: Seconds a caller is told to wait (``Retry-After``) while the model loads.
RETRY_AFTER: Final = 5


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    DRAINING = "draining"


_ALLOWED: Final = {
    Phase.LOADING: frozenset({Phase.READY, Phase.FAILED, Phase.DRAINING}),
    Phase.READY: frozenset({Phase.DRAINING}),
    Phase.FAILED: frozenset(),
    Phase.DRAINING: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A phase change the table does not allow (a bug in the worker, never the user's)."""


@dataclass(frozen=True)
class Failure:
    """Why the load failed, as callers may see it: no output tail, the message redacted."""

    category: str
    error_type: str
    message: str


@dataclass(frozen=True)
class Answer:
    """A complete HTTP answer: status, extra headers and a JSON body (empty for 204)."""

    status: int
    body: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()


def _json(status: int, value: object, *headers: tuple[bytes, bytes]) -> Answer:
    return Answer(status, json.dumps(value).encode(), headers)


_NO_CONTENT: Final = Answer(204)
_HEALTHY: Final = _json(200, {"status": "healthy"})
_LOADING: Final = _json(
    503,
    {"error": "the model is loading; retry shortly", "status": "loading"},
    (b"retry-after", str(RETRY_AFTER).encode()),
)
_DRAINING: Final = _json(
    503,
    {"error": "the worker is shutting down", "status": "draining"},
    (b"connection", b"close"),
)


class Health:
    """The worker's phase, the failure that ended the load, and the answers they give."""

    def __init__(self) -> None:
        self.phase = Phase.LOADING
        self.failure: Failure | None = None
        self._failure_answer: Answer | None = None
        #: Called with the new phase after every change (tests wait on them).
        self.observers: list[Callable[[Phase], None]] = []

    def _changed(self) -> None:
        for observer in self.observers:
            observer(self.phase)

    def become(self, phase: Phase) -> None:
        """Move to *phase*; moving to the phase the worker is in does nothing.

        Raises:
            IllegalTransition: the table does not allow it (FAILED needs :meth:`fail`).
        """
        if phase is self.phase:
            return
        if phase not in _ALLOWED[self.phase] or phase is Phase.FAILED:
            raise IllegalTransition(f"{self.phase.name} -> {phase.name}")
        self.phase = phase
        self._changed()

    def fail(self, failure: Failure) -> None:
        """The load failed (LOADING -> FAILED); what /ping and the app routes say from now.

        Raises:
            IllegalTransition: the worker is not loading.
        """
        if Phase.FAILED not in _ALLOWED[self.phase]:
            raise IllegalTransition(f"{self.phase.name} -> FAILED")
        self.phase = Phase.FAILED
        self.failure = failure
        self._failure_answer = _json(
            503,
            {
                "error": f"the model failed to load: {failure.message}",
                "status": "failed",
                "error_category": failure.category,
                "error_type": failure.error_type,
            },
            (b"connection", b"close"),
        )
        self._changed()

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY

    def ping(self) -> Answer:
        """The answer to ``/ping`` in this phase (READY: unless the app has its own)."""
        if self.phase is Phase.LOADING:
            return _NO_CONTENT
        if self.phase is Phase.READY:
            return _HEALTHY
        return self.refusal()

    def refusal(self) -> Answer:
        """The answer to an app route while the app may not run (every phase but READY)."""
        if self.phase is Phase.LOADING:
            return _LOADING
        if self.phase is Phase.FAILED:
            assert self._failure_answer is not None
            return self._failure_answer
        return _DRAINING

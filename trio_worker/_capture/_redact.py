"""Redaction of secret values before any text leaves the process (docs/design.md §8).

A secret is the value of ``RUNPOD_AI_API_KEY`` or of any environment variable whose
name contains KEY, TOKEN, SECRET or PASSWORD. Values are matched literally; very short
values (under 4 characters) are skipped because replacing them would shred ordinary text
and they protect nothing anyway.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

REDACTED = "[REDACTED]"
_SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
_MIN_SECRET_LENGTH = 4


def secret_values(environ: Mapping[str, str]) -> list[str]:
    """The values in *environ* that count as secrets, longest first."""
    found: set[str] = set()
    for name, value in environ.items():
        upper = name.upper()
        is_secret = upper == "RUNPOD_AI_API_KEY" or any(p in upper for p in _SECRET_NAME_PARTS)
        if is_secret and len(value) >= _MIN_SECRET_LENGTH:
            found.add(value)
    # Longest first, so a secret that contains another is replaced whole.
    return sorted(found, key=len, reverse=True)


class Redactor:
    """Replaces every known secret value with ``[REDACTED]``.

    >>> Redactor(["hunter22"]).redact("password=hunter22")
    'password=[REDACTED]'
    """

    def __init__(self, secrets: list[str]) -> None:
        self._secrets = sorted(set(secrets), key=len, reverse=True)
        self._pattern = (
            re.compile("|".join(re.escape(s) for s in self._secrets)) if self._secrets else None
        )
        self._bytes_pattern = (
            re.compile(b"|".join(re.escape(s.encode()) for s in self._secrets))
            if self._secrets
            else None
        )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Redactor:
        return cls(secret_values(environ))

    @property
    def active(self) -> bool:
        return self._pattern is not None

    def redact(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(REDACTED, text)

    def redact_bytes(self, data: bytes) -> bytes:
        if self._bytes_pattern is None or not data:
            return data
        return self._bytes_pattern.sub(REDACTED.encode(), data)


# Text kept before a window only so that a secret straddling the cut is still matched whole.
# Longer than any credential we have met (API keys and tokens are well under 200 chars); a
# secret longer than this could show its tail at the very start of a window.
EDGE_CONTEXT = 4096


def redact_from(redactor: Redactor, text: str, start: int) -> str:
    """The redacted form of ``text[start:]``, using ``text[:start]`` only as context.

    A secret that straddles *start* comes out as (the start of) ``[REDACTED]``, not as the
    unmatched tail of the secret that redacting ``text[start:]`` alone would leave.
    """
    whole = redactor.redact(text)
    if start <= 0:
        return whole
    before = redactor.redact(text[:start])
    if whole.startswith(before):
        return whole[len(before) :]
    # The two redactions agree up to the straddling secret, where *whole* has [REDACTED]
    # and *before* the secret's head; anything cut from *whole* there on is safe.
    return whole[_common_prefix_length(whole, before) :]


def _common_prefix_length(a: str, b: str) -> int:
    # Binary search over C-level comparisons: a per-character Python loop (which is what
    # os.path.commonprefix does) would be slow over a 1 MiB window.
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a.startswith(b[:middle]):
            low = middle
        else:
            high = middle - 1
    return low

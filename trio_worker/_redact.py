"""Redaction of secret values before any text leaves the process (DESIGN §8).

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

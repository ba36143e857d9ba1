"""Redaction of secrets before any text leaves the process: which values are secrets, and
the `Redactor` (the rule: docs/design.md §8).

Not covered: a secret transformed otherwise, cut by a truncation before it reached us, or
not in the environment.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import unquote

from ._forms import combined_pattern

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

REDACTED = "[REDACTED]"
_MIN_SECRET_LENGTH = 4
_NAME_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL")
_NAME_SEGMENT = re.compile(r"(?:PASS|PWD)[0-9]*")
_NAME_SEPARATORS = re.compile(r"[^A-Z0-9]+")
# The shell's working directories: their names match PWD, their values are paths.
_NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD"})

# ``://user:password@``: the password runs to the authority's last ``@`` (an unencoded
# ``@`` in a password is common) and stops at whitespace and ``/?#`` (RFC 3986 §3.2).
# Anchored on ``://``, a literal the engine finds fast: the scan stays linear. The user name
# is kept: rarely secret, it tells the reader which account failed.
_URL_CREDENTIALS = re.compile(r"://([^\s/?#@:]*):([^\s/?#]+)@")
_URL_REPLACEMENT = r"://\1:" + REDACTED + "@"


def is_secret_name(name: str) -> bool:
    """Whether the variable *name* holds a credential."""
    upper = name.upper()
    if upper in _NOT_SECRET_NAMES:
        return False
    if any(word in upper for word in _NAME_WORDS):
        return True
    return any(_NAME_SEGMENT.fullmatch(part) for part in _NAME_SEPARATORS.split(upper))


def url_passwords(value: str) -> Iterator[str]:
    """The password of every URL with credentials in *value*, as written and decoded."""
    if "://" not in value:
        return
    for match in _URL_CREDENTIALS.finditer(value):
        written = match.group(2)
        yield written
        yield unquote(written)


def secret_values(environ: Mapping[str, str]) -> list[str]:
    """The values in *environ* that count as secrets, longest first."""
    found: set[str] = set()
    for name, value in environ.items():
        candidates = list(url_passwords(value))
        if is_secret_name(name):
            candidates.append(value)
        for candidate in candidates:
            found.update((candidate, candidate.strip()))
    # Longest first, so a secret that contains another is replaced whole.
    return sorted((s for s in found if len(s) >= _MIN_SECRET_LENGTH), key=len, reverse=True)


class Redactor:
    """Replaces every known secret, and every password in a URL, with ``[REDACTED]``."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # An empty secret would match between every two characters.
        found = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._pattern = re.compile(combined_pattern(found)) if found else None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Redactor:
        return cls(secret_values(environ))

    def redact(self, text: str) -> str:
        if not text:
            return text
        if self._pattern is not None:
            text = self._pattern.sub(REDACTED, text)
        return _URL_CREDENTIALS.sub(_URL_REPLACEMENT, text)


# Text kept before a window only so that a secret straddling the cut is still matched whole:
# far longer than any credential's most escaped form; a longer secret could show its tail
# at the very start of a window.
EDGE_CONTEXT = 4096


def redact_from(redactor: Redactor, text: str, start: int) -> str:
    """The redacted form of ``text[start:]``, using ``text[:start]`` only as context.

    A secret that straddles *start* comes out as (the start of) ``[REDACTED]``, not as the
    unmatched tail of the secret that redacting ``text[start:]`` alone would leave. The
    result is always a suffix of ``redactor.redact(text)``.
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
    # Binary search over C-level comparisons: a per-character Python loop (as
    # os.path.commonprefix's) would be slow over a 1 MiB window.
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a.startswith(b[:middle]):
            low = middle
        else:
            high = middle - 1
    return low


def char_start(data: bytes, index: int) -> int:
    """*index* moved back to the start of the UTF-8 character it falls in: where a window
    of encoded text may be cut before it is decoded and redacted (:func:`redact_from`)."""
    for _ in range(3):
        if 0 < index < len(data) and data[index] & 0xC0 == 0x80:
            index -= 1
    return index

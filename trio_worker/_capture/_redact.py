"""Redaction of secrets before any text leaves the process (docs/design.md §8).

Which values are secrets (``secret_values``):

- the value of every environment variable whose *name* says it holds a credential: it
  contains ``KEY``, ``TOKEN``, ``SECRET``, ``PASSWORD``, ``PASSWD``, ``PASSPHRASE`` or
  ``CREDENTIAL`` anywhere (``RUNPOD_AI_API_KEY``, ``HF_TOKEN``, ``APIKEY``), or has
  ``PASS`` or ``PWD`` (optionally followed by digits) as a whole word between
  non-alphanumeric separators (``DB_PASS``, ``PASS``, ``MYSQL_PWD``, ``SMTP_PASS2``, but
  not ``PASSENGER_COUNT``, ``COMPASS_DIR``, nor the shell's ``PWD``/``OLDPWD``, which are
  directories). Short words that are not whole words read too often as something else.
- in *every* variable, whatever its name, the password of each URL with credentials
  (``postgres://user:password@host/db``), as written and percent-decoded;
- each of these also without surrounding whitespace (a token read from a file keeps its
  newline; the libraries that send it strip it).

Values under 4 characters are skipped: replacing them would shred ordinary text, and they
protect nothing anyway.

How a secret is found: as written, and in every escaped form Python and JSON produce or
percent-encoded (``repr``, ``json.dumps``, ``quote``, a ``bytes`` repr; ``_forms`` builds
the pattern, linear in the text whatever it holds). One precompiled alternation holds
every secret, longest first, so a secret that contains another is replaced whole.

Independently of the environment, the password of any URL with credentials in the text
is replaced (``scheme://user:[REDACTED]@host``): a library may print a URL built from a
file the environment never saw. The user name is kept; it is rarely secret, and it tells
the reader which account failed.

Not covered: a secret transformed otherwise (base64, hashed, split over two lines, cut by
a truncation before it reached us) and secrets that are not in the environment.
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

# ``://user:password@``: the password runs to the authority's last ``@``, since an
# unencoded ``@`` in a password is common enough; it stops at whitespace and at ``/?#``,
# which end the authority (RFC 3986 §3.2). Anchored on ``://``, a literal the regex engine
# finds fast, so the scan stays linear.
_URL_CREDENTIALS = re.compile(r"://([^\s/?#@:]*):([^\s/?#]+)@")
_URL_REPLACEMENT = r"://\1:" + REDACTED + "@"


def is_secret_name(name: str) -> bool:
    """Whether the variable *name* holds a credential (see the module docstring).

    >>> [is_secret_name(n) for n in ("DB_PASS", "PASSENGER_COUNT", "HF_TOKEN", "PWD")]
    [True, False, True, False]
    """
    upper = name.upper()
    if upper in _NOT_SECRET_NAMES:
        return False
    if any(word in upper for word in _NAME_WORDS):
        return True
    return any(_NAME_SEGMENT.fullmatch(part) for part in _NAME_SEPARATORS.split(upper))


def url_passwords(value: str) -> Iterator[str]:
    """The password of every URL with credentials in *value*, as written and decoded.

    >>> list(url_passwords("postgres://app:p%40ss@db:5432/x"))
    ['p%40ss', 'p@ss']
    """
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
    """Replaces every known secret, and every password in a URL, with ``[REDACTED]``.

    >>> Redactor(["hunter22"]).redact("password=hunter22")
    'password=[REDACTED]'
    >>> Redactor([]).redact("postgres://app:hunter22@db/x")
    'postgres://app:[REDACTED]@db/x'
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        # An empty secret would match between every two characters.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._pattern = re.compile(combined_pattern(self._secrets)) if self._secrets else None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Redactor:
        return cls(secret_values(environ))

    @property
    def secrets(self) -> tuple[str, ...]:
        """The secret values, longest first."""
        return tuple(self._secrets)

    def redact(self, text: str) -> str:
        if not text:
            return text
        if self._pattern is not None:
            text = self._pattern.sub(REDACTED, text)
        return _URL_CREDENTIALS.sub(_URL_REPLACEMENT, text)


# Text kept before a window only so that a secret straddling the cut is still matched whole.
# Longer than any credential we have met (API keys and tokens are well under 200 chars, and
# their most escaped forms a few times that); a secret longer than this could show its tail
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


def char_start(data: bytes, index: int) -> int:
    """*index* moved back to the start of the UTF-8 character it falls in: where a window
    of encoded text may be cut before it is decoded and redacted (:func:`redact_from`)."""
    for _ in range(3):
        if 0 < index < len(data) and data[index] & 0xC0 == 0x80:
            index -= 1
    return index

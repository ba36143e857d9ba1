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

How a secret is found: each character of it may appear as itself or in any escaped form
Python and JSON produce (``\\n``, ``\\"``, ``\\\\``, ``\\xe9``, ``\\u00e9``, a surrogate
pair, the UTF-8 bytes of a ``bytes`` repr), with any number of backslashes (an escape
escaped again, as in JSON inside JSON), or percent-encoded (``%40``, ``+`` for a space),
hex digits in either case. So ``repr(secret)``, ``json.dumps(secret)``, ``quote(secret)``
and ``str(secret.encode())`` are all found. One precompiled alternation holds every
secret, longest first, so a secret that contains another is replaced whole; a secret of
ordinary characters stays a plain literal, which the regex engine searches fast.

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

# Characters no escaping scheme we match ever rewrites (RFC 3986 unreserved).
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_SHORT_ESCAPES = {
    "\n": "n",
    "\r": "r",
    "\t": "t",
    "\b": "b",
    "\f": "f",
    '"': '"',
    "'": "'",
    "/": "/",
}
# An escape's backslash, itself escaped any number of times (JSON inside JSON, a repr).
_BACKSLASHES = r"\\{1,16}"
# The first backslash of a match, not preceded by another: a match never starts inside a
# run of backslashes, so the scan stays linear (the raw character after a run longer than
# 16 still matches).
_RUN_START = r"\\(?<!\\\\)\\{0,15}"


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


def secret_pattern(secret: str) -> str:
    r"""A regular expression matching *secret* as written or in any escaped form.

    >>> secret_pattern("ab")
    'ab'
    >>> bool(re.fullmatch(secret_pattern('p"w'), 'p\\\\\\"w'))
    True
    """
    return "|".join(_alternatives(secret))


def _alternatives(secret: str) -> list[str]:
    """One alternative per form of the secret's first character, each starting with a
    plain character: the regex engine then skips, in C, every position where no secret can
    start, and rejects most others on their first character."""
    if not secret:
        return []
    rest = "".join(_char_pattern(c) for c in secret[1:])
    firsts = [
        _RUN_START + form[len(_BACKSLASHES) :] if form.startswith(_BACKSLASHES) else form
        for form in _char_forms(secret[0])
    ]
    return [first + rest for first in firsts]


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
        self._pattern = (
            re.compile("|".join(a for s in self._secrets for a in _alternatives(s)))
            if self._secrets
            else None
        )

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


def _char_pattern(char: str) -> str:
    if char in _PLAIN:
        return char
    return "(?:" + "|".join(_char_forms(char)) + ")"


def _char_forms(char: str) -> list[str]:
    """The forms one character of a secret may take, escapes first, so a match ends at the
    end of an escape rather than inside it."""
    if char in _PLAIN:
        return [char]
    code = ord(char)
    data = _utf8(char)
    forms: list[str] = []
    if char in _SHORT_ESCAPES:
        forms.append(_BACKSLASHES + re.escape(_SHORT_ESCAPES[char]))
    if code < 0x100:
        forms.append(_BACKSLASHES + "x" + _hex(code, 2))
    if code < 0x10000:
        forms.append(_BACKSLASHES + "u" + _hex(code, 4))
    else:
        high, low = divmod(code - 0x10000, 0x400)
        pair = _hex(0xD800 + high, 4) + _BACKSLASHES + "u" + _hex(0xDC00 + low, 4)
        forms += [_BACKSLASHES + "U" + _hex(code, 8), _BACKSLASHES + "u" + pair]
    if len(data) > 1:  # a bytes repr shows each UTF-8 byte
        forms.append("".join(_BACKSLASHES + "x" + _hex(b, 2) for b in data))
    forms.append("".join("%" + _hex(b, 2) for b in data))
    if char == " ":
        forms.append(r"\+")
    # Last, as raw: a backslash is itself or escaped any number of times.
    forms.append(_BACKSLASHES if char == "\\" else re.escape(char))
    return forms


def _utf8(char: str) -> bytes:
    """The bytes *char* was read from: a lone surrogate in an environment value stands for
    an undecodable byte (``surrogateescape``), any other was written as such."""
    try:
        return char.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return char.encode("utf-8", "surrogatepass")


def _hex(value: int, width: int) -> str:
    """*value* in hex, each letter digit in either case (``[eE]9``)."""
    return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{value:0{width}x}")


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

"""The regular expression that finds a secret as written or in any escaped form (the forms:
docs/design.md §8).

It runs on text the worker does not control, so its cost must stay linear whatever the
text. A regex that let adjacent characters share a run of backslashes any way they like
would backtrack through every split of the run, so no run is ever split two ways:

- the backslashes before an escape are taken possessively (``\\{1,16}+``): they can only
  belong to that escape;
- a run of *k* backslashes in the secret is one unit, matched atomically as the largest of
  *k*, 2k, 4k, 8k or 16k backslashes present. Every escaping pass (JSON or repr) doubles a
  backslash and gives an escape created by an earlier pass fewer backslashes than that, so
  the largest fitting multiple is the secret's own run and the rest is the next escape's;
- a match never starts inside a run of backslashes (a look-behind), so the scan does not
  retry a run at each of its positions.

Each secret contributes one alternative per form of its first character, each starting
with a plain character, so the engine skips, in C, every position where no secret can
start: a secret of ordinary characters is a plain literal.
"""

from __future__ import annotations

import re

__all__ = ["combined_pattern"]

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
_MAX_DOUBLINGS = 4  # 16 backslashes: an escape escaped four more times
# The backslashes of one escape, taken whole (possessive): see the module docstring.
_ESCAPE = r"\\{1,16}+"
# The same at the start of a match: the first backslash of a run, never one inside it.
_RUN_START = r"\\(?<!\\\\)"
_FIRST_ESCAPE = _RUN_START + r"\\{0,15}+"


def secret_alternatives(secret: str) -> list[str]:
    """The regular expressions that match *secret* in any form: one per form of its first
    character."""
    tokens = _tokens(secret)
    if not tokens:
        return []
    rest = "".join(_token_pattern(t) for t in tokens[1:])
    return [first + rest for first in _token_forms(tokens[0], first=True)]


def combined_pattern(secrets: list[str]) -> str:
    """One pattern for all *secrets*, in their order (put the longest first).

    The alternatives that start with a backslash share one look-behind, and those that
    start with an escape share its backslashes: text made of backslashes or escapes then
    costs one check per position and one per escape body, not one per form of each secret.
    """
    escapes: list[str] = []
    runs: list[str] = []
    other: list[str] = []
    for secret in secrets:
        for alternative in secret_alternatives(secret):
            if alternative.startswith(_FIRST_ESCAPE):
                escapes.append(alternative[len(_FIRST_ESCAPE) :])
            elif alternative.startswith(_RUN_START):
                runs.append(alternative[len(_RUN_START) :])
            else:
                other.append(alternative)
    # An alternative of *other* starts with a character that is not a backslash: it never
    # matches where the grouped ones can, so moving those to the end changes no match.
    backslashed = runs
    if escapes:
        backslashed = [_FIRST_ESCAPE[len(_RUN_START) :] + "(?:" + "|".join(escapes) + ")", *runs]
    if backslashed:
        other.append(_RUN_START + "(?:" + "|".join(backslashed) + ")")
    return "|".join(other)


def _tokens(secret: str) -> list[str]:
    """The secret's characters, each run of backslashes kept together as one token."""
    return re.findall(r"\\+|[^\\]", secret, flags=re.DOTALL)


def _token_pattern(token: str) -> str:
    forms = _token_forms(token, first=False)
    return forms[0] if len(forms) == 1 else "(?:" + "|".join(forms) + ")"


def _token_forms(token: str, *, first: bool) -> list[str]:
    """The forms of one token, longest-looking first, so a match ends at the end of an
    escape rather than inside it."""
    if token in _PLAIN:
        return [token]
    if token.startswith("\\"):
        return [_backslash_run(len(token), first=first), _percent(token)]
    escape = _FIRST_ESCAPE if first else _ESCAPE
    code = ord(token)
    data = _utf8(token)
    forms: list[str] = []
    if code > 0x7F:  # a bytes repr shows each UTF-8 byte; longer than \xHH, so first
        forms.append(
            (escape + "x" + _hex(data[0], 2))
            + "".join(_ESCAPE + "x" + _hex(b, 2) for b in data[1:])
        )
    if token in _SHORT_ESCAPES:
        forms.append(escape + re.escape(_SHORT_ESCAPES[token]))
    if code < 0x100:
        forms.append(escape + "x" + _hex(code, 2))
    if code < 0x10000:
        forms.append(escape + "u" + _hex(code, 4))
    else:
        high, low = divmod(code - 0x10000, 0x400)
        pair = _hex(0xD800 + high, 4) + _ESCAPE + "u" + _hex(0xDC00 + low, 4)
        forms += [escape + "U" + _hex(code, 8), escape + "u" + pair]
    forms.append(_percent(token))
    if token == " ":
        forms.append(r"\+")
    forms.append(re.escape(token))
    return forms


def _backslash_run(length: int, *, first: bool) -> str:
    """*length* backslashes, escaped 0 to 4 times: the largest multiple present, taken
    atomically (see the module docstring)."""
    counts = [length << n for n in range(_MAX_DOUBLINGS, -1, -1)]
    if first:  # the first backslash is matched outside the group, after the look-behind
        return _RUN_START + "(?>" + "|".join(rf"\\{{{c - 1}}}" for c in counts) + ")"
    return "(?>" + "|".join(rf"\\{{{c}}}" for c in counts) + ")"


def _percent(text: str) -> str:
    return "".join("%" + _hex(b, 2) for b in _utf8(text))


def _utf8(text: str) -> bytes:
    """The bytes *text* was read from: a lone surrogate in an environment value stands for
    an undecodable byte (``surrogateescape``), any other was written as such."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _hex(value: int, width: int) -> str:
    """*value* in hex, each letter digit in either case (``[eE]9``)."""
    return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{value:0{width}x}")

"""Text functions as PostgreSQL computes them under collation "C" (case mapping of ASCII letters only), the
conversions casts and type modifiers apply to text, and LIKE / ILIKE matching."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Final

from cdcd.filters.expr.errors import Unevaluable

_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER: Final = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def lower(s: str) -> str:
    return s.lower() if s.isascii() else s.translate(_ASCII_LOWER)


def upper(s: str) -> str:
    return s.upper() if s.isascii() else s.translate(_ASCII_UPPER)


def rtrim_spaces(s: str) -> str:
    return s.rstrip(" ")


def to_name(s: str) -> str:
    b = s.encode()
    return b[:63].decode(errors="ignore") if len(b) > 63 else s


def bool_to_text(b: bool) -> str:
    return "true" if b else "false"


def bpchar_length(n: int) -> Callable[[str], str]:
    def apply(s: str) -> str:
        return s[:n].ljust(n)

    return apply


def varchar_length(n: int) -> Callable[[str], str]:
    def apply(s: str) -> str:
        return s[:n]

    return apply


def substr(s: str, start: int, count: int | None = None) -> str:
    if count is None:
        return s[max(start, 1) - 1 :]
    if count < 0:
        raise Unevaluable("negative substring length not allowed")
    end = start + count
    return s[max(start, 1) - 1 : end - 1] if end > 1 else ""


def text_right(s: str, n: int) -> str:
    if n == -(2**31):  # PostgreSQL negates n in 32 bits: -(-2**31) stays negative, which keeps the whole string
        return s
    return s[-n:] if n else ""


def replace(s: str, old: str, new: str) -> str:
    return s.replace(old, new) if old else s


def strpos(s: str, sub: str) -> int:
    return s.find(sub) + 1


# ----------------------------------------------------------------------------------------- LIKE


def like_escape(pattern: str, escape: str) -> str:
    """PostgreSQL's like_escape(): the pattern rewritten to use backslash as its escape character."""
    if len(escape) > 1:
        raise Unevaluable("invalid escape string: escape string must be empty or one character")
    if escape == "\\":
        return pattern
    if not escape:
        return pattern.replace("\\", "\\\\")
    out: list[str] = []
    after_escape = False
    for c in pattern:
        if c == escape and not after_escape:
            out.append("\\")
            after_escape = True
        elif c == "\\":
            out.append("\\" if after_escape else "\\\\")
            after_escape = False
        else:
            out.append(c)
            after_escape = False
    return "".join(out)


@functools.lru_cache(maxsize=256)
def like_matcher(pattern: str) -> Callable[[str], bool]:
    """A LIKE pattern (backslash escapes) as a matcher of whole strings."""
    regex: list[str] = []
    literal: list[str] = []
    wildcards = False
    chars = iter(pattern)
    for c in chars:
        if c in "%_":
            regex.append(".*" if c == "%" else ".")
            wildcards = True
            continue
        char = next(chars, "") if c == "\\" else c
        if not char:
            raise Unevaluable("LIKE pattern must not end with escape character")
        regex.append(re.escape(char))
        literal.append(char)
    if not wildcards:
        return "".join(literal).__eq__
    matcher = re.compile("".join(regex), re.DOTALL).fullmatch
    return lambda s: matcher(s) is not None


def constant_like(matcher: Callable[[str], bool], negate: bool, fold: bool) -> Callable[[str], bool]:
    if fold:
        return lambda s: matcher(lower(s)) is not negate
    if negate:
        return lambda s: not matcher(s)
    return matcher


def like(negate: bool, fold: bool) -> Callable[[str, str], bool]:
    def match(s: str, pattern: str) -> bool:
        if fold:
            s, pattern = lower(s), lower(pattern)
        return like_matcher(pattern)(s) is not negate

    return match

"""Regular expressions matched against whole names, by RE2. Pure.

The names matched can be anyone's choice: the tables a signal record names, the prefix of a logical decoding
message (``pg_logical_emit_message`` is executable by PUBLIC). RE2 matches in time linear in the name, whatever
the pattern (Python's ``re`` backtracks: ``(.|.)*Z`` takes tens of seconds on a 29-character name, holding the
GIL), and refuses at compile time what it cannot match so: look-around, back-references, repetition counts above
1000, a program above its memory bound (8 MiB). A pattern is at most ``MAX_PATTERN`` characters.

* ``whole``: a matcher of whole names for one pattern, or ``PatternError`` saying why there is none;
* ``Selection``: names chosen by include and exclude patterns (Debezium's ``*.include.list`` / ``*.exclude.list``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import re2  # type: ignore[import-untyped]

MAX_PATTERN = 512

Matcher = Callable[[str], bool]


class PatternError(ValueError):
    """A text that is no pattern cdcd reads: too long, or not in RE2's syntax."""


def _options(case_sensitive: bool) -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # RE2 would write its own lines to stderr, past the structured log
    options.case_sensitive = case_sensitive
    return options


_EXACT, _ANY_CASE = _options(True), _options(False)


def whole(text: str, *, ignore_case: bool = False) -> Matcher:
    """A matcher of whole names for the regular expression ``text`` (RE2's syntax: Python's without look-around and
    back-references); raises ``PatternError``."""
    if len(text) > MAX_PATTERN:
        raise PatternError(f"a pattern of {len(text)} characters (at most {MAX_PATTERN})")
    try:
        compiled = re2.compile(text, _ANY_CASE if ignore_case else _EXACT)
    except re2.error as exc:
        detail = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise PatternError(f"{text!r} is not a regular expression cdcd reads: {detail}") from None
    return lambda name: compiled.fullmatch(name) is not None


@dataclass(frozen=True)
class Selection:
    """The names matched by an include pattern (any name when there is none) and by no exclude pattern."""

    include: tuple[Matcher, ...] = ()
    exclude: tuple[Matcher, ...] = ()

    @classmethod
    def of(cls, include: Sequence[str], exclude: Sequence[str], *, ignore_case: bool = False) -> Selection:
        """The selection of these patterns; raises ``PatternError`` naming the first that is none."""
        return cls(
            tuple(whole(p, ignore_case=ignore_case) for p in include),
            tuple(whole(p, ignore_case=ignore_case) for p in exclude),
        )

    def __call__(self, name: str) -> bool:
        included = not self.include or any(match(name) for match in self.include)
        return included and not any(match(name) for match in self.exclude)

"""The two exceptions of the row-filter engine: a filter cdcd refuses, a row it cannot evaluate."""

from __future__ import annotations


class FilterError(ValueError):
    """A filter that cdcd refuses; ``str()`` quotes the whole expression and names the offending part."""

    def __init__(self, text: str, reason: str) -> None:
        self.text = text
        self.reason = reason
        super().__init__(f'row filter "{text}": {reason}')


class Unevaluable(Exception):
    """This row's filter value cannot be computed. ``toast_column`` is set when the cause is an unchanged TOAST
    value of that column; otherwise PostgreSQL would have raised an error (division by zero, ...)."""

    def __init__(self, reason: str, toast_column: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.toast_column = toast_column

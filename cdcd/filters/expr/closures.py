"""What compiled expressions are made of: ``E`` (a typed per-row function or constant) and the closures over
the row that the compiler composes: strict function application, AND / OR with SQL's NULL and unchanged TOAST
values, comparisons with PostgreSQL's NaN and character(n) rules, IN-list membership, column NULL tests."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, Final

from cdcd.filters.expr.errors import Unevaluable
from cdcd.filters.expr.types import T
from cdcd.pgoutput.messages import Row

Fn = Callable[[Row], Any]


class E:
    """A compiled expression: its type and either a per-row function or (``fn`` None) a constant value."""

    __slots__ = ("column", "fn", "type", "value")

    def __init__(self, type_: T, fn: Fn | None = None, value: Any = None, column: str = "") -> None:
        self.type = type_
        self.fn = fn
        self.value = value
        self.column = column  # the column it reads, for messages

    @property
    def run(self) -> Fn:
        if self.fn is not None:
            return self.fn
        value = self.value
        return lambda row: value


def strict_fn(impl: Callable[..., Any], args: Sequence[E]) -> Fn:
    """A function of the row applying ``impl`` to the arguments' values; NULL if any is NULL (all are evaluated
    first, as PostgreSQL evaluates a strict function's arguments)."""
    if len(args) == 1:
        return _strict1(impl, args[0].run)
    if len(args) == 2:
        a, b = args
        if b.fn is None:
            return _strict_const2(impl, a.run, b.value)
        return _strict2(impl, a.run, b.run)
    fns = [a.run for a in args]

    def apply(row: Row) -> Any:
        values = [f(row) for f in fns]
        return None if any(v is None for v in values) else impl(*values)

    return apply


def _strict1(impl: Callable[[Any], Any], f: Fn) -> Fn:
    def apply(row: Row) -> Any:
        a = f(row)
        return None if a is None else impl(a)

    return apply


def _strict2(impl: Callable[[Any, Any], Any], f: Fn, g: Fn) -> Fn:
    def apply(row: Row) -> Any:
        a = f(row)
        b = g(row)
        return None if a is None or b is None else impl(a, b)

    return apply


def _strict_const2(impl: Callable[[Any, Any], Any], f: Fn, b: Any) -> Fn:
    def apply(row: Row) -> Any:
        a = f(row)
        return None if a is None else impl(a, b)

    return apply


def junction(fns: list[Fn], decisive: bool) -> Fn:
    """AND (``decisive`` False) or OR (True) with SQL's NULL, in PostgreSQL's order: the first decisive operand
    settles it. An operand needing an unchanged TOAST value is skipped: a later decisive operand still settles
    the result, otherwise its Unevaluable is raised."""

    settled: bool = decisive

    def apply(row: Row) -> bool | None:
        result: bool | None = not decisive
        pending: Unevaluable | None = None
        for f in fns:
            try:
                v = f(row)
            except Unevaluable as exc:
                if exc.toast_column is None:
                    raise
                pending = pending or exc
                continue
            if v is decisive:
                return settled
            if v is None:
                result = None
        if pending is not None:
            raise pending
        return result

    return apply


def not_(b: bool) -> bool:
    return not b


_CMP: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
}


def _nan_aware(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    """PostgreSQL's float and numeric order: NaN equals NaN and sorts above everything else."""

    def compare(a: Any, b: Any) -> bool:
        if a != a or b != b:  # noqa: PLR0124 - NaN test for float and Decimal alike
            return op(a != a, b != b)  # noqa: PLR0124
        return op(a, b)

    return compare


def _blank_padded(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    """character(n) comparison: trailing spaces are insignificant."""

    def compare(a: str, b: str) -> bool:
        return op(a.rstrip(" "), b.rstrip(" "))

    return compare


# comparison kind -> operator -> function
COMPARE: Final = {
    "plain": _CMP,
    "nan": {op: _nan_aware(f) for op, f in _CMP.items()},
    "bpchar": {op: _blank_padded(f) for op, f in _CMP.items()},
}


def member(f: Fn, values: list[Any], blank_padded: bool, negated: bool) -> Fn:
    """``x IN (constants)`` as a set lookup, with NULL when no item matched and one was NULL."""
    has_null = any(v is None for v in values)
    members = frozenset(v.rstrip(" ") if blank_padded else v for v in values if v is not None)
    miss = None if has_null else negated

    def apply(row: Row) -> bool | None:
        a = f(row)
        if a is None:
            return None
        if (a.rstrip(" ") if blank_padded else a) in members:
            return not negated
        return miss

    return apply


def null_check_column(index: int, is_null: bool) -> Fn:
    """IS [NOT] NULL of a column reads no value: an unchanged TOAST value is not NULL."""

    def apply(row: Row) -> bool:
        return (row[index] is None) is is_null

    return apply

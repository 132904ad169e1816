"""PostgreSQL's type resolution, the half of the compiler that needs no parse tree: values coerced to a type
(a literal read as the type, else a cast with its context and type modifier), the operand types of a
comparison, the common type of several values (select_common_type) and the argument types of a function, each
with PostgreSQL's error when there is none; and the typed ``E`` of a per-row function, folded to a constant when
its arguments are constants."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

from cdcd.filters.expr.arith import numeric_precision
from cdcd.filters.expr.casts import CASTS, PREFERRED, TZ_CASTS, Conv, category, implicit
from cdcd.filters.expr.closures import COMPARE, E, Fn, strict_fn
from cdcd.filters.expr.errors import FilterError, Unevaluable
from cdcd.filters.expr.strings import bpchar_length, varchar_length
from cdcd.filters.expr.types import BOOL, FLOAT8, FLOATS, INT4, INTS, NUMBERS, NUMERIC, RANK, STRINGS, TEXT, T
from cdcd.filters.expr.values import INPUT, BadInput


class Resolver:
    """Type resolution and typed expressions for ``text`` (named in every FilterError)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def fail(self, reason: str) -> NoReturn:
        raise FilterError(self.text, reason)

    # ------------------------------------------------------------------------------ typed expressions

    def fold(self, t: T, fn: Fn, args: Sequence[E]) -> E:
        """``fn`` as an expression of type ``t``, computed now when all its arguments are constants."""
        if any(a.fn is not None for a in args):
            return E(t, fn)
        try:
            return E(t, value=fn(()))
        except Unevaluable as exc:
            self.fail(f"a constant part of the expression fails: {exc.reason}")

    def apply(self, t: T, impl: Callable[..., Any], args: Sequence[E]) -> E:
        if any(a.fn is None and a.value is None for a in args):
            return E(t)  # a strict function of a NULL constant is NULL, not evaluated (PostgreSQL folds it)
        return self.fold(t, strict_fn(impl, args), args)

    # ------------------------------------------------------------------------------ coercion

    def coerce(self, e: E, t: T, *, explicit: bool = False, context: str = "") -> E:
        """``e`` converted to ``t``: an unknown literal is read as ``t``; else PostgreSQL's cast, which must be
        implicit unless ``explicit``."""
        if e.type == t:
            return e
        if e.type.name == "unknown":
            return self.literal(e.value, t)
        self.usable(e)
        convert = self.conversion(e.type, t, explicit, context)
        if convert is None:
            return E(t, e.fn, e.value)
        return self.apply(t, convert, [e])

    def literal(self, value: str | None, t: T) -> E:
        if value is None:
            return E(t)
        parse = INPUT.get(t.name)
        if parse is None:
            self.fail(f"cannot read the literal '{value}' as type {t}")
        try:
            v = parse(value)
            modifier = self.typmod(t)
            return E(t, value=v if modifier is None else modifier(v))
        except (BadInput, Unevaluable) as exc:
            self.fail(str(exc))

    @staticmethod
    def typmod(t: T) -> Conv | None:
        if not t.mod:
            return None
        if t.name == "numeric":
            return numeric_precision(*t.mod)
        if t.name == "bpchar":
            return bpchar_length(t.mod[0])
        if t.name == "varchar":
            return varchar_length(t.mod[0])
        return None

    def conversion(self, src: T, dst: T, explicit: bool, context: str) -> Conv | None:
        if src.name == "other":
            self.fail(f"type {src}, which a cdcd row filter can only test with IS [NOT] NULL, cannot be cast")
        modifier = self.typmod(dst)
        if src.name == dst.name:
            return modifier
        where = f" ({context})" if context else ""
        cast_context, convert = self.find_cast(src, dst, where)
        if cast_context != "i" and not explicit:
            self.fail(f"type {src} cannot be converted to {dst} implicitly{where}")
        if convert is None:
            return modifier
        if modifier is None:
            return convert
        return lambda v: modifier(convert(v))

    def find_cast(self, src: T, dst: T, where: str) -> tuple[str, Conv | None]:
        """PostgreSQL's cast between two different types: (its context, its conversion or None for the same
        value); a FilterError when there is none or it is not immutable."""
        pair = (src.name, dst.name)
        if pair in TZ_CASTS:
            self.fail(f"cast from {src} to {dst} is not immutable (it depends on the TimeZone setting){where}")
        found = CASTS.get(pair)
        if found is None:
            if (src.name in STRINGS) != (dst.name in STRINGS) and "other" not in pair and "unknown" not in pair:
                self.fail(
                    f"cast from {src} to {dst} is not allowed in a row filter: PostgreSQL refuses conversions"
                    f" through text (only a literal can be read as another type){where}"
                )
            self.fail(f"cannot cast type {src} to {dst}{where}")
        return found

    def usable(self, *args: E) -> None:
        """Values of unsupported types may only be tested for NULL."""
        for e in args:
            if e.type.name == "other":
                what = f'column "{e.column}" has type {e.type}' if e.column else f"type {e.type}"
                self.fail(f"{what}, which a cdcd row filter can only test with IS [NOT] NULL")

    def boolean(self, e: E, context: str) -> E:
        if e.type.name == "unknown":
            return self.literal(e.value, BOOL)
        if e.type.name != "bool":
            self.fail(f"argument of {context} must be type boolean, not type {e.type}")
        return e

    # ------------------------------------------------------------------------------ comparisons

    def comparable(self, left: E, right: E, op: str) -> tuple[E, E, str]:
        """The operands converted as PostgreSQL resolves ``left op right``, and the comparison kind."""
        self.usable(left, right)
        lt, rt = left.type.name, right.type.name
        if lt == "unknown" and rt == "unknown":
            return self.coerce(left, TEXT), self.coerce(right, TEXT), "plain"
        if lt == "unknown":
            left, lt = self.coerce(left, right.type.bare), rt
        elif rt == "unknown":
            right, rt = self.coerce(right, left.type.bare), lt
        shown = f"{left.type} {op} {right.type}"
        if lt in NUMBERS and rt in NUMBERS:
            return self.numbers_comparable(left, right)
        if "oid" in (lt, rt):
            return self.oids_comparable(left, right, shown)
        if lt in STRINGS and rt in STRINGS:
            return self.strings_comparable(left, right)
        pair = {lt, rt}
        if pair == {"date", "timestamp"}:
            return self.coerce(left, T("timestamp")), self.coerce(right, T("timestamp")), "plain"
        if pair == {"time", "interval"}:
            return self.coerce(left, T("interval")), self.coerce(right, T("interval")), "plain"
        if "timestamptz" in pair and pair & {"date", "timestamp"}:
            self.fail(f"operator {shown} is not immutable (it depends on the TimeZone setting)")
        if lt == rt and lt not in ("other",):
            return left, right, "plain"
        self.fail(f"operator does not exist: {shown}")

    def numbers_comparable(self, left: E, right: E) -> tuple[E, E, str]:
        lt, rt = left.type.name, right.type.name
        if lt in INTS and rt in INTS:
            return left, right, "plain"
        if lt in FLOATS or rt in FLOATS:  # float48 operators: a real operand stays real
            left = left if lt in FLOATS else self.coerce(left, FLOAT8)
            return left, right if rt in FLOATS else self.coerce(right, FLOAT8), "nan"
        return self.coerce(left, NUMERIC), self.coerce(right, NUMERIC), "nan"

    def oids_comparable(self, left: E, right: E, shown: str) -> tuple[E, E, str]:
        oid = T("oid")
        if {left.type.name, right.type.name} <= {"oid", "int2", "int4", "int8"}:
            return self.coerce(left, oid), self.coerce(right, oid), "plain"
        self.fail(f"operator does not exist: {shown}")

    def strings_comparable(self, left: E, right: E) -> tuple[E, E, str]:
        types = {left.type.name, right.type.name}
        if "bpchar" in types and types <= {"bpchar", "varchar"}:
            bpchar = T("bpchar")
            return self.coerce(left, bpchar), self.coerce(right, bpchar), "bpchar"
        if types == {"name"}:
            return left, right, "plain"
        if "name" in types:  # name vs text: PostgreSQL's cross-type operators, values compared as strings
            return self.to_text_unless_name(left), self.to_text_unless_name(right), "plain"
        return self.coerce(left, TEXT), self.coerce(right, TEXT), "plain"

    def to_text_unless_name(self, e: E) -> E:
        return e if e.type.name == "name" else self.coerce(e, TEXT)

    def compare(self, op: str, left: E, right: E) -> E:
        left, right, kind = self.comparable(left, right, op)
        return self.apply(BOOL, COMPARE[kind][op], [left, right])

    # ------------------------------------------------------------------------------ common types

    def common_type(self, args: list[E], context: str, strict: bool = True) -> T | None:
        """PostgreSQL's select_common_type over the supported types (None when there is none and not strict)."""
        self.usable(*args)
        known = [a.type for a in args if a.type.name != "unknown"]
        if not known:
            return TEXT
        chosen = known[0].bare
        for t in known[1:]:
            if t.name == chosen.name:
                continue
            if category(t) != category(chosen):
                if not strict:
                    return None
                self.fail(f"{context} types {chosen} and {t} cannot be matched")
            if chosen.name not in PREFERRED and implicit(chosen.name, t.name) and not implicit(t.name, chosen.name):
                chosen = t.bare  # a type the others convert to, unless the current one is the category's preferred
        if not strict and not all(implicit(t.name, chosen.name) for t in known):
            return None
        return chosen

    # ------------------------------------------------------------------------------ function arguments

    def text_arg(self, e: E, signature: str) -> E:
        self.usable(e)
        if e.type.name == "unknown" or e.type.name in STRINGS:
            return self.coerce(e, TEXT)
        self.fail(f"function {signature} does not exist")

    def int4_arg(self, e: E, signature: str) -> E:
        self.usable(e)
        if e.type.name in ("unknown", "int2", "int4"):
            return self.coerce(e, INT4)
        self.fail(f"function {signature} does not exist")

    def numeric_args(self, args: list[E], signature: str, allowed: Iterable[str]) -> list[E]:
        """The arguments converted to the one type PostgreSQL's function resolution picks among ``allowed``."""
        self.usable(*args)
        allowed = tuple(allowed)
        known = {a.type.name for a in args if a.type.name != "unknown"}
        if known - NUMBERS:
            self.fail(f"function {signature} does not exist")
        if len(known) == 1 and next(iter(known)) in allowed:  # an exact match
            candidates = list(known)
        elif known:  # else the first one all arguments convert to implicitly, as PostgreSQL prefers
            candidates = [t for t in allowed if all(RANK[k] <= RANK[t] for k in known)]
        else:  # only literals: the only candidate, or the preferred type of the category
            candidates = list(allowed) if len(allowed) == 1 else [t for t in allowed if t == "float8"]
            if not candidates:
                self.fail(f"function {signature} is not unique: add explicit type casts")
        if not candidates:
            self.fail(f"function {signature} does not exist")
        t = T(candidates[0])
        return [self.coerce(a, t) for a in args]

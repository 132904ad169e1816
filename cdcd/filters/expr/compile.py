"""The compiler: a checked parse tree and the table's column types in, the predicate out. ``_Compiler`` has one
method per node kind (and per A_Expr kind and per function); each builds its node's ``E`` from its operands',
with PostgreSQL's type resolution from its base class ``resolve.Resolver`` and the per-row code from
``closures``. ``compile_filter`` is the entry point."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from decimal import ROUND_CEILING, ROUND_DOWN, ROUND_FLOOR, ROUND_HALF_UP, Decimal
from typing import Any, Final

from pglast import ast, enums

from cdcd.filters.expr.arith import (
    NCTX,
    checked_int_op,
    dec,
    f8_op,
    int_check,
    int_div,
    int_mod,
    num_div,
    num_mod,
    num_round,
)
from cdcd.filters.expr.closures import COMPARE, E, junction, member, not_, null_check_column
from cdcd.filters.expr.errors import Unevaluable
from cdcd.filters.expr.parse import (
    BETWEENS,
    COMPARISONS,
    as_tuple,
    cast_type,
    func_name,
    is_like_escape,
    name_parts,
    operator_name,
    parse,
    show,
)
from cdcd.filters.expr.resolve import Resolver
from cdcd.filters.expr.strings import (
    constant_like,
    like,
    like_escape,
    like_matcher,
    lower,
    replace,
    strpos,
    substr,
    text_right,
    upper,
)
from cdcd.filters.expr.types import (
    BOOL,
    FIRST_NORMAL_OID,
    FLOAT8,
    FLOATS,
    INT4,
    INT8,
    INTS,
    NUMBERS,
    NUMERIC,
    RANK,
    STRINGS,
    TEXT,
    UNKNOWN,
    ColumnType,
    ParsedFilter,
    Predicate,
    T,
    column_type,
)
from cdcd.filters.expr.values import column_reader
from cdcd.pgoutput.messages import Row


def compile_filter(parsed: ParsedFilter, columns: Sequence[ColumnType]) -> Predicate:
    """The predicate of ``parsed`` for a table whose columns, in tuple order, are ``columns``.

    Raises FilterError for unknown columns and type errors. The predicate returns True, False or None (SQL
    NULL) and raises Unevaluable when the row's value cannot be computed.
    """
    tree = parse(parsed.text)[1]
    compiler = _Compiler(parsed.text, columns)
    result = compiler.boolean(compiler.expr(tree), "WHERE")
    if result.fn is None:
        value: bool | None = result.value
        return lambda row: value
    fn: Predicate = result.fn
    return fn


_LIKES: Final = {"~~": (False, False), "!~~": (True, False), "~~*": (False, True), "!~~*": (True, True)}
_INT_OPS: Final[dict[str, Callable[[int, int], int]]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": int_div,
    "%": int_mod,
}
_NUMERIC_OPS: Final[dict[str, Callable[[Decimal, Decimal], Decimal]]] = {
    "+": NCTX.add,
    "-": NCTX.subtract,
    "*": NCTX.multiply,
    "/": num_div,
    "%": num_mod,
}


class _Compiler(Resolver):
    """The compile-time walk: PostgreSQL's type resolution (``Resolver``), then closures over the row."""

    def __init__(self, text: str, columns: Sequence[ColumnType]) -> None:
        super().__init__(text)
        self.columns = {c.name: (i, c) for i, c in enumerate(columns)}

    def expr(self, node: Any) -> E:
        method = _COMPILE.get(type(node))
        if method is None:
            self.fail(f"expression {show(node)} is not supported in a row filter")
        return method(self, node)

    # ------------------------------------------------------------------------------ leaves

    def column(self, node: ast.ColumnRef) -> E:
        name = name_parts(node.fields)[-1]
        found = self.columns.get(name)
        if found is None:
            existing = ", ".join(c.name for _, c in self.columns.values()) or "none"
            self.fail(f'column "{name}" does not exist (the table has columns: {existing})')
        index, column = found
        if column.type_oid >= FIRST_NORMAL_OID:
            self.fail(
                f'column "{name}" has a user-defined type (oid {column.type_oid}): row filters allow only'
                " built-in types"
            )
        t = column_type(column)
        return E(t, column_reader(index, name, t), column=name)

    def const(self, node: ast.A_Const) -> E:
        val = node.val
        if node.isnull or val is None:
            return E(UNKNOWN)
        if isinstance(val, ast.Integer):
            return E(INT4, value=val.ival or 0)
        if isinstance(val, ast.Float):
            return self.number(val.fval or "0")
        if isinstance(val, ast.Boolean):
            return E(BOOL, value=bool(val.boolval))
        if isinstance(val, ast.String):
            return E(UNKNOWN, value=val.sval or "")
        self.fail(f"constant {show(node)} is not supported")

    @staticmethod
    def number(text: str) -> E:
        """A numeric literal: int4 or int8 if it is an integer that fits, else numeric (as PostgreSQL)."""
        if text.lstrip("-").isdigit():
            v = int(text)
            if -(2**31) <= v < 2**31:
                return E(INT4, value=v)
            if -(2**63) <= v < 2**63:
                return E(INT8, value=v)
        return E(NUMERIC, value=dec(Decimal(text)))

    # ------------------------------------------------------------------------------ casts and collations

    def cast(self, node: ast.TypeCast) -> E:
        assert node.typeName is not None
        t = cast_type(node.typeName, self.fail)
        return self.coerce(self.expr(node.arg), t, explicit=True, context=show(node))

    def collate(self, node: ast.CollateClause) -> E:
        e = self.expr(node.arg)
        self.usable(e)
        if e.type.name == "unknown":
            e = self.coerce(e, TEXT)
        if e.type.name not in STRINGS:
            self.fail(f"collations are not supported by type {e.type} ({show(node)})")
        return e

    # ------------------------------------------------------------------------------ comparisons

    def compare_nodes(self, op: str, left: Any, right: Any) -> E:
        return self.compare(op, self.expr(left), self.expr(right))

    # ------------------------------------------------------------------------------ A_Expr

    def a_expr(self, node: ast.A_Expr) -> E:
        kinds = enums.A_Expr_Kind
        kind = node.kind
        if kind == kinds.AEXPR_OP:
            return self.operator(node)
        if kind == kinds.AEXPR_IN:
            return self.in_list(node)
        if kind in (kinds.AEXPR_LIKE, kinds.AEXPR_ILIKE):
            return self.like(node)
        if kind in BETWEENS:
            return self.between(node)
        if kind in (kinds.AEXPR_DISTINCT, kinds.AEXPR_NOT_DISTINCT):
            return self.distinct(node, kind == kinds.AEXPR_NOT_DISTINCT)
        if kind == kinds.AEXPR_NULLIF:
            return self.nullif(node)
        self.fail(f"expression {show(node)} is not supported in a row filter")

    def operator(self, node: ast.A_Expr) -> E:
        op = operator_name(node)
        assert op is not None
        if node.lexpr is None:
            return self.unary(op, self.expr(node.rexpr), node)
        if op in COMPARISONS:
            return self.compare_nodes(op, node.lexpr, node.rexpr)
        if op in _LIKES:
            return self.like(node)
        left, right = self.expr(node.lexpr), self.expr(node.rexpr)
        if op == "||":
            return self.concat(left, right)
        return self.arithmetic(op, left, right)

    def unary(self, op: str, e: E, node: ast.A_Expr) -> E:
        self.usable(e)
        if e.type.name == "unknown":
            self.fail(f"operator is not unique: {op} unknown ({show(node)})")
        name = e.type.name
        if op not in ("-", "+") or name not in NUMBERS:
            self.fail(f"operator does not exist: {op} {e.type} ({show(node)})")
        if op == "+":
            return e
        impl: Callable[[Any], Any]
        if name in INTS:
            check = int_check(name)
            impl = lambda v: check(-v)  # noqa: E731
        elif name == "numeric":
            impl = NCTX.minus
        else:
            impl = operator.neg
        return self.apply(e.type.bare, impl, [e])

    def arithmetic(self, op: str, left: E, right: E) -> E:
        self.usable(left, right)
        lt, rt = left.type.name, right.type.name
        if lt == "unknown" and rt == "unknown":
            self.fail(f"operator is not unique: unknown {op} unknown")
        if lt == "unknown":
            left, lt = self.coerce(left, right.type.bare), rt
        elif rt == "unknown":
            right, rt = self.coerce(right, left.type.bare), lt
        if lt not in NUMBERS or rt not in NUMBERS:
            self.fail(
                f"operator {left.type} {op} {right.type} is not supported (operator does not exist or cdcd"
                " does not evaluate it)"
            )
        t, impl = self.number_operator(op, left.type, right.type)
        return self.apply(t, impl, [self.coerce(left, t), self.coerce(right, t)])

    def number_operator(self, op: str, left: T, right: T) -> tuple[T, Callable[[Any, Any], Any]]:
        """PostgreSQL's arithmetic operator ``left op right`` on numbers: its operand and result type, and its
        implementation (with PostgreSQL's overflow and division errors)."""
        lt, rt = left.name, right.name
        if lt in INTS and rt in INTS:
            t = T(max(lt, rt, key=RANK.__getitem__))
            return t, checked_int_op(_INT_OPS[op], t.name)
        if lt in FLOATS or rt in FLOATS:
            if op == "%":
                self.fail(f"operator does not exist: {left} % {right}")
            t = T("float4") if lt == rt == "float4" else FLOAT8
            return t, f8_op(op, t.name == "float4")
        return NUMERIC, _NUMERIC_OPS[op]

    def concat(self, left: E, right: E) -> E:
        self.usable(left, right)
        for e in (left, right):
            if e.type.name != "unknown" and e.type.name not in STRINGS:
                self.fail(
                    f"operator || with an operand of type {e.type} is not immutable (PostgreSQL converts"
                    " it with a stable output function)"
                )
        return self.apply(TEXT, operator.add, [self.coerce(left, TEXT), self.coerce(right, TEXT)])

    def like(self, node: ast.A_Expr) -> E:
        op = operator_name(node)
        assert op in _LIKES
        negate, fold = _LIKES[op]
        subject = self.expr(node.lexpr)
        self.usable(subject)
        if subject.type.name == "unknown":
            subject = self.coerce(subject, TEXT)
        if subject.type.name not in STRINGS:
            self.fail(f"operator does not exist: {subject.type} {op} text ({show(node)})")
        pattern = self.like_pattern(node.rexpr)
        if subject.type.name == "varchar":
            subject = self.coerce(subject, TEXT)
        if pattern.fn is None and pattern.value is not None:
            try:
                matcher = like_matcher(lower(pattern.value) if fold else pattern.value)
            except Unevaluable as exc:
                self.fail(f"{exc.reason} ({show(node)})")
            return self.apply(BOOL, constant_like(matcher, negate, fold), [subject])
        return self.apply(BOOL, like(negate, fold), [subject, pattern])

    def like_pattern(self, node: Any) -> E:
        if is_like_escape(node):
            pattern, escape = (self.text_arg(self.expr(a), "like_escape(text, text)") for a in node.args)
            return self.apply(TEXT, like_escape, [pattern, escape])
        return self.text_arg(self.expr(node), "like(text, text)")

    def between(self, node: ast.A_Expr) -> E:
        kinds = enums.A_Expr_Kind
        kind = node.kind
        low, high = as_tuple(node.rexpr)
        negated = kind in (kinds.AEXPR_NOT_BETWEEN, kinds.AEXPR_NOT_BETWEEN_SYM)
        forward = self.range_test(node.lexpr, low, high, negated)
        if kind in (kinds.AEXPR_BETWEEN, kinds.AEXPR_NOT_BETWEEN):
            return forward
        backward = self.range_test(node.lexpr, high, low, negated)
        return self.combine([forward, backward], and_=negated)

    def range_test(self, subject: Any, low: Any, high: Any, negated: bool) -> E:
        if negated:
            return self.combine([self.compare_nodes("<", subject, low), self.compare_nodes(">", subject, high)])
        return self.combine(
            [self.compare_nodes(">=", subject, low), self.compare_nodes("<=", subject, high)], and_=True
        )

    def distinct(self, node: ast.A_Expr, not_distinct: bool) -> E:
        left, right = self.expr(node.lexpr), self.expr(node.rexpr)
        for e, other in ((left, right), (right, left)):
            if e.type.name == "unknown" and e.value is None:  # x IS [NOT] DISTINCT FROM NULL is a null test
                return self.null_check(other, is_null=not_distinct)
        left, right, kind = self.comparable(left, right, "=")
        eq = COMPARE[kind]["="]
        f, g = left.run, right.run

        def apply(row: Row) -> bool:
            a = f(row)
            b = g(row)
            if a is None or b is None:
                return (a is None and b is None) is not_distinct
            return bool(eq(a, b)) is not_distinct

        return self.fold(BOOL, apply, [left, right])

    def nullif(self, node: ast.A_Expr) -> E:
        left, right, kind = self.comparable(self.expr(node.lexpr), self.expr(node.rexpr), "=")
        eq = COMPARE[kind]["="]
        f, g = left.run, right.run

        def apply(row: Row) -> Any:
            a = f(row)
            b = g(row)
            return None if a is not None and b is not None and eq(a, b) else a

        return self.fold(left.type, apply, [left, right])

    # ------------------------------------------------------------------------------ IN

    def in_list(self, node: ast.A_Expr) -> E:
        """PostgreSQL's transformAExprIn: the items without column references compared as one array of their
        common type with the subject (when they have one), the others one by one; ORed (ANDed for NOT IN)."""
        negated = operator_name(node) == "<>"
        op = "<>" if negated else "="
        subject = self.expr(node.lexpr)
        items = as_tuple(node.rexpr)
        constants = [self.expr(i) for i in items if not _references_columns(i)]
        others = [self.expr(i) for i in items if _references_columns(i)]
        parts: list[E] = []
        if len(constants) > 1:
            common = self.common_type([subject, *constants], "IN", strict=False)
            if common is not None and common.name == "varchar":
                self.fail(
                    "IN with character varying values is not allowed: PostgreSQL would convert the list to text[] in"
                    f" a way row filters refuse; compare as text: {show(node.lexpr)}::text IN (...)"
                )
            if common is not None:
                parts.append(self.any_of(subject, [self.coerce(c, common) for c in constants], negated))
                constants = []
        parts += [self.compare(op, subject, i) for i in (*constants, *others)]
        return parts[0] if len(parts) == 1 else self.combine(parts, and_=negated)

    def any_of(self, subject: E, items: list[E], negated: bool) -> E:
        """``subject = ANY (items)`` (``<> ALL`` when negated) with PostgreSQL's NULL rules."""
        op = "<>" if negated else "="
        left, _, kind = self.comparable(subject, items[0], op)
        items = [self.comparable(subject, i, op)[1] for i in items]
        if all(i.fn is None for i in items) and kind != "nan" and left.fn is not None:
            return E(BOOL, member(left.fn, [i.value for i in items], kind == "bpchar", negated))
        eq = COMPARE[kind]["="]
        f, fns = left.run, [i.run for i in items]

        def apply(row: Row) -> bool | None:
            a = f(row)
            values = [g(row) for g in fns]
            if a is None:
                return None
            found = any(v is not None and eq(a, v) for v in values)
            if found:
                return not negated
            return None if None in values else negated

        return self.fold(BOOL, apply, [left, *items])

    # ------------------------------------------------------------------------------ boolean logic

    def bool_expr(self, node: ast.BoolExpr) -> E:
        op = node.boolop
        assert op is not None
        context = {enums.BoolExprType.AND_EXPR: "AND", enums.BoolExprType.OR_EXPR: "OR"}.get(op, "NOT")
        args = [self.boolean(self.expr(a), context) for a in node.args or ()]
        if op == enums.BoolExprType.NOT_EXPR:
            return self.apply(BOOL, not_, args)
        return self.combine(args, and_=op == enums.BoolExprType.AND_EXPR)

    def combine(self, args: list[E], and_: bool = False) -> E:
        """AND / OR with PostgreSQL's constant folding: a constant that decides the result decides it."""
        decisive = not and_
        if any(a.fn is None and a.value is decisive for a in args):
            return E(BOOL, value=decisive)
        rest = [a for a in args if not (a.fn is None and a.value is (not decisive))]
        if not rest:
            return E(BOOL, value=not decisive)
        if len(rest) == 1 and rest[0].fn is not None:
            return rest[0]
        fns = [a.run for a in rest]
        return self.fold(BOOL, junction(fns, decisive), rest)

    def null_test(self, node: ast.NullTest) -> E:
        return self.null_check(self.expr(node.arg), node.nulltesttype == enums.NullTestType.IS_NULL)

    def null_check(self, e: E, is_null: bool) -> E:
        if e.column:  # a column as such: no need to read (or have) its value
            return E(BOOL, null_check_column(self.columns[e.column][0], is_null))
        f = e.run

        def apply(row: Row) -> bool:
            return (f(row) is None) is is_null

        return self.fold(BOOL, apply, [e])

    def boolean_test(self, node: ast.BooleanTest) -> E:
        kinds = enums.BoolTestType
        assert node.booltesttype is not None
        e = self.boolean(self.expr(node.arg), "IS TRUE / FALSE / UNKNOWN")
        expected: bool | None = {
            kinds.IS_TRUE: True,
            kinds.IS_NOT_TRUE: True,
            kinds.IS_FALSE: False,
            kinds.IS_NOT_FALSE: False,
            kinds.IS_UNKNOWN: None,
            kinds.IS_NOT_UNKNOWN: None,
        }[node.booltesttype]
        negated = node.booltesttype in (kinds.IS_NOT_TRUE, kinds.IS_NOT_FALSE, kinds.IS_NOT_UNKNOWN)
        f = e.run

        def apply(row: Row) -> bool:
            return (f(row) is expected) is not negated

        return self.fold(BOOL, apply, [e])

    # ------------------------------------------------------------------------------ conditional expressions

    def coalesce(self, node: ast.CoalesceExpr) -> E:
        args = [self.expr(a) for a in node.args or ()]
        t = self.common_type(args, "COALESCE")
        assert t is not None
        args = [self.coerce(a, t) for a in args]
        fns = [a.run for a in args]

        def apply(row: Row) -> Any:
            for f in fns:
                v = f(row)
                if v is not None:
                    return v
            return None

        return self.fold(t, apply, args)

    def minmax(self, node: ast.MinMaxExpr) -> E:
        greatest = node.op == enums.MinMaxOp.IS_GREATEST
        args = [self.expr(a) for a in node.args or ()]
        name = "GREATEST" if greatest else "LEAST"
        t = self.common_type(args, name)
        assert t is not None
        args = [self.coerce(a, t) for a in args]
        kind = self.comparable(args[0], args[0], ">")[2]
        better = COMPARE[kind][">" if greatest else "<"]
        fns = [a.run for a in args]

        def apply(row: Row) -> Any:
            best = None
            for f in fns:
                v = f(row)
                if v is not None and (best is None or better(v, best)):
                    best = v
            return best

        return self.fold(t, apply, args)

    def case(self, node: ast.CaseExpr) -> E:
        whens: list[ast.CaseWhen] = list(node.args or ())
        if node.arg is not None:
            conditions = [self.compare_nodes("=", node.arg, w.expr) for w in whens]
        else:
            conditions = [self.boolean(self.expr(w.expr), "CASE/WHEN") for w in whens]
        results = [self.expr(w.result) for w in whens]
        default = self.expr(node.defresult) if node.defresult is not None else E(UNKNOWN)
        t = self.common_type([default, *results], "CASE")  # PostgreSQL puts the ELSE result first
        assert t is not None
        results = [self.coerce(r, t) for r in results]
        default = self.coerce(default, t)
        pairs = [(c.run, r.run) for c, r in zip(conditions, results, strict=True)]
        otherwise = default.run

        def apply(row: Row) -> Any:
            for condition, result in pairs:
                if condition(row) is True:
                    return result(row)
            return otherwise(row)

        return self.fold(t, apply, [*conditions, *results, default])

    # ------------------------------------------------------------------------------ functions

    def func(self, node: ast.FuncCall) -> E:
        name = func_name(node)[1]
        args = [self.expr(a) for a in node.args or ()]
        signature = f"{name}({', '.join(str(a.type) for a in args)})"
        return _FUNCTION_COMPILERS[name](self, name, args, signature)

    def f_case(self, name: str, args: list[E], signature: str) -> E:
        arg = self.text_arg(args[0], signature)
        if arg.fn is None and arg.value is not None and not arg.value.isascii():
            self.fail(
                f"{name}() of the non-ASCII constant '{arg.value}' depends on the database's default collation:"
                " write the result instead"
            )
        return self.apply(TEXT, lower if name == "lower" else upper, [arg])

    def f_length(self, name: str, args: list[E], signature: str) -> E:
        (arg,) = args
        self.usable(arg)
        if arg.type.name == "bpchar":
            return self.apply(INT4, lambda s: len(s.rstrip(" ")), [arg])
        if arg.type.name == "bytea" and name == "length":
            return self.apply(INT4, len, [arg])
        return self.apply(INT4, len, [self.text_arg(arg, signature)])

    def f_abs(self, name: str, args: list[E], signature: str) -> E:
        (arg,) = self.numeric_args(args, signature, ("int2", "int4", "int8", "numeric", "float4", "float8"))
        t = arg.type.name
        impl: Callable[[Any], Any] = abs
        if t in INTS:
            check = int_check(t)
            impl = lambda v: check(abs(v))  # noqa: E731
        elif t == "numeric":
            impl = NCTX.abs
        return self.apply(arg.type.bare, impl, [arg])

    def f_mod(self, name: str, args: list[E], signature: str) -> E:
        args = self.numeric_args(args, signature, ("int2", "int4", "int8", "numeric"))
        t = args[0].type
        impl = num_mod if t.name == "numeric" else int_mod
        return self.apply(t.bare, impl, args)

    def f_rounding(self, name: str, args: list[E], signature: str) -> E:
        mode = {"round": ROUND_HALF_UP, "trunc": ROUND_DOWN, "floor": ROUND_FLOOR}.get(name, ROUND_CEILING)
        if len(args) == 2:
            value = self.numeric_args(args[:1], signature, ("numeric",))[0]
            places = self.int4_arg(args[1], signature)
            return self.apply(NUMERIC, lambda d, n: num_round(d, n, mode), [value, places])
        (value,) = self.numeric_args(args, signature, ("float8", "numeric"))
        if value.type.name == "numeric":
            return self.apply(NUMERIC, lambda d: num_round(d, 0, mode), [value])
        float_fn: Callable[[float], int] = _FLOAT_ROUNDING[name]
        return self.apply(FLOAT8, lambda x: float(float_fn(x)) if math.isfinite(x) else x, [value])

    def f_substr(self, name: str, args: list[E], signature: str) -> E:
        text = self.text_arg(args[0], signature)
        numbers = [self.int4_arg(a, signature) for a in args[1:]]
        return self.apply(TEXT, substr, [text, *numbers])

    def f_trim(self, name: str, args: list[E], signature: str) -> E:
        texts = [self.text_arg(a, signature) for a in args]
        method = {"btrim": str.strip, "ltrim": str.lstrip, "rtrim": str.rstrip}[name]
        if len(texts) == 1:
            return self.apply(TEXT, lambda s: method(s, " "), texts)
        return self.apply(TEXT, method, texts)

    def f_left_right(self, name: str, args: list[E], signature: str) -> E:
        text, count = self.text_arg(args[0], signature), self.int4_arg(args[1], signature)
        impl: Callable[[str, int], str] = (lambda s, n: s[:n]) if name == "left" else text_right
        return self.apply(TEXT, impl, [text, count])

    def f_text_functions(self, name: str, args: list[E], signature: str) -> E:
        texts = [self.text_arg(a, signature) for a in args]
        if name == "starts_with":
            return self.apply(BOOL, str.startswith, texts)
        if name == "replace":
            return self.apply(TEXT, replace, texts)
        return self.apply(INT4, strpos, texts)  # strpos(s, sub), and position(sub IN s) as parsed: (s, sub)


_FLOAT_ROUNDING: Final[dict[str, Callable[[float], int]]] = {
    "round": round,  # half to even, as rint()
    "trunc": math.trunc,
    "floor": math.floor,
    "ceil": math.ceil,
    "ceiling": math.ceil,
}


def _references_columns(node: Any) -> bool:
    if isinstance(node, ast.ColumnRef):
        return True
    if isinstance(node, ast.Node):
        return any(_references_columns(getattr(node, a)) for a in node)
    if isinstance(node, tuple):
        return any(_references_columns(n) for n in node)
    return False


_COMPILE: Final[dict[type[ast.Node], Callable[[_Compiler, Any], E]]] = {
    ast.ColumnRef: _Compiler.column,
    ast.A_Const: _Compiler.const,
    ast.TypeCast: _Compiler.cast,
    ast.A_Expr: _Compiler.a_expr,
    ast.BoolExpr: _Compiler.bool_expr,
    ast.NullTest: _Compiler.null_test,
    ast.BooleanTest: _Compiler.boolean_test,
    ast.FuncCall: _Compiler.func,
    ast.CaseExpr: _Compiler.case,
    ast.CoalesceExpr: _Compiler.coalesce,
    ast.MinMaxExpr: _Compiler.minmax,
    ast.CollateClause: _Compiler.collate,
}
_FunctionCompiler = Callable[[_Compiler, str, list[E], str], E]
_FUNCTION_COMPILERS: Final[dict[str, _FunctionCompiler]] = {
    "lower": _Compiler.f_case,
    "upper": _Compiler.f_case,
    "length": _Compiler.f_length,
    "char_length": _Compiler.f_length,
    "character_length": _Compiler.f_length,
    "abs": _Compiler.f_abs,
    "mod": _Compiler.f_mod,
    "round": _Compiler.f_rounding,
    "trunc": _Compiler.f_rounding,
    "floor": _Compiler.f_rounding,
    "ceil": _Compiler.f_rounding,
    "ceiling": _Compiler.f_rounding,
    "substr": _Compiler.f_substr,
    "substring": _Compiler.f_substr,
    "btrim": _Compiler.f_trim,
    "ltrim": _Compiler.f_trim,
    "rtrim": _Compiler.f_trim,
    "left": _Compiler.f_left_right,
    "right": _Compiler.f_left_right,
    "starts_with": _Compiler.f_text_functions,
    "replace": _Compiler.f_text_functions,
    "strpos": _Compiler.f_text_functions,
    "position": _Compiler.f_text_functions,
}

"""Row-filter expressions: PostgreSQL's WHERE syntax, parsed by pglast (PostgreSQL's own parser) and compiled to
Python closures over pgoutput tuples that evaluate it as PostgreSQL 15 does.

``parse_filter`` checks what needs no column types: the syntax, one expression, and PostgreSQL's row-filter
restrictions (no user-defined or non-immutable functions, operators, types or collations, no system columns,
subqueries, aggregates, window functions or parameters). ``compile_filter`` resolves column types, operators,
functions and implicit casts as PostgreSQL's parser does, and returns a predicate taking a pgoutput ``Row``
and returning True, False or None (SQL NULL). Columns are converted lazily, only the ones the expression
reaches; the predicate raises ``Unevaluable`` when a value it needs is an unchanged TOAST value or when
PostgreSQL would raise an error (division by zero, integer out of range, ...). Constant sub-expressions are
computed once at compile time; one that fails is a ``FilterError`` (PostgreSQL would fail when decoding).

Supported:

* Types: smallint, integer, bigint, oid, numeric[(p,s)], real, double precision, text, varchar[(n)],
  char[(n)], name, boolean, date, time, timestamp, timestamptz, interval, uuid, bytea. Columns of other
  built-in types (json, jsonb, arrays, ...) may only be tested with IS [NOT] NULL or IS [NOT] DISTINCT FROM
  NULL; columns of user-defined types not at all (PostgreSQL refuses them too).
* Operators: = <> != < > <= >= on any supported type; + - * / % on numbers (PostgreSQL's result types and
  overflow checks; integer division truncates, % takes the dividend's sign); unary - and +; || on text;
  [NOT] LIKE / ILIKE with ESCAPE; AND OR NOT; [NOT] IN; [NOT] BETWEEN [SYMMETRIC]; IS [NOT] NULL;
  IS [NOT] DISTINCT FROM; IS [NOT] TRUE / FALSE / UNKNOWN; CASE; COALESCE; NULLIF; GREATEST; LEAST;
  COLLATE "C" / "POSIX" / "ucs_basic".
* Functions: lower, upper, length, char_length, character_length, abs, mod, round, trunc, floor, ceil,
  ceiling, substr, substring, btrim, ltrim, rtrim, TRIM(...), left, right, starts_with, replace, strpos,
  position (optionally qualified with pg_catalog).
* Casts ``x::type`` / ``CAST(x AS type)`` between the supported types where PostgreSQL has an immutable cast
  that is not an I/O conversion (PostgreSQL rejects ``text_column::integer`` in a row filter; a literal may be
  cast to any supported type).

Deliberate choices (see ``ParsedFilter.ordered_text_columns``):

* Text is ordered by code point, i.e. as under collation "C", and lower(), upper() and ILIKE map ASCII letters
  only, as PostgreSQL does under collation "C". Under any other collation PostgreSQL may order or case-map
  differently; the columns for which that matters are listed in ``ordered_text_columns`` so that the caller
  can warn. Equality is exact (as with every deterministic collation; nondeterministic ICU collations are not
  emulated). Text built from constants alone takes the database's default collation in PostgreSQL: cdcd
  evaluates it as "C" too, and refuses lower()/upper() of a non-ASCII constant.
* A timestamptz literal without a UTC offset is read as UTC (PostgreSQL reads it in the TimeZone of the
  session that creates the publication). Special inputs that depend on the clock ('now', 'today', ...) are
  refused: PostgreSQL would freeze them when the publication is created.
* Numeric arithmetic is exact (decimal.Decimal with unbounded precision); division uses PostgreSQL's result
  scale (at least 16 significant digits, select_div_scale) and rounds half away from zero, as PostgreSQL.
  Float arithmetic is IEEE double (float4 results rounded to float4) with PostgreSQL's overflow and underflow
  errors; implicit casts and operator/function resolution follow PostgreSQL (e.g. integer vs real compares as
  double precision, round(integer) is round(double precision)).
* A constant sub-expression that fails (1/0, 'abc'::integer, an invalid LIKE pattern) is a FilterError:
  PostgreSQL accepts the publication but fails every decoding that reaches it.
* Casts between text and other types are refused except on literals: PostgreSQL refuses those I/O conversion
  casts in row filters (so does cdcd, rather than failing per row).
* A literal of a date/time or interval type must be in ISO 8601 form ('2024-01-31', '2024-01-31 10:00:00+02',
  '1 day 02:00:00', 'P1DT2H', '3 hours'); other forms PostgreSQL accepts are refused. Text-form values sent by
  the server must use DateStyle ISO and IntervalStyle postgres or iso_8601 (the defaults).
* An unchanged TOAST value is an unknown value: AND and OR still settle when another operand decides
  (false AND x is false), anything else that needs it raises ``Unevaluable``; IS [NOT] NULL needs no value.
* The pushed-down ``sql`` is pglast's canonical form of the expression, assuming standard_conforming_strings
  (PostgreSQL's default).
"""

from __future__ import annotations

import functools
import math
import operator
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import (
    MAX_EMAX,
    MAX_PREC,
    MIN_EMIN,
    ROUND_CEILING,
    ROUND_DOWN,
    ROUND_FLOOR,
    ROUND_HALF_UP,
    Context,
    Decimal,
)
from fractions import Fraction
from typing import Any, Final, NoReturn

from pglast import ast, enums, parse_sql
from pglast.parser import ParseError, scan
from pglast.stream import RawStream

from cdcd.avro.types import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    days_from_civil,
    numeric_typmod,
    parse_interval_text,
    type_mapping,
)
from cdcd.pgoutput.messages import UNCHANGED_TOAST, Row

__all__ = ["ColumnType", "FilterError", "ParsedFilter", "Predicate", "Unevaluable", "compile_filter", "parse_filter"]

# ============================================================================================= public API


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


@dataclass(frozen=True)
class ParsedFilter:
    """A filter that passed the checks needing no column types.

    ``ordered_text_columns`` names the columns whose value reaches, through text-preserving expressions
    (columns, COALESCE, ||, casts to text, lower(), substr(), ...), an ordering comparison (<, <=, >, >=,
    BETWEEN, GREATEST, LEAST) or a case mapping (lower, upper, ILIKE) without an explicit COLLATE: their
    result depends on the column's collation, which cdcd evaluates as "C". It is computed without column
    types, so it may name columns that are not text at all (their collation is irrelevant).
    """

    text: str
    sql: str
    columns: frozenset[str]
    ordered_text_columns: frozenset[str]


@dataclass(frozen=True)
class ColumnType:
    name: str
    type_oid: int
    type_modifier: int


Predicate = Callable[[Row], bool | None]


def parse_filter(text: str) -> ParsedFilter:
    """Check ``text`` (syntax and the restrictions that need no column types). Raises FilterError."""
    return _parse(text)[0]


def compile_filter(parsed: ParsedFilter, columns: Sequence[ColumnType]) -> Predicate:
    """The predicate of ``parsed`` for a table whose columns, in tuple order, are ``columns``.

    Raises FilterError for unknown columns and type errors. The predicate returns True, False or None (SQL
    NULL) and raises Unevaluable when the row's value cannot be computed.
    """
    tree = _parse(parsed.text)[1]
    compiler = _Compiler(parsed.text, columns)
    result = compiler.boolean(compiler.expr(tree), "WHERE")
    if result.fn is None:
        value: bool | None = result.value
        return lambda row: value
    fn: Predicate = result.fn
    return fn


# ============================================================================================= parsing

_WRAP: Final = "SELECT 1 FROM t WHERE ("
_SYSTEM_COLUMNS: Final = frozenset({"ctid", "xmin", "xmax", "cmin", "cmax", "tableoid"})
_C_COLLATIONS: Final = frozenset({"C", "POSIX", "ucs_basic"})
_COMPARISONS: Final = frozenset({"=", "<>", "<", ">", "<=", ">="})
_ORDERINGS: Final = frozenset({"<", ">", "<=", ">="})
_OPERATORS: Final = _COMPARISONS | {"+", "-", "*", "/", "%", "||", "~~", "~~*", "!~~", "!~~*"}
_LIKES: Final = {"~~": (False, False), "!~~": (True, False), "~~*": (False, True), "!~~*": (True, True)}

# name -> allowed argument counts
_FUNCTIONS: Final[dict[str, tuple[int, ...]]] = {
    "lower": (1,),
    "upper": (1,),
    "length": (1,),
    "char_length": (1,),
    "character_length": (1,),
    "abs": (1,),
    "mod": (2,),
    "round": (1, 2),
    "trunc": (1, 2),
    "floor": (1,),
    "ceil": (1,),
    "ceiling": (1,),
    "substr": (2, 3),
    "substring": (2, 3),
    "btrim": (1, 2),
    "ltrim": (1, 2),
    "rtrim": (1, 2),
    "left": (2,),
    "right": (2,),
    "starts_with": (2,),
    "replace": (3,),
    "strpos": (2,),
    "position": (2,),
}
_CASE_MAPPING: Final = frozenset({"lower", "upper"})
_TEXT_RESULT: Final = frozenset(
    {"lower", "upper", "substr", "substring", "btrim", "ltrim", "rtrim", "left", "right", "replace"}
)
_NOT_IMMUTABLE: Final = frozenset(
    {
        "now", "statement_timestamp", "transaction_timestamp", "clock_timestamp", "timeofday", "random",
        "random_normal", "setseed", "nextval", "currval", "lastval", "setval", "txid_current",
        "txid_current_if_assigned", "txid_current_snapshot", "pg_current_xact_id", "pg_current_xact_id_if_assigned",
        "pg_current_snapshot", "to_char", "to_date", "concat", "concat_ws", "format", "current_setting",
        "set_config", "pg_backend_pid", "inet_client_addr", "inet_client_port", "inet_server_addr",
        "inet_server_port", "version", "gen_random_uuid", "pg_sleep", "current_database", "current_schema",
        "current_schemas", "current_user", "session_user", "current_role", "pg_postmaster_start_time",
        "pg_conf_load_time", "localtime", "localtimestamp", "current_date", "current_time", "current_timestamp",
        "pg_export_snapshot", "timezone",
    }
)  # fmt: skip
_AGGREGATES: Final = frozenset(
    {
        "count", "sum", "avg", "min", "max", "array_agg", "string_agg", "bool_and", "bool_or", "every",
        "bit_and", "bit_or", "bit_xor", "json_agg", "jsonb_agg", "json_object_agg", "jsonb_object_agg",
        "xmlagg", "stddev", "stddev_pop", "stddev_samp", "variance", "var_pop", "var_samp", "corr",
        "covar_pop", "covar_samp", "regr_avgx", "regr_avgy", "regr_count", "regr_intercept", "regr_r2",
        "regr_slope", "regr_sxx", "regr_sxy", "regr_syy", "percentile_cont", "percentile_disc", "mode",
        "range_agg", "range_intersect_agg", "any_value", "rank", "dense_rank", "percent_rank", "cume_dist",
        "row_number", "ntile", "lag", "lead", "first_value", "last_value", "nth_value",
    }
)  # fmt: skip
_NODE_NAMES: Final[dict[type[ast.Node], str]] = {
    ast.A_ArrayExpr: "array constructors are",
    ast.A_Indirection: "subscripts and field selections are",
    ast.RowExpr: "row constructors are",
    ast.GroupingFunc: "GROUPING() is",
    ast.XmlExpr: "XML expressions are",
    ast.NamedArgExpr: "named function arguments are",
}


@functools.lru_cache(maxsize=256)
def _parse(text: str) -> tuple[ParsedFilter, ast.Node]:
    if not text.strip():
        raise FilterError(text, "the expression is empty")
    _check_parentheses(text)
    tree = _where_clause(text, text)
    checker = _Checker(text)
    checker.visit(tree)
    sql = RawStream()(tree)
    if _where_clause(sql, text) != tree:  # the pushed-down text must mean exactly what was checked
        raise FilterError(text, f"cannot be rendered back to SQL faithfully (got {sql})")
    return ParsedFilter(text, sql, frozenset(checker.columns), frozenset(checker.ordered)), tree


def _check_parentheses(text: str) -> None:
    try:
        tokens = scan(text)
    except ParseError as exc:
        raise FilterError(text, _syntax_error(str(exc), text, 0)) from None
    depth = 0
    for token in tokens:
        depth += {"ASCII_40": 1, "ASCII_41": -1}.get(token.name, 0)
        if depth < 0:
            raise FilterError(text, f"unbalanced parenthesis at character {token.start + 1}")
        if token.name == "ASCII_59":
            raise FilterError(text, "a row filter is one expression: ';' is not allowed")
    if depth:
        raise FilterError(text, "unbalanced parentheses: missing ')'")


def _where_clause(text: str, shown: str) -> ast.Node:
    """The expression ``text`` parsed as the WHERE clause of a fixed query (so it cannot be anything else)."""
    try:
        statements = parse_sql(f"{_WRAP}{text}\n)")
    except ParseError as exc:
        raise FilterError(shown, _syntax_error(str(exc), text, len(_WRAP))) from None
    stmt = statements[0].stmt if len(statements) == 1 else None
    if not isinstance(stmt, ast.SelectStmt) or stmt.whereClause is None or _extra_clauses(stmt):
        raise FilterError(shown, "a row filter must be a single expression")
    where: ast.Node = stmt.whereClause
    return where


def _extra_clauses(stmt: ast.SelectStmt) -> bool:
    others = (
        stmt.distinctClause, stmt.intoClause, stmt.groupClause, stmt.havingClause, stmt.windowClause,
        stmt.valuesLists, stmt.sortClause, stmt.limitOffset, stmt.limitCount, stmt.lockingClause,
        stmt.withClause, stmt.larg, stmt.rarg,
    )  # fmt: skip
    return any(o for o in others) or len(stmt.targetList or ()) != 1 or len(stmt.fromClause or ()) != 1


def _syntax_error(message: str, text: str, offset: int) -> str:
    """pglast's message with its position made relative to ``text`` (found at ``offset`` in what was parsed)."""
    m = re.fullmatch(r"(.*), at index (\d+)", message, re.S)
    if m is None:
        return f"syntax error: {message}"
    position = int(m.group(2)) - offset
    if position >= len(text.rstrip()):
        return "syntax error at the end of the expression (it is incomplete)"
    reason = m.group(1) if m.group(1).startswith("syntax error") else f"syntax error: {m.group(1)}"
    return f"{reason} (at character {position + 1})"


def _names(nodes: tuple[Any, ...] | None) -> tuple[str, ...]:
    return tuple((n.sval or "") if isinstance(n, ast.String) else "*" for n in nodes or ())


def _func_name(node: ast.FuncCall) -> tuple[str | None, str]:
    """(schema or None, name) of a function call."""
    names = _names(node.funcname)
    return (names[0] if len(names) > 1 else None), names[-1]


def _operator_name(node: ast.A_Expr) -> str | None:
    """The operator of ``node``, without a pg_catalog qualification; None when qualified otherwise."""
    names = _names(node.name)
    if len(names) == 2 and names[0] == "pg_catalog":
        return names[1]
    return names[0] if len(names) == 1 else None


def _show(node: ast.Node | None) -> str:
    if node is None:
        return ""
    try:
        return str(RawStream()(node))
    except Exception:  # a node pglast cannot print on its own: name its kind
        return type(node).__name__


def _text_flow(node: ast.Node | None) -> tuple[frozenset[str], bool]:
    """(columns whose collation flows into ``node``'s value, whether an explicit COLLATE decides it)."""
    if isinstance(node, ast.ColumnRef):
        return frozenset(_names(node.fields)[-1:]), False
    if isinstance(node, ast.CollateClause):
        return frozenset(), True
    parts: Iterable[ast.Node | None] = ()
    if isinstance(node, ast.TypeCast):
        parts = (node.arg,)
    elif isinstance(node, ast.FuncCall) and _func_name(node)[1] in _TEXT_RESULT:
        parts = node.args or ()
    elif isinstance(node, ast.A_Expr) and (node.kind == enums.A_Expr_Kind.AEXPR_NULLIF or _operator_name(node) == "||"):
        parts = (node.lexpr, *_as_tuple(node.rexpr))
    elif isinstance(node, ast.CoalesceExpr | ast.MinMaxExpr):
        parts = node.args or ()
    elif isinstance(node, ast.CaseExpr):
        parts = (*(w.result for w in node.args or ()), node.defresult)
    return _merge_flows(parts)


def _merge_flows(nodes: Iterable[ast.Node | None]) -> tuple[frozenset[str], bool]:
    columns: set[str] = set()
    explicit = False
    for node in nodes:
        c, e = _text_flow(node)
        columns |= c
        explicit = explicit or e
    return frozenset(columns), explicit


class _Checker:
    """The parse-time walk: PostgreSQL's row-filter restrictions, referenced and collation-sensitive columns."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.columns: set[str] = set()
        self.ordered: set[str] = set()
        self.collations: set[str] = set()

    def fail(self, reason: str) -> NoReturn:
        raise FilterError(self.text, reason)

    def visit(self, node: ast.Node | None) -> None:
        if node is None:
            return
        method = _CHECKS.get(type(node))
        if method is None:
            what = _NODE_NAMES.get(type(node)) or f"expression {_show(node)} is"
            self.fail(f"{what} not supported in a row filter")
        method(self, node)

    def visit_all(self, nodes: Iterable[ast.Node | None] | None) -> None:
        for node in nodes or ():
            self.visit(node)

    def collation_sensitive(self, nodes: Iterable[ast.Node | None]) -> None:
        columns, explicit = _merge_flows(nodes)
        if not explicit:
            self.ordered |= columns

    def column(self, node: ast.ColumnRef) -> None:
        names = _names(node.fields)
        if "*" in names:
            self.fail(f"{_show(node)} is not allowed: name the columns")
        if len(names) > 1:
            self.fail(f"qualified column reference {_show(node)} is not allowed: write the column name alone")
        if names[0] in _SYSTEM_COLUMNS:
            self.fail(f"system column {names[0]} is not allowed in a row filter")
        self.columns.add(names[0])

    def const(self, node: ast.A_Const) -> None:
        if isinstance(node.val, ast.BitString):
            self.fail(f"bit-string constant {_show(node)} is not supported")

    def cast(self, node: ast.TypeCast) -> None:
        assert node.typeName is not None
        _cast_type(node.typeName, self.fail)
        self.visit(node.arg)

    def a_expr(self, node: ast.A_Expr) -> None:
        kind = node.kind
        name = _operator_name(node)
        if kind in _UNSUPPORTED_KINDS:
            self.fail(f"{_UNSUPPORTED_KINDS[kind]} is not supported ({_show(node)})")
        if kind == enums.A_Expr_Kind.AEXPR_OP and name not in _OPERATORS:
            self.fail(f"operator {'.'.join(_names(node.name))} is not supported ({_show(node)})")
        if name in _ORDERINGS or kind in _BETWEENS:
            self.collation_sensitive((node.lexpr, *_as_tuple(node.rexpr)))
        if name in ("~~*", "!~~*"):
            self.collation_sensitive((node.lexpr, *_as_tuple(node.rexpr)))
        self.visit(node.lexpr)
        if kind in (enums.A_Expr_Kind.AEXPR_LIKE, enums.A_Expr_Kind.AEXPR_ILIKE) and _is_like_escape(node.rexpr):
            assert isinstance(node.rexpr, ast.FuncCall)
            self.visit_all(node.rexpr.args)
            return
        self.visit_all(_as_tuple(node.rexpr))

    def bool_expr(self, node: ast.BoolExpr) -> None:
        self.visit_all(node.args)

    def test(self, node: ast.NullTest | ast.BooleanTest) -> None:
        self.visit(node.arg)

    def func(self, node: ast.FuncCall) -> None:
        schema, name = _func_name(node)
        shown = f"{name}()" if schema is None else f"{schema}.{name}()"
        if node.over is not None:
            self.fail(f"window function {shown} is not allowed in a row filter")
        if node.agg_star or node.agg_distinct or node.agg_order or node.agg_filter or node.agg_within_group:
            self.fail(f"aggregate function {shown} is not allowed in a row filter")
        if schema not in (None, "pg_catalog"):
            self.fail(f"user-defined function {shown} is not allowed (row filters allow only built-in functions)")
        if name in _NOT_IMMUTABLE:
            self.fail(f"function {shown} is not immutable (row filters allow only immutable built-in functions)")
        if name in _AGGREGATES:
            self.fail(f"aggregate or window function {shown} is not allowed in a row filter")
        if name == "age" and len(node.args or ()) == 1:
            self.fail(f"function {shown} is not immutable (row filters allow only immutable built-in functions)")
        arities = _FUNCTIONS.get(name)
        if arities is None:
            self.fail(f"function {shown} is not in cdcd's list of supported built-in functions")
        if len(node.args or ()) not in arities or node.func_variadic:
            self.fail(f"function {_show(node)} is not supported: {name}() takes {' or '.join(map(str, arities))}"
                      " argument(s)")  # fmt: skip
        if name in _CASE_MAPPING:
            self.collation_sensitive(node.args or ())
        self.visit_all(node.args)

    def case(self, node: ast.CaseExpr) -> None:
        self.visit(node.arg)
        for when in node.args or ():
            self.visit(when.expr)
            self.visit(when.result)
        self.visit(node.defresult)

    def coalesce(self, node: ast.CoalesceExpr) -> None:
        self.visit_all(node.args)

    def minmax(self, node: ast.MinMaxExpr) -> None:
        self.collation_sensitive(node.args or ())
        self.visit_all(node.args)

    def collate(self, node: ast.CollateClause) -> None:
        names = _names(node.collname)
        self.collations.add(names[-1])
        if len(self.collations) > 1:
            self.fail(f"explicit collations {' and '.join(sorted(self.collations))} are mixed: use one of them")
        if names[-1] not in _C_COLLATIONS or len(names) > 2 or (len(names) == 2 and names[0] != "pg_catalog"):
            self.fail(f'collation {".".join(names)} is not supported: cdcd evaluates text only as under collation'
                      ' "C" (COLLATE "C", "POSIX" or "ucs_basic")')  # fmt: skip
        self.visit(node.arg)

    def value_function(self, node: ast.SQLValueFunction) -> None:
        self.fail(f"{_show(node)} is not immutable (row filters allow only immutable built-in functions)")

    def sublink(self, node: ast.SubLink) -> None:
        self.fail(f"subquery {_show(node)} is not allowed in a row filter")

    def param(self, node: ast.ParamRef) -> None:
        self.fail(f"parameter {_show(node)} is not allowed in a row filter")


_CHECKS: Final[dict[type[ast.Node], Callable[[_Checker, Any], None]]] = {
    ast.ColumnRef: _Checker.column,
    ast.A_Const: _Checker.const,
    ast.TypeCast: _Checker.cast,
    ast.A_Expr: _Checker.a_expr,
    ast.BoolExpr: _Checker.bool_expr,
    ast.NullTest: _Checker.test,
    ast.BooleanTest: _Checker.test,
    ast.FuncCall: _Checker.func,
    ast.CaseExpr: _Checker.case,
    ast.CoalesceExpr: _Checker.coalesce,
    ast.MinMaxExpr: _Checker.minmax,
    ast.CollateClause: _Checker.collate,
    ast.SQLValueFunction: _Checker.value_function,
    ast.SubLink: _Checker.sublink,
    ast.ParamRef: _Checker.param,
}
_UNSUPPORTED_KINDS: Final = {
    enums.A_Expr_Kind.AEXPR_OP_ANY: "op ANY (...)",
    enums.A_Expr_Kind.AEXPR_OP_ALL: "op ALL (...)",
    enums.A_Expr_Kind.AEXPR_SIMILAR: "SIMILAR TO",
}
_BETWEENS: Final = frozenset(
    {
        enums.A_Expr_Kind.AEXPR_BETWEEN,
        enums.A_Expr_Kind.AEXPR_NOT_BETWEEN,
        enums.A_Expr_Kind.AEXPR_BETWEEN_SYM,
        enums.A_Expr_Kind.AEXPR_NOT_BETWEEN_SYM,
    }
)


def _as_tuple(node: ast.Node | tuple[Any, ...] | None) -> tuple[Any, ...]:
    if node is None:
        return ()
    return node if isinstance(node, tuple) else (node,)


def _is_like_escape(node: object) -> bool:
    return isinstance(node, ast.FuncCall) and _func_name(node) == ("pg_catalog", "like_escape")


# ============================================================================================= types


@dataclass(frozen=True, slots=True)
class _T:
    """A PostgreSQL type as the compiler sees it: internal name, typmod parameters, label for other types."""

    name: str
    mod: tuple[int, ...] = ()
    label: str = ""

    def __str__(self) -> str:
        base = self.label or _DISPLAY.get(self.name, self.name)
        return f"{base}({','.join(map(str, self.mod))})" if self.mod else base

    @property
    def bare(self) -> _T:
        return _T(self.name) if self.mod else self


_DISPLAY: Final = {
    "int2": "smallint", "int4": "integer", "int8": "bigint", "float4": "real", "float8": "double precision",
    "varchar": "character varying", "bpchar": "character", "bool": "boolean", "time": "time without time zone",
    "timestamp": "timestamp without time zone", "timestamptz": "timestamp with time zone",
}  # fmt: skip
_OIDS: Final = {
    16: "bool", 17: "bytea", 19: "name", 20: "int8", 21: "int2", 23: "int4", 25: "text", 26: "oid", 700: "float4",
    701: "float8", 1042: "bpchar", 1043: "varchar", 1082: "date", 1083: "time", 1114: "timestamp",
    1184: "timestamptz", 1186: "interval", 1700: "numeric", 2950: "uuid",
}  # fmt: skip
_TYPE_OIDS: Final = {name: oid for oid, name in _OIDS.items()}
_FIRST_NORMAL_OID: Final = 16384

_INTS: Final = frozenset({"int2", "int4", "int8"})
_FLOATS: Final = frozenset({"float4", "float8"})
_NUMBERS: Final = _INTS | _FLOATS | {"numeric"}
_STRINGS: Final = frozenset({"text", "varchar", "bpchar", "name"})
_RANK: Final = {"int2": 0, "int4": 1, "int8": 2, "numeric": 3, "float4": 4, "float8": 5}
_INT_LIMITS: Final = {
    "int2": (-(2**15), 2**15 - 1, "smallint out of range"),
    "int4": (-(2**31), 2**31 - 1, "integer out of range"),
    "int8": (-(2**63), 2**63 - 1, "bigint out of range"),
}
UNKNOWN: Final = _T("unknown")
BOOL: Final = _T("bool")
TEXT: Final = _T("text")
INT4: Final = _T("int4")
INT8: Final = _T("int8")
NUMERIC: Final = _T("numeric")
FLOAT8: Final = _T("float8")


def _column_type(column: ColumnType) -> _T:
    name = _OIDS.get(column.type_oid)
    if name is None:
        return _T("other", label=type_mapping(column.type_oid).pg_type)
    mod = column.type_modifier
    if name == "numeric":
        pm = numeric_typmod(mod)
        return _T(name, pm or ())
    if name in ("bpchar", "varchar") and mod >= 4:
        return _T(name, (mod - 4,))
    return _T(name)


def _cast_type(tn: ast.TypeName, fail: Callable[[str], NoReturn]) -> _T:
    """The supported built-in type a cast names."""
    names = _names(tn.names)
    shown = _show(tn)
    if len(names) > 2 or (len(names) == 2 and names[0] != "pg_catalog") or names[-1] not in _TYPE_OIDS:
        fail(f"cast to {shown}: casts to user-defined or unsupported types are not allowed")
    if tn.arrayBounds or tn.setof or tn.pct_type:
        fail(f"cast to {shown}: casts to user-defined or unsupported types are not allowed")
    name = names[-1]
    mods = tuple(_typmod_value(m, shown, fail) for m in tn.typmods or ())
    if not mods:
        return _T(name)
    if name == "numeric" and len(mods) <= 2:
        precision, scale = mods[0], (mods[1] if len(mods) == 2 else 0)
        if not 1 <= precision <= 1000 or not -1000 <= scale <= 1000:
            fail(f"cast to {shown}: NUMERIC precision must be between 1 and 1000, scale between -1000 and 1000")
        return _T(name, (precision, scale))
    if name in ("bpchar", "varchar") and len(mods) == 1:
        if not 1 <= mods[0] <= 10_485_760:
            fail(f"cast to {shown}: length for type {name} must be between 1 and 10485760")
        return _T(name, mods)
    fail(f"cast to {shown}: type modifiers are supported only for numeric, char and varchar")


def _typmod_value(node: Any, shown: str, fail: Callable[[str], NoReturn]) -> int:
    if isinstance(node, ast.A_Const) and isinstance(node.val, ast.Integer) and node.val.ival is not None:
        return node.val.ival
    fail(f"cast to {shown}: unsupported type modifier")


# ============================================================================================= values
#
# Python representation of each type's values: integers (int2/int4/int8/oid) int; numeric Decimal; float4 and
# float8 float (float4 values are exactly representable in float4); text types str (bpchar with its padding);
# bool bool; date int days since 1970-01-01; time int µs; timestamp/timestamptz int µs since 1970-01-01 UTC
# (±infinity as types.py's extremes); interval int, PostgreSQL's comparison value (months*30 days + days, in
# µs); uuid canonical lower-case str; bytea bytes.

_NCTX: Final = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[])  # exact; NaN instead of errors
_NAN: Final = Decimal("NaN")
_INF: Final = Decimal("Infinity")
_NINF: Final = Decimal("-Infinity")
_ONE: Final = Decimal(1)
_US_PER_DAY: Final = 86_400_000_000
_TS_MIN: Final = days_from_civil(-4713, 11, 24) * _US_PER_DAY  # 4714-11-24 BC
_TS_END: Final = days_from_civil(294277, 1, 1) * _US_PER_DAY  # exclusive
_DATE_END: Final = days_from_civil(5874898, 1, 1)
_F4: Final = struct.Struct("<f")
_U32: Final = struct.Struct("<I")
_INTERVAL: Final = struct.Struct(">qii")
_NAN_F: Final = float("nan")
_F4_TINY: Final = float(_F4.unpack(_U32.pack(1))[0])  # the smallest positive float4


def _interval_key(months: int, days: int, micros: int) -> int:
    return (months * 30 + days) * _US_PER_DAY + micros


def _f4(x: float) -> float:
    """``x`` rounded to float4 (ties to even); OverflowError when finite ``x`` rounds past the float4 range."""
    return float(_F4.unpack(_F4.pack(x))[0])


def _f4_exact(x: Decimal | int | str) -> float:
    """The float4 nearest to ``x`` (one rounding, as strtof), not float4(float8(x)) which can round twice."""
    d = float(x)
    r = _f4(d)
    if r == d or not math.isfinite(d):
        return r
    bits = _U32.unpack(_F4.pack(r))[0]
    step = 1 if (d > r) == (r > 0) else -1
    other = float(_F4.unpack(_U32.pack(bits + step))[0]) if r else math.copysign(_F4_TINY, d)
    if (r + other) / 2 != d:
        return r
    exact = Fraction(Decimal(x) if isinstance(x, str) else x)
    if exact == Fraction(d):
        return r
    return max(r, other) if exact > Fraction(d) else min(r, other)


def _dscale(d: Decimal) -> int:
    exponent = d.as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


def _dec(d: Decimal) -> Decimal:
    """``d`` with a non-positive exponent (numeric has no positive exponents: 1E+3 is 1000, dscale 0)."""
    exponent = d.as_tuple().exponent
    if isinstance(exponent, int) and exponent > 0:
        return d.quantize(_ONE, context=_NCTX)
    return d


def _int_check(type_name: str) -> Callable[[int], int]:
    lo, hi, message = _INT_LIMITS[type_name]

    def check(v: int) -> int:
        if lo <= v <= hi:
            return v
        raise Unevaluable(message)

    return check


def _int_div(a: int, b: int) -> int:
    if b == 0:
        raise Unevaluable("division by zero")
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def _int_mod(a: int, b: int) -> int:
    if b == 0:
        raise Unevaluable("division by zero")
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def _checked_int_op(op: Callable[[int, int], int], type_name: str) -> Callable[[int, int], int]:
    lo, hi, message = _INT_LIMITS[type_name]

    def apply(a: int, b: int) -> int:
        r = op(a, b)
        if lo <= r <= hi:
            return r
        raise Unevaluable(message)

    return apply


def _weight(d: Decimal) -> tuple[int, int]:
    """PostgreSQL's base-10000 weight and first digit of a nonzero finite numeric."""
    w = d.adjusted() // 4
    return w, int(_NCTX.scaleb(abs(d), Decimal(-4 * w)))


def _div_scale(a: Decimal, b: Decimal) -> int:
    """numeric.c select_div_scale: at least 16 significant digits, no less than either input's scale."""
    w1, f1 = _weight(a) if a else (0, 0)
    w2, f2 = _weight(b)
    qweight = w1 - w2 - (1 if f1 <= f2 else 0)
    return min(max(16 - 4 * qweight, _dscale(a), _dscale(b), 0), 1000)


def _num_div(a: Decimal, b: Decimal) -> Decimal:
    if a.is_nan() or b.is_nan():
        return _NAN
    if not b:
        raise Unevaluable("division by zero")
    if a.is_infinite():
        return _NAN if b.is_infinite() else (_INF if (a > 0) == (b > 0) else _NINF)
    if b.is_infinite():
        return Decimal(0)
    scale = _div_scale(a, b)
    n1, d1 = a.as_integer_ratio()
    n2, d2 = b.as_integer_ratio()
    num, den = n1 * d2 * 10**scale, d1 * n2
    q, r = divmod(abs(num), abs(den))
    q += 2 * r >= abs(den)
    return Decimal(f"{'-' if (num < 0) != (den < 0) and q else ''}{q}E-{scale}")


def _num_mod(a: Decimal, b: Decimal) -> Decimal:
    if a.is_nan() or b.is_nan():
        return _NAN
    if not b:
        raise Unevaluable("division by zero")
    if a.is_infinite():
        return _NAN
    if b.is_infinite():
        return a
    return _NCTX.remainder(a, b)


def _num_round(d: Decimal, scale: int, rounding: str) -> Decimal:
    if not d.is_finite():
        return d
    scale = max(min(scale, 1000), -1000)
    r = d.quantize(Decimal(f"1E{-scale}"), rounding=rounding, context=_NCTX)
    return r.quantize(_ONE, context=_NCTX) if scale < 0 else r


def _num_to_int(type_name: str) -> Callable[[Decimal], int]:
    check = _int_check(type_name)

    def convert(d: Decimal) -> int:
        if d.is_nan():
            raise Unevaluable(f"cannot convert NaN to {_DISPLAY[type_name]}")
        if d.is_infinite():
            raise Unevaluable(f"cannot convert infinity to {_DISPLAY[type_name]}")
        return check(int(d.quantize(_ONE, rounding=ROUND_HALF_UP, context=_NCTX)))

    return convert


def _numeric_typmod(precision: int, scale: int) -> Callable[[Decimal], Decimal]:
    def apply(d: Decimal) -> Decimal:
        if d.is_nan():
            return d
        if d.is_infinite():
            raise Unevaluable(f"numeric field overflow: numeric({precision},{scale}) cannot hold an infinite value")
        r = _num_round(d, scale, ROUND_HALF_UP)
        if r and r.adjusted() >= precision - scale:
            raise Unevaluable(
                f"numeric field overflow: a field with precision {precision}, scale {scale} must round to an"
                f" absolute value less than 10^{precision - scale}"
            )
        return r

    return apply


def _float_to_int(type_name: str) -> Callable[[float], int]:
    check = _int_check(type_name)
    message = _INT_LIMITS[type_name][2]

    def convert(x: float) -> int:
        if math.isnan(x) or math.isinf(x):
            raise Unevaluable(message)
        return check(round(x))  # round() is rint's round-half-even

    return convert


def _float_to_numeric(digits: int) -> Callable[[float], Decimal]:
    def convert(x: float) -> Decimal:
        if math.isnan(x):
            return _NAN
        if math.isinf(x):
            return _INF if x > 0 else _NINF
        d = _dec(Decimal(f"{x:.{digits}g}"))
        return d if d else abs(d)

    return convert


def _to_float4(x: Decimal | int | float) -> float:
    try:
        r = _f4(x) if isinstance(x, float) else _f4_exact(x)
    except OverflowError:
        raise Unevaluable("value out of range: overflow") from None
    if r == 0 and x != 0:
        raise Unevaluable("value out of range: underflow")
    return r


def _f8_op(op: str, single: bool) -> Callable[[float, float], float]:
    """PostgreSQL's float8 (or, with ``single``, float4) arithmetic with its overflow/underflow errors."""
    fn: Callable[[float, float], float] = {
        "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    }[op]  # fmt: skip

    def apply(a: float, b: float) -> float:
        if op == "/" and b == 0:
            if math.isnan(a):
                return _NAN_F
            raise Unevaluable("division by zero")
        r = fn(a, b)
        if single and not math.isinf(r):
            try:
                r = _f4(r)
            except OverflowError:
                raise Unevaluable("value out of range: overflow") from None
        if math.isinf(r) and not math.isinf(a) and not math.isinf(b):
            raise Unevaluable("value out of range: overflow")
        if r == 0 and a != 0 and ((op == "*" and b != 0) or (op == "/" and not math.isinf(b))):
            raise Unevaluable("value out of range: underflow")
        return r

    return apply


def _date_to_ts(days: int) -> int:
    if days == INT32_MAX:
        return INT64_MAX
    if days == INT32_MIN:
        return INT64_MIN
    us = days * _US_PER_DAY
    if us >= _TS_END:
        raise Unevaluable("date out of range for timestamp")
    return us


def _ts_to_date(us: int) -> int:
    if us == INT64_MAX:
        return INT32_MAX
    if us == INT64_MIN:
        return INT32_MIN
    return us // _US_PER_DAY


def _ts_to_time(us: int) -> int | None:
    return None if us in (INT64_MAX, INT64_MIN) else us % _US_PER_DAY


_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER: Final = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _lower(s: str) -> str:
    return s.lower() if s.isascii() else s.translate(_ASCII_LOWER)


def _upper(s: str) -> str:
    return s.upper() if s.isascii() else s.translate(_ASCII_UPPER)


def _rtrim_spaces(s: str) -> str:
    return s.rstrip(" ")


def _to_name(s: str) -> str:
    b = s.encode()
    return b[:63].decode(errors="ignore") if len(b) > 63 else s


def _bool_to_text(b: bool) -> str:
    return "true" if b else "false"


def _bpchar_length(n: int) -> Callable[[str], str]:
    def apply(s: str) -> str:
        return s[:n].ljust(n)

    return apply


def _varchar_length(n: int) -> Callable[[str], str]:
    def apply(s: str) -> str:
        return s[:n]

    return apply


def _int_to_oid(v: int) -> int:
    return v & 0xFFFFFFFF


def _int8_to_oid(v: int) -> int:
    if 0 <= v <= 0xFFFFFFFF:
        return v
    raise Unevaluable("OID out of range")


def _oid_to_int4(v: int) -> int:
    return v - 2**32 if v >= 2**31 else v


def _substr(s: str, start: int, count: int | None = None) -> str:
    if count is None:
        return s[max(start, 1) - 1 :]
    if count < 0:
        raise Unevaluable("negative substring length not allowed")
    end = start + count
    return s[max(start, 1) - 1 : end - 1] if end > 1 else ""


def _right(s: str, n: int) -> str:
    if n == -(2**31):  # PostgreSQL negates n in 32 bits: -(-2**31) stays negative, which keeps the whole string
        return s
    return s[-n:] if n else ""


def _replace(s: str, old: str, new: str) -> str:
    return s.replace(old, new) if old else s


def _strpos(s: str, sub: str) -> int:
    return s.find(sub) + 1


# ----------------------------------------------------------------------------------------- column values


def _readers(t: _T) -> tuple[Callable[[str], Any] | None, Callable[[bytes], Any]]:
    """(text converter or None for the text itself, binary converter) of a column type."""
    name = t.name
    if name in _STRINGS:
        return None, bytes.decode
    if name == "numeric":
        return Decimal, _numeric_binary
    if name == "float4":
        return _f4_exact, type_mapping(700).from_binary
    if name == "interval":
        return _interval_text, _interval_binary
    if name == "other":
        return None, bytes
    mapping = type_mapping(_TYPE_OIDS[name])
    return (None if name == "uuid" else mapping.from_text), mapping.from_binary


_NUMERIC_BINARY_TEXT: Final = type_mapping(1700).from_binary  # unconstrained numeric: the exact text form


def _numeric_binary(b: bytes) -> Decimal:
    return Decimal(_NUMERIC_BINARY_TEXT(b))


def _interval_text(s: str) -> int:
    return _interval_key(*parse_interval_text(s))


def _interval_binary(b: bytes) -> int:
    micros, days, months = _INTERVAL.unpack(b)
    return _interval_key(months, days, micros)


def _column_reader(index: int, name: str, t: _T) -> Callable[[Row], Any]:
    text, binary = _readers(t)
    toast = f'column "{name}" is an unchanged TOAST value (the server did not send it)'

    def failed(v: object, exc: Exception) -> NoReturn:
        raise Unevaluable(f'column "{name}": cannot read {t} value {v!r:.60}: {exc}') from None

    def read_binary(v: Any) -> Any:
        if v is UNCHANGED_TOAST:
            raise Unevaluable(toast, name)
        try:
            return binary(v)
        except (ValueError, TypeError, struct.error) as exc:
            failed(v, exc)

    if text is None:

        def read(row: Row) -> Any:
            v = row[index]
            if v.__class__ is str or v is None:
                return v
            return read_binary(v)

        return read

    convert = text

    def read_converted(row: Row) -> Any:
        v = row[index]
        if v.__class__ is str:
            try:
                return convert(v)
            except (ValueError, ArithmeticError) as exc:
                failed(v, exc)
        if v is None:
            return None
        return read_binary(v)

    return read_converted


# ----------------------------------------------------------------------------------------- literal input

_SPACE = "[ \t\n\r\v\f]*"
_INT_RE: Final = re.compile(f"{_SPACE}([+-]?[0-9]+){_SPACE}")
_NUM_RE: Final = re.compile(f"{_SPACE}([+-]?(?:[0-9]+\\.?[0-9]*|\\.[0-9]+)(?:[eE][+-]?[0-9]+)?){_SPACE}")
_SPECIALS: Final = {
    "nan": "NaN", "infinity": "Infinity", "+infinity": "Infinity", "-infinity": "-Infinity", "inf": "Infinity",
    "+inf": "Infinity", "-inf": "-Infinity",
}  # fmt: skip
_BOOLS: Final = (("true", True, 1), ("false", False, 1), ("yes", True, 1), ("no", False, 1), ("on", True, 2),
                 ("off", False, 2), ("1", True, 1), ("0", False, 1))  # fmt: skip
_DATE_RE: Final = r"(?P<y>[0-9]{4,})-(?P<m>[0-9]{1,2})-(?P<d>[0-9]{1,2})"
_TIME_RE: Final = r"(?P<H>[0-9]{1,2}):(?P<M>[0-9]{2})(?::(?P<S>[0-9]{2})(?:\.(?P<f>[0-9]+))?)?"
_ZONE_RE: Final = r"(?P<z>Z|UTC|GMT|(?P<zsign>[+-])(?P<zh>[0-9]{1,2})(?::?(?P<zm>[0-9]{2})(?::?(?P<zs>[0-9]{2}))?)?)"
_TS_RE: Final = re.compile(
    rf"\s*{_DATE_RE}(?:(?:\s+|T){_TIME_RE})?\s*{_ZONE_RE}?(?:\s*(?P<bc>BC|AD))?\s*", re.IGNORECASE
)
_TIME_ONLY_RE: Final = re.compile(rf"\s*{_TIME_RE}\s*{_ZONE_RE}?\s*", re.IGNORECASE)
_IV_TIME_RE: Final = re.compile(r"([+-]?)([0-9]+):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,6}))?)?")
_UUID_RE: Final = re.compile(r"[0-9a-fA-F]{4}(?:-?[0-9a-fA-F]{4}){7}")
_CLOCK_WORDS: Final = frozenset({"now", "today", "tomorrow", "yesterday", "allballs"})
# interval unit -> (field: 0 months, 1 days, 2 µs; multiplier)
_IV_UNITS: Final[dict[str, tuple[int, int]]] = {
    unit: field
    for units, field in (
        (("microsecond", "microseconds", "us", "usec", "usecs", "microsecon"), (2, 1)),
        (("millisecond", "milliseconds", "ms", "msec", "msecs"), (2, 1_000)),
        (("second", "seconds", "s", "sec", "secs"), (2, 1_000_000)),
        (("minute", "minutes", "m", "min", "mins"), (2, 60_000_000)),
        (("hour", "hours", "h", "hr", "hrs"), (2, 3_600_000_000)),
        (("day", "days", "d"), (1, 1)),
        (("week", "weeks", "w"), (1, 7)),
        (("month", "months", "mon", "mons"), (0, 1)),
        (("year", "years", "y", "yr", "yrs"), (0, 12)),
        (("decade", "decades"), (0, 120)),
        (("century", "centuries"), (0, 1200)),
        (("millennium", "millennia"), (0, 12000)),
    )
    for unit in units
}


class _BadInput(ValueError):
    """A literal PostgreSQL (or cdcd) cannot read as the type."""


def _input_int(type_name: str) -> Callable[[str], int]:
    lo, hi, _ = _INT_LIMITS[type_name]

    def parse(s: str) -> int:
        m = _INT_RE.fullmatch(s)
        if m is None:
            raise _BadInput(f'invalid input syntax for type {_DISPLAY[type_name]}: "{s}"')
        v = int(m.group(1))
        if not lo <= v <= hi:
            raise _BadInput(f'value "{s}" is out of range for type {_DISPLAY[type_name]}')
        return v

    return parse


def _input_oid(s: str) -> int:
    m = _INT_RE.fullmatch(s)
    if m is None or not -(2**31) <= int(m.group(1)) <= 0xFFFFFFFF:
        raise _BadInput(f'invalid input syntax for type oid: "{s}"')
    return int(m.group(1)) & 0xFFFFFFFF


def _number_text(s: str, type_label: str) -> str:
    special = _SPECIALS.get(s.strip(" \t\n\r\v\f").lower())
    if special is not None:
        return special
    m = _NUM_RE.fullmatch(s)
    if m is None:
        raise _BadInput(f'invalid input syntax for type {type_label}: "{s}"')
    return m.group(1)


def _input_numeric(s: str) -> Decimal:
    text = _number_text(s, "numeric")
    return _dec(Decimal(text))


def _input_float(single: bool) -> Callable[[str], float]:
    label = "real" if single else "double precision"

    def parse(s: str) -> float:
        text = _number_text(s, label)
        if text in ("NaN", "Infinity", "-Infinity"):
            return float(text)
        try:
            v = _f4_exact(text) if single else float(text)
        except OverflowError:
            v = math.inf
        if math.isinf(v) or (v == 0 and Decimal(text) != 0):
            raise _BadInput(f'"{s}" is out of range for type {label}')
        return v

    return parse


def _input_bool(s: str) -> bool:
    v = s.strip(" \t\n\r\v\f").lower()
    for word, value, minimum in _BOOLS:
        if len(v) >= minimum and word.startswith(v):
            return value
    raise _BadInput(f'invalid input syntax for type boolean: "{s}"')


def _days(y: str, m: str, d: str, bc: str | None, s: str) -> int:
    year, month, day = int(y), int(m), int(d)
    if bc and bc.upper() == "BC":
        year = 1 - year
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    month_days = (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
    if int(y) == 0 or not 1 <= month <= 12 or not 1 <= day <= month_days[month - 1]:
        raise _BadInput(f'date/time field value out of range: "{s}"')
    return days_from_civil(year, month, day)


def _time_us(groups: dict[str, str | None], s: str) -> int:
    hour, minute, second = int(groups["H"] or 0), int(groups["M"] or 0), int(groups["S"] or 0)
    fraction = groups["f"] or ""
    if len(fraction) > 6:
        raise _BadInput(f'"{s}": cdcd reads at most 6 fractional digits of a second')
    us = ((hour * 60 + minute) * 60 + second) * 1_000_000 + int(fraction.ljust(6, "0"))
    if minute > 59 or second > 59 or us > _US_PER_DAY:
        raise _BadInput(f'date/time field value out of range: "{s}"')
    return us


def _zone_seconds(g: dict[str, str | None], s: str) -> int:
    """The UTC offset of a timestamp literal in seconds east (0 without one: read as UTC)."""
    if g["zsign"] is None:
        return 0
    hours, minutes, seconds = int(g["zh"] or 0), int(g["zm"] or 0), int(g["zs"] or 0)
    if hours > 15 or minutes > 59 or seconds > 59:
        raise _BadInput(f'time zone displacement out of range: "{s}"')
    total = hours * 3600 + minutes * 60 + seconds
    return -total if g["zsign"] == "-" else total


def _special_time(s: str, type_label: str) -> int | None:
    word = s.strip().lower()
    if word in _CLOCK_WORDS:
        raise _BadInput(
            f"'{s}' is not allowed: PostgreSQL would freeze it when creating the publication; write the date"
        )
    if type_label == "time":
        return None
    if word == "epoch":
        return 0
    if word in ("infinity", "+infinity"):
        return INT32_MAX if type_label == "date" else INT64_MAX
    if word == "-infinity":
        return INT32_MIN if type_label == "date" else INT64_MIN
    return None


def _input_timestamp(with_tz: bool) -> Callable[[str], int]:
    label = "timestamp with time zone" if with_tz else "timestamp without time zone"

    def parse(s: str) -> int:
        special = _special_time(s, "timestamp")
        if special is not None:
            return special
        m = _TS_RE.fullmatch(s)
        if m is None:
            raise _BadInput(f'"{s}" is not an ISO 8601 {label} (cdcd reads YYYY-MM-DD[ HH:MM[:SS[.ffffff]]][+HH:MM])')
        g = m.groupdict()
        us = _days(g["y"], g["m"], g["d"], g["bc"], s) * _US_PER_DAY
        if g["H"] is not None:
            us += _time_us(g, s)
        if with_tz:
            us -= _zone_seconds(g, s) * 1_000_000
        if not _TS_MIN <= us < _TS_END:
            raise _BadInput(f'timestamp out of range: "{s}"')
        return us

    return parse


def _input_date(s: str) -> int:
    special = _special_time(s, "date")
    if special is not None:
        return special
    m = _TS_RE.fullmatch(s)
    if m is None:
        raise _BadInput(f'"{s}" is not an ISO 8601 date (cdcd reads YYYY-MM-DD)')
    g = m.groupdict()
    if g["H"] is not None:
        _time_us(g, s)
    days = _days(g["y"], g["m"], g["d"], g["bc"], s)
    if days * _US_PER_DAY < _TS_MIN or days >= _DATE_END:
        raise _BadInput(f'date out of range: "{s}"')
    return days


def _input_time(s: str) -> int:
    _special_time(s, "time")
    m = _TIME_ONLY_RE.fullmatch(s)
    if m is None:
        raise _BadInput(f'"{s}" is not an ISO 8601 time (cdcd reads HH:MM[:SS[.ffffff]])')
    return _time_us(m.groupdict(), s)


def _interval_part(tokens: list[str], i: int, fields: list[int], s: str) -> int:
    """Add the interval item at ``tokens[i]`` to ``fields``; return the index of the next item."""
    token = tokens[i]
    if ":" in token:
        m = _IV_TIME_RE.fullmatch(token)
        if m is None:
            raise _BadInput(f'invalid input syntax for type interval (cdcd reads [-]H:MM[:SS[.ffffff]]): "{s}"')
        sign, hours, minutes, seconds, fraction = m.groups()
        if int(minutes) > 59 or int(seconds or 0) > 59:
            raise _BadInput(f'interval field value out of range: "{s}"')
        us = ((int(hours) * 60 + int(minutes)) * 60 + int(seconds or 0)) * 1_000_000 + int(
            (fraction or "").ljust(6, "0")
        )
        fields[2] += -us if sign == "-" else us
        return i + 1
    m = re.fullmatch(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([a-z]*)", token)
    if m is None:
        raise _BadInput(f'invalid input syntax for type interval: "{s}"')
    number, unit = Decimal(m.group(1)), m.group(2)
    if not unit and i + 1 < len(tokens) and tokens[i + 1] in _IV_UNITS:
        unit, i = tokens[i + 1], i + 1
    if not unit and len(tokens) > 1:
        raise _BadInput(f'invalid input syntax for type interval (a number without a unit): "{s}"')
    field, multiplier = _IV_UNITS.get(unit or "second", (-1, 0))
    value = number * multiplier
    if field < 0 or value != int(value):
        raise _BadInput(f'"{s}": cdcd reads intervals as integral counts of units (fractions only of a second)')
    fields[field] += int(value)
    return i + 1


def _input_interval(s: str) -> int:
    text = s.strip().lower()
    if text.startswith("p"):
        try:
            return _interval_key(*parse_interval_text(text.upper()))
        except ValueError:
            raise _BadInput(f'invalid input syntax for type interval: "{s}"') from None
    tokens = text.split()
    if tokens[:1] == ["@"]:
        tokens = tokens[1:]
    ago = tokens[-1:] == ["ago"]
    tokens = tokens[:-1] if ago else tokens
    if not tokens:
        raise _BadInput(f'invalid input syntax for type interval: "{s}"')
    fields = [0, 0, 0]
    i = 0
    while i < len(tokens):
        i = _interval_part(tokens, i, fields, s)
    key = _interval_key(*fields)
    return -key if ago else key


def _input_uuid(s: str) -> str:
    inner = s[1:-1] if s.startswith("{") and s.endswith("}") else s
    if _UUID_RE.fullmatch(inner) is None:
        raise _BadInput(f'invalid input syntax for type uuid: "{s}"')
    h = inner.replace("-", "").lower()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _input_bytea(s: str) -> bytes:
    try:
        if s.startswith("\\x"):
            return bytes.fromhex(re.sub(r"[ \n\t\r]", "", s[2:]))
        if s.isascii():
            result: bytes = type_mapping(17).from_text(s)
            return result
    except ValueError:
        pass
    raise _BadInput(f'invalid input syntax for type bytea (cdcd reads \\x hex or ASCII escape format): "{s}"')


_INPUT: Final[dict[str, Callable[[str], Any]]] = {
    "int2": _input_int("int2"),
    "int4": _input_int("int4"),
    "int8": _input_int("int8"),
    "oid": _input_oid,
    "numeric": _input_numeric,
    "float4": _input_float(True),
    "float8": _input_float(False),
    "bool": _input_bool,
    "text": str,
    "varchar": str,
    "bpchar": str,
    "name": _to_name,
    "date": _input_date,
    "time": _input_time,
    "timestamp": _input_timestamp(False),
    "timestamptz": _input_timestamp(True),
    "interval": _input_interval,
    "uuid": _input_uuid,
    "bytea": _input_bytea,
}

# ----------------------------------------------------------------------------------------- casts

_Conv = Callable[[Any], Any]
# (source, target) -> (context: i implicit, a assignment, e explicit; conversion or None for the same value)
_CASTS: Final[dict[tuple[str, str], tuple[str, _Conv | None]]] = {
    ("int2", "int4"): ("i", None),
    ("int2", "int8"): ("i", None),
    ("int4", "int8"): ("i", None),
    ("int4", "int2"): ("a", _int_check("int2")),
    ("int8", "int2"): ("a", _int_check("int2")),
    ("int8", "int4"): ("a", _int_check("int4")),
    ("int2", "numeric"): ("i", Decimal),
    ("int4", "numeric"): ("i", Decimal),
    ("int8", "numeric"): ("i", Decimal),
    ("int2", "float4"): ("i", _to_float4),
    ("int4", "float4"): ("i", _to_float4),
    ("int8", "float4"): ("i", _to_float4),
    ("int2", "float8"): ("i", float),
    ("int4", "float8"): ("i", float),
    ("int8", "float8"): ("i", float),
    ("int2", "oid"): ("i", _int_to_oid),
    ("int4", "oid"): ("i", _int_to_oid),
    ("int8", "oid"): ("i", _int8_to_oid),
    ("oid", "int4"): ("a", _oid_to_int4),
    ("oid", "int8"): ("a", None),
    ("int4", "bool"): ("e", bool),
    ("bool", "int4"): ("e", int),
    ("numeric", "int2"): ("a", _num_to_int("int2")),
    ("numeric", "int4"): ("a", _num_to_int("int4")),
    ("numeric", "int8"): ("a", _num_to_int("int8")),
    ("numeric", "float4"): ("i", _to_float4),
    ("numeric", "float8"): ("i", float),
    ("float4", "int2"): ("a", _float_to_int("int2")),
    ("float4", "int4"): ("a", _float_to_int("int4")),
    ("float4", "int8"): ("a", _float_to_int("int8")),
    ("float8", "int2"): ("a", _float_to_int("int2")),
    ("float8", "int4"): ("a", _float_to_int("int4")),
    ("float8", "int8"): ("a", _float_to_int("int8")),
    ("float4", "numeric"): ("a", _float_to_numeric(6)),
    ("float8", "numeric"): ("a", _float_to_numeric(15)),
    ("float4", "float8"): ("i", None),
    ("float8", "float4"): ("a", _to_float4),
    ("text", "varchar"): ("i", None),
    ("text", "bpchar"): ("i", None),
    ("text", "name"): ("i", _to_name),
    ("varchar", "text"): ("i", None),
    ("varchar", "bpchar"): ("i", None),
    ("varchar", "name"): ("i", _to_name),
    ("bpchar", "text"): ("i", _rtrim_spaces),
    ("bpchar", "varchar"): ("i", _rtrim_spaces),
    ("bpchar", "name"): ("i", lambda s: _to_name(s.rstrip(" "))),
    ("name", "text"): ("i", None),
    ("name", "varchar"): ("a", None),
    ("name", "bpchar"): ("a", None),
    ("bool", "text"): ("a", _bool_to_text),
    ("bool", "varchar"): ("a", _bool_to_text),
    ("bool", "bpchar"): ("a", _bool_to_text),
    ("date", "timestamp"): ("i", _date_to_ts),
    ("timestamp", "date"): ("a", _ts_to_date),
    ("timestamp", "time"): ("a", _ts_to_time),
    ("time", "interval"): ("i", None),  # a time's comparison value as an interval is its µs
}
_TZ_CASTS: Final = frozenset(
    {("date", "timestamptz"), ("timestamp", "timestamptz"), ("timestamptz", "date"), ("timestamptz", "time"),
     ("timestamptz", "timestamp")}
)  # fmt: skip

# ============================================================================================= compiling

Fn = Callable[[Row], Any]


class _E:
    """A compiled expression: its type and either a per-row function or (``fn`` None) a constant value."""

    __slots__ = ("column", "fn", "type", "value")

    def __init__(self, type_: _T, fn: Fn | None = None, value: Any = None, column: str = "") -> None:
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


def _strict(impl: Callable[..., Any], args: Sequence[_E]) -> Fn:
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


def _junction(fns: list[Fn], decisive: bool) -> Fn:
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


def _not(b: bool) -> bool:
    return not b


_CMP: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "=": operator.eq, "<>": operator.ne, "<": operator.lt, ">": operator.gt, "<=": operator.le, ">=": operator.ge,
}  # fmt: skip


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
_COMPARE: Final = {
    "plain": _CMP,
    "nan": {op: _nan_aware(f) for op, f in _CMP.items()},
    "bpchar": {op: _blank_padded(f) for op, f in _CMP.items()},
}


def _like_escape(pattern: str, escape: str) -> str:
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
def _like_matcher(pattern: str) -> Callable[[str], bool]:
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


def _constant_like(matcher: Callable[[str], bool], negate: bool, fold: bool) -> Callable[[str], bool]:
    if fold:
        return lambda s: matcher(_lower(s)) is not negate
    if negate:
        return lambda s: not matcher(s)
    return matcher


def _like(negate: bool, fold: bool) -> Callable[[str, str], bool]:
    def match(s: str, pattern: str) -> bool:
        if fold:
            s, pattern = _lower(s), _lower(pattern)
        return _like_matcher(pattern)(s) is not negate

    return match


class _Compiler:
    """The compile-time walk: PostgreSQL's type resolution, then closures over the row."""

    def __init__(self, text: str, columns: Sequence[ColumnType]) -> None:
        self.text = text
        self.columns = {c.name: (i, c) for i, c in enumerate(columns)}

    def fail(self, reason: str) -> NoReturn:
        raise FilterError(self.text, reason)

    def expr(self, node: Any) -> _E:
        method = _COMPILE.get(type(node))
        if method is None:
            self.fail(f"expression {_show(node)} is not supported in a row filter")
        return method(self, node)

    # ------------------------------------------------------------------------------ leaves

    def column(self, node: ast.ColumnRef) -> _E:
        name = _names(node.fields)[-1]
        found = self.columns.get(name)
        if found is None:
            existing = ", ".join(c.name for _, c in self.columns.values()) or "none"
            self.fail(f'column "{name}" does not exist (the table has columns: {existing})')
        index, column = found
        if column.type_oid >= _FIRST_NORMAL_OID:
            self.fail(f'column "{name}" has a user-defined type (oid {column.type_oid}): row filters allow only'
                      " built-in types")  # fmt: skip
        t = _column_type(column)
        return _E(t, _column_reader(index, name, t), column=name)

    def const(self, node: ast.A_Const) -> _E:
        val = node.val
        if node.isnull or val is None:
            return _E(UNKNOWN)
        if isinstance(val, ast.Integer):
            return _E(INT4, value=val.ival or 0)
        if isinstance(val, ast.Float):
            return self.number(val.fval or "0")
        if isinstance(val, ast.Boolean):
            return _E(BOOL, value=bool(val.boolval))
        if isinstance(val, ast.String):
            return _E(UNKNOWN, value=val.sval or "")
        self.fail(f"constant {_show(node)} is not supported")

    @staticmethod
    def number(text: str) -> _E:
        """A numeric literal: int4 or int8 if it is an integer that fits, else numeric (as PostgreSQL)."""
        if text.lstrip("-").isdigit():
            v = int(text)
            if -(2**31) <= v < 2**31:
                return _E(INT4, value=v)
            if -(2**63) <= v < 2**63:
                return _E(INT8, value=v)
        return _E(NUMERIC, value=_dec(Decimal(text)))

    # ------------------------------------------------------------------------------ coercion

    def fold(self, t: _T, fn: Fn, args: Sequence[_E]) -> _E:
        """``fn`` as an expression of type ``t``, computed now when all its arguments are constants."""
        if any(a.fn is not None for a in args):
            return _E(t, fn)
        try:
            return _E(t, value=fn(()))
        except Unevaluable as exc:
            self.fail(f"a constant part of the expression fails: {exc.reason}")

    def apply(self, t: _T, impl: Callable[..., Any], args: Sequence[_E]) -> _E:
        if any(a.fn is None and a.value is None for a in args):
            return _E(t)  # a strict function of a NULL constant is NULL, not evaluated (PostgreSQL folds it)
        return self.fold(t, _strict(impl, args), args)

    def coerce(self, e: _E, t: _T, *, explicit: bool = False, context: str = "") -> _E:
        """``e`` converted to ``t``: an unknown literal is read as ``t``; else PostgreSQL's cast, which must be
        implicit unless ``explicit``."""
        if e.type == t:
            return e
        if e.type.name == "unknown":
            return self.literal(e.value, t)
        self.usable(e)
        convert = self.conversion(e.type, t, explicit, context)
        if convert is None:
            return _E(t, e.fn, e.value)
        return self.apply(t, convert, [e])

    def literal(self, value: str | None, t: _T) -> _E:
        if value is None:
            return _E(t)
        parse = _INPUT.get(t.name)
        if parse is None:
            self.fail(f"cannot read the literal '{value}' as type {t}")
        try:
            v = parse(value)
            modifier = self.typmod(t)
            return _E(t, value=v if modifier is None else modifier(v))
        except (_BadInput, Unevaluable) as exc:
            self.fail(str(exc))

    @staticmethod
    def typmod(t: _T) -> _Conv | None:
        if not t.mod:
            return None
        if t.name == "numeric":
            return _numeric_typmod(*t.mod)
        if t.name == "bpchar":
            return _bpchar_length(t.mod[0])
        if t.name == "varchar":
            return _varchar_length(t.mod[0])
        return None

    def conversion(self, src: _T, dst: _T, explicit: bool, context: str) -> _Conv | None:
        if src.name == "other":
            self.fail(f"type {src}, which a cdcd row filter can only test with IS [NOT] NULL, cannot be cast")
        modifier = self.typmod(dst)
        if src.name == dst.name:
            return modifier
        pair = (src.name, dst.name)
        where = f" ({context})" if context else ""
        if pair in _TZ_CASTS:
            self.fail(f"cast from {src} to {dst} is not immutable (it depends on the TimeZone setting){where}")
        found = _CASTS.get(pair)
        if found is None:
            if (src.name in _STRINGS) != (dst.name in _STRINGS) and "other" not in pair and "unknown" not in pair:
                self.fail(
                    f"cast from {src} to {dst} is not allowed in a row filter: PostgreSQL refuses conversions"
                    f" through text (only a literal can be read as another type){where}"
                )
            self.fail(f"cannot cast type {src} to {dst}{where}")
        cast_context, convert = found
        if cast_context != "i" and not explicit:
            self.fail(f"type {src} cannot be converted to {dst} implicitly{where}")
        if convert is None:
            return modifier
        if modifier is None:
            return convert
        return lambda v: modifier(convert(v))

    def usable(self, *args: _E) -> None:
        """Values of unsupported types may only be tested for NULL."""
        for e in args:
            if e.type.name == "other":
                what = f'column "{e.column}" has type {e.type}' if e.column else f"type {e.type}"
                self.fail(f"{what}, which a cdcd row filter can only test with IS [NOT] NULL")

    def boolean(self, e: _E, context: str) -> _E:
        if e.type.name == "unknown":
            return self.literal(e.value, BOOL)
        if e.type.name != "bool":
            self.fail(f"argument of {context} must be type boolean, not type {e.type}")
        return e

    def text_arg(self, e: _E, signature: str) -> _E:
        self.usable(e)
        if e.type.name == "unknown" or e.type.name in _STRINGS:
            return self.coerce(e, TEXT)
        self.fail(f"function {signature} does not exist")

    def int4_arg(self, e: _E, signature: str) -> _E:
        self.usable(e)
        if e.type.name in ("unknown", "int2", "int4"):
            return self.coerce(e, INT4)
        self.fail(f"function {signature} does not exist")

    # ------------------------------------------------------------------------------ casts and collations

    def cast(self, node: ast.TypeCast) -> _E:
        assert node.typeName is not None
        t = _cast_type(node.typeName, self.fail)
        return self.coerce(self.expr(node.arg), t, explicit=True, context=_show(node))

    def collate(self, node: ast.CollateClause) -> _E:
        e = self.expr(node.arg)
        self.usable(e)
        if e.type.name == "unknown":
            e = self.coerce(e, TEXT)
        if e.type.name not in _STRINGS:
            self.fail(f"collations are not supported by type {e.type} ({_show(node)})")
        return e

    # ------------------------------------------------------------------------------ comparisons

    def comparable(self, left: _E, right: _E, op: str) -> tuple[_E, _E, str]:
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
        if lt in _NUMBERS and rt in _NUMBERS:
            return self.numbers_comparable(left, right)
        if "oid" in (lt, rt):
            return self.oids_comparable(left, right, shown)
        if lt in _STRINGS and rt in _STRINGS:
            return self.strings_comparable(left, right)
        pair = {lt, rt}
        if pair == {"date", "timestamp"}:
            return self.coerce(left, _T("timestamp")), self.coerce(right, _T("timestamp")), "plain"
        if pair == {"time", "interval"}:
            return self.coerce(left, _T("interval")), self.coerce(right, _T("interval")), "plain"
        if "timestamptz" in pair and pair & {"date", "timestamp"}:
            self.fail(f"operator {shown} is not immutable (it depends on the TimeZone setting)")
        if lt == rt and lt not in ("other",):
            return left, right, "plain"
        self.fail(f"operator does not exist: {shown}")

    def numbers_comparable(self, left: _E, right: _E) -> tuple[_E, _E, str]:
        lt, rt = left.type.name, right.type.name
        if lt in _INTS and rt in _INTS:
            return left, right, "plain"
        if lt in _FLOATS or rt in _FLOATS:  # float48 operators: a real operand stays real
            left = left if lt in _FLOATS else self.coerce(left, FLOAT8)
            return left, right if rt in _FLOATS else self.coerce(right, FLOAT8), "nan"
        return self.coerce(left, NUMERIC), self.coerce(right, NUMERIC), "nan"

    def oids_comparable(self, left: _E, right: _E, shown: str) -> tuple[_E, _E, str]:
        oid = _T("oid")
        if {left.type.name, right.type.name} <= {"oid", "int2", "int4", "int8"}:
            return self.coerce(left, oid), self.coerce(right, oid), "plain"
        self.fail(f"operator does not exist: {shown}")

    def strings_comparable(self, left: _E, right: _E) -> tuple[_E, _E, str]:
        types = {left.type.name, right.type.name}
        if "bpchar" in types and types <= {"bpchar", "varchar"}:
            bpchar = _T("bpchar")
            return self.coerce(left, bpchar), self.coerce(right, bpchar), "bpchar"
        if types == {"name"}:
            return left, right, "plain"
        if "name" in types:  # name vs text: PostgreSQL's cross-type operators, values compared as strings
            return self.to_text_unless_name(left), self.to_text_unless_name(right), "plain"
        return self.coerce(left, TEXT), self.coerce(right, TEXT), "plain"

    def to_text_unless_name(self, e: _E) -> _E:
        return e if e.type.name == "name" else self.coerce(e, TEXT)

    def compare(self, op: str, left: _E, right: _E) -> _E:
        left, right, kind = self.comparable(left, right, op)
        return self.apply(BOOL, _COMPARE[kind][op], [left, right])

    def compare_nodes(self, op: str, left: Any, right: Any) -> _E:
        return self.compare(op, self.expr(left), self.expr(right))

    # ------------------------------------------------------------------------------ A_Expr

    def a_expr(self, node: ast.A_Expr) -> _E:
        kinds = enums.A_Expr_Kind
        kind = node.kind
        if kind == kinds.AEXPR_OP:
            return self.operator(node)
        if kind == kinds.AEXPR_IN:
            return self.in_list(node)
        if kind in (kinds.AEXPR_LIKE, kinds.AEXPR_ILIKE):
            return self.like(node)
        if kind in _BETWEENS:
            return self.between(node)
        if kind in (kinds.AEXPR_DISTINCT, kinds.AEXPR_NOT_DISTINCT):
            return self.distinct(node, kind == kinds.AEXPR_NOT_DISTINCT)
        if kind == kinds.AEXPR_NULLIF:
            return self.nullif(node)
        self.fail(f"expression {_show(node)} is not supported in a row filter")

    def operator(self, node: ast.A_Expr) -> _E:
        op = _operator_name(node)
        assert op is not None
        if node.lexpr is None:
            return self.unary(op, self.expr(node.rexpr), node)
        if op in _COMPARISONS:
            return self.compare_nodes(op, node.lexpr, node.rexpr)
        if op in _LIKES:
            return self.like(node)
        left, right = self.expr(node.lexpr), self.expr(node.rexpr)
        if op == "||":
            return self.concat(left, right)
        return self.arithmetic(op, left, right)

    def unary(self, op: str, e: _E, node: ast.A_Expr) -> _E:
        self.usable(e)
        if e.type.name == "unknown":
            self.fail(f"operator is not unique: {op} unknown ({_show(node)})")
        name = e.type.name
        if op not in ("-", "+") or name not in _NUMBERS:
            self.fail(f"operator does not exist: {op} {e.type} ({_show(node)})")
        if op == "+":
            return e
        impl: Callable[[Any], Any]
        if name in _INTS:
            check = _int_check(name)
            impl = lambda v: check(-v)  # noqa: E731
        elif name == "numeric":
            impl = _NCTX.minus
        else:
            impl = operator.neg
        return self.apply(e.type.bare, impl, [e])

    def arithmetic(self, op: str, left: _E, right: _E) -> _E:
        self.usable(left, right)
        lt, rt = left.type.name, right.type.name
        if lt == "unknown" and rt == "unknown":
            self.fail(f"operator is not unique: unknown {op} unknown")
        if lt == "unknown":
            left, lt = self.coerce(left, right.type.bare), rt
        elif rt == "unknown":
            right, rt = self.coerce(right, left.type.bare), lt
        if lt not in _NUMBERS or rt not in _NUMBERS:
            self.fail(f"operator {left.type} {op} {right.type} is not supported (operator does not exist or cdcd"
                      " does not evaluate it)")  # fmt: skip
        if lt in _INTS and rt in _INTS:
            t = _T(max(lt, rt, key=_RANK.__getitem__))
            int_op = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": _int_div, "%": _int_mod}[op]
            return self.apply(t, _checked_int_op(int_op, t.name), [self.coerce(left, t), self.coerce(right, t)])
        if lt in _FLOATS or rt in _FLOATS:
            if op == "%":
                self.fail(f"operator does not exist: {left.type} % {right.type}")
            t = _T("float4") if lt == rt == "float4" else FLOAT8
            return self.apply(t, _f8_op(op, t.name == "float4"), [self.coerce(left, t), self.coerce(right, t)])
        num_op = {"+": _NCTX.add, "-": _NCTX.subtract, "*": _NCTX.multiply, "/": _num_div, "%": _num_mod}[op]
        return self.apply(NUMERIC, num_op, [self.coerce(left, NUMERIC), self.coerce(right, NUMERIC)])

    def concat(self, left: _E, right: _E) -> _E:
        self.usable(left, right)
        for e in (left, right):
            if e.type.name != "unknown" and e.type.name not in _STRINGS:
                self.fail(f"operator || with an operand of type {e.type} is not immutable (PostgreSQL converts"
                          " it with a stable output function)")  # fmt: skip
        return self.apply(TEXT, operator.add, [self.coerce(left, TEXT), self.coerce(right, TEXT)])

    def like(self, node: ast.A_Expr) -> _E:
        op = _operator_name(node)
        assert op in _LIKES
        negate, fold = _LIKES[op]
        subject = self.expr(node.lexpr)
        self.usable(subject)
        if subject.type.name == "unknown":
            subject = self.coerce(subject, TEXT)
        if subject.type.name not in _STRINGS:
            self.fail(f"operator does not exist: {subject.type} {op} text ({_show(node)})")
        pattern = self.like_pattern(node.rexpr)
        if subject.type.name == "varchar":
            subject = self.coerce(subject, TEXT)
        if pattern.fn is None and pattern.value is not None:
            try:
                matcher = _like_matcher(_lower(pattern.value) if fold else pattern.value)
            except Unevaluable as exc:
                self.fail(f"{exc.reason} ({_show(node)})")
            return self.apply(BOOL, _constant_like(matcher, negate, fold), [subject])
        return self.apply(BOOL, _like(negate, fold), [subject, pattern])

    def like_pattern(self, node: Any) -> _E:
        if _is_like_escape(node):
            pattern, escape = (self.text_arg(self.expr(a), "like_escape(text, text)") for a in node.args)
            return self.apply(TEXT, _like_escape, [pattern, escape])
        return self.text_arg(self.expr(node), "like(text, text)")

    def between(self, node: ast.A_Expr) -> _E:
        kinds = enums.A_Expr_Kind
        kind = node.kind
        low, high = _as_tuple(node.rexpr)
        negated = kind in (kinds.AEXPR_NOT_BETWEEN, kinds.AEXPR_NOT_BETWEEN_SYM)
        forward = self.range_test(node.lexpr, low, high, negated)
        if kind in (kinds.AEXPR_BETWEEN, kinds.AEXPR_NOT_BETWEEN):
            return forward
        backward = self.range_test(node.lexpr, high, low, negated)
        return self.combine([forward, backward], and_=negated)

    def range_test(self, subject: Any, low: Any, high: Any, negated: bool) -> _E:
        if negated:
            return self.combine([self.compare_nodes("<", subject, low), self.compare_nodes(">", subject, high)])
        return self.combine(
            [self.compare_nodes(">=", subject, low), self.compare_nodes("<=", subject, high)], and_=True
        )

    def distinct(self, node: ast.A_Expr, not_distinct: bool) -> _E:
        left, right = self.expr(node.lexpr), self.expr(node.rexpr)
        for e, other in ((left, right), (right, left)):
            if e.type.name == "unknown" and e.value is None:  # x IS [NOT] DISTINCT FROM NULL is a null test
                return self.null_check(other, is_null=not_distinct)
        left, right, kind = self.comparable(left, right, "=")
        eq = _COMPARE[kind]["="]
        f, g = left.run, right.run

        def apply(row: Row) -> bool:
            a = f(row)
            b = g(row)
            if a is None or b is None:
                return (a is None and b is None) is not_distinct
            return bool(eq(a, b)) is not_distinct

        return self.fold(BOOL, apply, [left, right])

    def nullif(self, node: ast.A_Expr) -> _E:
        left, right, kind = self.comparable(self.expr(node.lexpr), self.expr(node.rexpr), "=")
        eq = _COMPARE[kind]["="]
        f, g = left.run, right.run

        def apply(row: Row) -> Any:
            a = f(row)
            b = g(row)
            return None if a is not None and b is not None and eq(a, b) else a

        return self.fold(left.type, apply, [left, right])

    # ------------------------------------------------------------------------------ IN

    def in_list(self, node: ast.A_Expr) -> _E:
        """PostgreSQL's transformAExprIn: the items without column references compared as one array of their
        common type with the subject (when they have one), the others one by one; ORed (ANDed for NOT IN)."""
        negated = _operator_name(node) == "<>"
        op = "<>" if negated else "="
        subject = self.expr(node.lexpr)
        items = _as_tuple(node.rexpr)
        constants = [self.expr(i) for i in items if not _references_columns(i)]
        others = [self.expr(i) for i in items if _references_columns(i)]
        parts: list[_E] = []
        if len(constants) > 1:
            common = self.common_type([subject, *constants], "IN", strict=False)
            if common is not None and common.name == "varchar":
                self.fail(
                    "IN with character varying values is not allowed: PostgreSQL would convert the list to text[] in"
                    f" a way row filters refuse; compare as text: {_show(node.lexpr)}::text IN (...)"
                )
            if common is not None:
                parts.append(self.any_of(subject, [self.coerce(c, common) for c in constants], negated))
                constants = []
        parts += [self.compare(op, subject, i) for i in (*constants, *others)]
        return parts[0] if len(parts) == 1 else self.combine(parts, and_=negated)

    def any_of(self, subject: _E, items: list[_E], negated: bool) -> _E:
        """``subject = ANY (items)`` (``<> ALL`` when negated) with PostgreSQL's NULL rules."""
        op = "<>" if negated else "="
        left, _, kind = self.comparable(subject, items[0], op)
        items = [self.comparable(subject, i, op)[1] for i in items]
        if all(i.fn is None for i in items) and kind != "nan" and left.fn is not None:
            return _E(BOOL, _member(left.fn, [i.value for i in items], kind == "bpchar", negated))
        eq = _COMPARE[kind]["="]
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

    def bool_expr(self, node: ast.BoolExpr) -> _E:
        op = node.boolop
        assert op is not None
        context = {enums.BoolExprType.AND_EXPR: "AND", enums.BoolExprType.OR_EXPR: "OR"}.get(op, "NOT")
        args = [self.boolean(self.expr(a), context) for a in node.args or ()]
        if op == enums.BoolExprType.NOT_EXPR:
            return self.apply(BOOL, _not, args)
        return self.combine(args, and_=op == enums.BoolExprType.AND_EXPR)

    def combine(self, args: list[_E], and_: bool = False) -> _E:
        """AND / OR with PostgreSQL's constant folding: a constant that decides the result decides it."""
        decisive = not and_
        if any(a.fn is None and a.value is decisive for a in args):
            return _E(BOOL, value=decisive)
        rest = [a for a in args if not (a.fn is None and a.value is (not decisive))]
        if not rest:
            return _E(BOOL, value=not decisive)
        if len(rest) == 1 and rest[0].fn is not None:
            return rest[0]
        fns = [a.run for a in rest]
        return self.fold(BOOL, _junction(fns, decisive), rest)

    def null_test(self, node: ast.NullTest) -> _E:
        return self.null_check(self.expr(node.arg), node.nulltesttype == enums.NullTestType.IS_NULL)

    def null_check(self, e: _E, is_null: bool) -> _E:
        if e.column:  # a column as such: no need to read (or have) its value
            return _E(BOOL, _null_check_column(self.columns[e.column][0], is_null))
        f = e.run

        def apply(row: Row) -> bool:
            return (f(row) is None) is is_null

        return self.fold(BOOL, apply, [e])

    def boolean_test(self, node: ast.BooleanTest) -> _E:
        kinds = enums.BoolTestType
        assert node.booltesttype is not None
        e = self.boolean(self.expr(node.arg), "IS TRUE / FALSE / UNKNOWN")
        expected: bool | None = {
            kinds.IS_TRUE: True, kinds.IS_NOT_TRUE: True, kinds.IS_FALSE: False, kinds.IS_NOT_FALSE: False,
            kinds.IS_UNKNOWN: None, kinds.IS_NOT_UNKNOWN: None,
        }[node.booltesttype]  # fmt: skip
        negated = node.booltesttype in (kinds.IS_NOT_TRUE, kinds.IS_NOT_FALSE, kinds.IS_NOT_UNKNOWN)
        f = e.run

        def apply(row: Row) -> bool:
            return (f(row) is expected) is not negated

        return self.fold(BOOL, apply, [e])

    # ------------------------------------------------------------------------------ conditional expressions

    def common_type(self, args: list[_E], context: str, strict: bool = True) -> _T | None:
        """PostgreSQL's select_common_type over the supported types (None when there is none and not strict)."""
        self.usable(*args)
        known = [a.type for a in args if a.type.name != "unknown"]
        if not known:
            return TEXT
        chosen = known[0].bare
        for t in known[1:]:
            if t.name == chosen.name:
                continue
            if _category(t) != _category(chosen):
                if not strict:
                    return None
                self.fail(f"{context} types {chosen} and {t} cannot be matched")
            if chosen.name not in _PREFERRED and _implicit(chosen.name, t.name) and not _implicit(t.name, chosen.name):
                chosen = t.bare  # a type the others convert to, unless the current one is the category's preferred
        if not strict and not all(_implicit(t.name, chosen.name) for t in known):
            return None
        return chosen

    def coalesce(self, node: ast.CoalesceExpr) -> _E:
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

    def minmax(self, node: ast.MinMaxExpr) -> _E:
        greatest = node.op == enums.MinMaxOp.IS_GREATEST
        args = [self.expr(a) for a in node.args or ()]
        name = "GREATEST" if greatest else "LEAST"
        t = self.common_type(args, name)
        assert t is not None
        args = [self.coerce(a, t) for a in args]
        kind = self.comparable(args[0], args[0], ">")[2]
        better = _COMPARE[kind][">" if greatest else "<"]
        fns = [a.run for a in args]

        def apply(row: Row) -> Any:
            best = None
            for f in fns:
                v = f(row)
                if v is not None and (best is None or better(v, best)):
                    best = v
            return best

        return self.fold(t, apply, args)

    def case(self, node: ast.CaseExpr) -> _E:
        whens: list[ast.CaseWhen] = list(node.args or ())
        if node.arg is not None:
            conditions = [self.compare_nodes("=", node.arg, w.expr) for w in whens]
        else:
            conditions = [self.boolean(self.expr(w.expr), "CASE/WHEN") for w in whens]
        results = [self.expr(w.result) for w in whens]
        default = self.expr(node.defresult) if node.defresult is not None else _E(UNKNOWN)
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

    def func(self, node: ast.FuncCall) -> _E:
        name = _func_name(node)[1]
        args = [self.expr(a) for a in node.args or ()]
        signature = f"{name}({', '.join(str(a.type) for a in args)})"
        return _FUNCTION_COMPILERS[name](self, name, args, signature)

    def f_case(self, name: str, args: list[_E], signature: str) -> _E:
        arg = self.text_arg(args[0], signature)
        if arg.fn is None and arg.value is not None and not arg.value.isascii():
            self.fail(f"{name}() of the non-ASCII constant '{arg.value}' depends on the database's default collation:"
                      " write the result instead")  # fmt: skip
        return self.apply(TEXT, _lower if name == "lower" else _upper, [arg])

    def f_length(self, name: str, args: list[_E], signature: str) -> _E:
        (arg,) = args
        self.usable(arg)
        if arg.type.name == "bpchar":
            return self.apply(INT4, lambda s: len(s.rstrip(" ")), [arg])
        if arg.type.name == "bytea" and name == "length":
            return self.apply(INT4, len, [arg])
        return self.apply(INT4, len, [self.text_arg(arg, signature)])

    def numeric_args(self, args: list[_E], signature: str, allowed: Iterable[str]) -> list[_E]:
        """The arguments converted to the one type PostgreSQL's function resolution picks among ``allowed``."""
        self.usable(*args)
        allowed = tuple(allowed)
        known = {a.type.name for a in args if a.type.name != "unknown"}
        if known - _NUMBERS:
            self.fail(f"function {signature} does not exist")
        if len(known) == 1 and next(iter(known)) in allowed:  # an exact match
            candidates = list(known)
        elif known:  # else the first one all arguments convert to implicitly, as PostgreSQL prefers
            candidates = [t for t in allowed if all(_RANK[k] <= _RANK[t] for k in known)]
        else:  # only literals: the only candidate, or the preferred type of the category
            candidates = list(allowed) if len(allowed) == 1 else [t for t in allowed if t == "float8"]
            if not candidates:
                self.fail(f"function {signature} is not unique: add explicit type casts")
        if not candidates:
            self.fail(f"function {signature} does not exist")
        t = _T(candidates[0])
        return [self.coerce(a, t) for a in args]

    def f_abs(self, name: str, args: list[_E], signature: str) -> _E:
        (arg,) = self.numeric_args(args, signature, ("int2", "int4", "int8", "numeric", "float4", "float8"))
        t = arg.type.name
        impl: Callable[[Any], Any] = abs
        if t in _INTS:
            check = _int_check(t)
            impl = lambda v: check(abs(v))  # noqa: E731
        elif t == "numeric":
            impl = _NCTX.abs
        return self.apply(arg.type.bare, impl, [arg])

    def f_mod(self, name: str, args: list[_E], signature: str) -> _E:
        args = self.numeric_args(args, signature, ("int2", "int4", "int8", "numeric"))
        t = args[0].type
        impl = _num_mod if t.name == "numeric" else _int_mod
        return self.apply(t.bare, impl, args)

    def f_rounding(self, name: str, args: list[_E], signature: str) -> _E:
        mode = {"round": ROUND_HALF_UP, "trunc": ROUND_DOWN, "floor": ROUND_FLOOR}.get(name, ROUND_CEILING)
        if len(args) == 2:
            value = self.numeric_args(args[:1], signature, ("numeric",))[0]
            places = self.int4_arg(args[1], signature)
            return self.apply(NUMERIC, lambda d, n: _num_round(d, n, mode), [value, places])
        (value,) = self.numeric_args(args, signature, ("float8", "numeric"))
        if value.type.name == "numeric":
            return self.apply(NUMERIC, lambda d: _num_round(d, 0, mode), [value])
        float_fn: Callable[[float], int] = _FLOAT_ROUNDING[name]
        return self.apply(FLOAT8, lambda x: float(float_fn(x)) if math.isfinite(x) else x, [value])

    def f_substr(self, name: str, args: list[_E], signature: str) -> _E:
        text = self.text_arg(args[0], signature)
        numbers = [self.int4_arg(a, signature) for a in args[1:]]
        return self.apply(TEXT, _substr, [text, *numbers])

    def f_trim(self, name: str, args: list[_E], signature: str) -> _E:
        texts = [self.text_arg(a, signature) for a in args]
        method = {"btrim": str.strip, "ltrim": str.lstrip, "rtrim": str.rstrip}[name]
        if len(texts) == 1:
            return self.apply(TEXT, lambda s: method(s, " "), texts)
        return self.apply(TEXT, method, texts)

    def f_left_right(self, name: str, args: list[_E], signature: str) -> _E:
        text, count = self.text_arg(args[0], signature), self.int4_arg(args[1], signature)
        impl: Callable[[str, int], str] = (lambda s, n: s[:n]) if name == "left" else _right
        return self.apply(TEXT, impl, [text, count])

    def f_text_functions(self, name: str, args: list[_E], signature: str) -> _E:
        texts = [self.text_arg(a, signature) for a in args]
        if name == "starts_with":
            return self.apply(BOOL, str.startswith, texts)
        if name == "replace":
            return self.apply(TEXT, _replace, texts)
        return self.apply(INT4, _strpos, texts)  # strpos(s, sub), and position(sub IN s) as parsed: (s, sub)


_PREFERRED: Final = frozenset({"text", "float8", "oid", "timestamptz", "interval", "bool"})


def _implicit(source: str, target: str) -> bool:
    """Whether PostgreSQL has an implicit cast (the timestamptz ones are not immutable: refused when used)."""
    if source == target or (target == "timestamptz" and source in ("date", "timestamp")):
        return True
    return _CASTS.get((source, target), ("",))[0] == "i"


_FLOAT_ROUNDING: Final[dict[str, Callable[[float], int]]] = {
    "round": round,  # half to even, as rint()
    "trunc": math.trunc,
    "floor": math.floor,
    "ceil": math.ceil,
    "ceiling": math.ceil,
}


def _category(t: _T) -> str:
    if t.name in _NUMBERS or t.name == "oid":
        return "numeric"
    if t.name in _STRINGS:
        return "string"
    if t.name in ("date", "timestamp", "timestamptz", "time"):
        return "datetime"
    return t.name


def _references_columns(node: Any) -> bool:
    if isinstance(node, ast.ColumnRef):
        return True
    if isinstance(node, ast.Node):
        return any(_references_columns(getattr(node, a)) for a in node)
    if isinstance(node, tuple):
        return any(_references_columns(n) for n in node)
    return False


def _member(f: Fn, values: list[Any], blank_padded: bool, negated: bool) -> Fn:
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


def _null_check_column(index: int, is_null: bool) -> Fn:
    """IS [NOT] NULL of a column reads no value: an unchanged TOAST value is not NULL."""

    def apply(row: Row) -> bool:
        return (row[index] is None) is is_null

    return apply


_COMPILE: Final[dict[type[ast.Node], Callable[[_Compiler, Any], _E]]] = {
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
_FunctionCompiler = Callable[[_Compiler, str, list[_E], str], _E]
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

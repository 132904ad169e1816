"""Parsing and the checks that need no column types: the filter parsed by pglast (PostgreSQL's own parser) as
the WHERE clause of a fixed query, so that it can only be one expression (parentheses balanced, no ';'), then
walked by ``_Checker`` against PostgreSQL's row-filter restrictions and cdcd's lists of supported node kinds,
operators, functions, types and collations. Also the helpers for pglast nodes that the compiler shares."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from typing import Any, Final, NoReturn

from pglast import ast, enums, parse_sql
from pglast.parser import ParseError, scan
from pglast.stream import RawStream

from cdcd.filters.expr.errors import FilterError
from cdcd.filters.expr.types import TYPE_OIDS, ParsedFilter, T


def parse_filter(text: str) -> ParsedFilter:
    """Check ``text`` (syntax and the restrictions that need no column types). Raises FilterError."""
    return parse(text)[0]


_WRAP: Final = "SELECT 1 FROM t WHERE ("
_SYSTEM_COLUMNS: Final = frozenset({"ctid", "xmin", "xmax", "cmin", "cmax", "tableoid"})
_C_COLLATIONS: Final = frozenset({"C", "POSIX", "ucs_basic"})
COMPARISONS: Final = frozenset({"=", "<>", "<", ">", "<=", ">="})
_ORDERINGS: Final = frozenset({"<", ">", "<=", ">="})
BETWEENS: Final = frozenset(
    {
        enums.A_Expr_Kind.AEXPR_BETWEEN,
        enums.A_Expr_Kind.AEXPR_NOT_BETWEEN,
        enums.A_Expr_Kind.AEXPR_BETWEEN_SYM,
        enums.A_Expr_Kind.AEXPR_NOT_BETWEEN_SYM,
    }
)
_OPERATORS: Final = COMPARISONS | {"+", "-", "*", "/", "%", "||", "~~", "~~*", "!~~", "!~~*"}

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
        "now",
        "statement_timestamp",
        "transaction_timestamp",
        "clock_timestamp",
        "timeofday",
        "random",
        "random_normal",
        "setseed",
        "nextval",
        "currval",
        "lastval",
        "setval",
        "txid_current",
        "txid_current_if_assigned",
        "txid_current_snapshot",
        "pg_current_xact_id",
        "pg_current_xact_id_if_assigned",
        "pg_current_snapshot",
        "to_char",
        "to_date",
        "concat",
        "concat_ws",
        "format",
        "current_setting",
        "set_config",
        "pg_backend_pid",
        "inet_client_addr",
        "inet_client_port",
        "inet_server_addr",
        "inet_server_port",
        "version",
        "gen_random_uuid",
        "pg_sleep",
        "current_database",
        "current_schema",
        "current_schemas",
        "current_user",
        "session_user",
        "current_role",
        "pg_postmaster_start_time",
        "pg_conf_load_time",
        "localtime",
        "localtimestamp",
        "current_date",
        "current_time",
        "current_timestamp",
        "pg_export_snapshot",
        "timezone",
    }
)
_AGGREGATES: Final = frozenset(
    {
        "count",
        "sum",
        "avg",
        "min",
        "max",
        "array_agg",
        "string_agg",
        "bool_and",
        "bool_or",
        "every",
        "bit_and",
        "bit_or",
        "bit_xor",
        "json_agg",
        "jsonb_agg",
        "json_object_agg",
        "jsonb_object_agg",
        "xmlagg",
        "stddev",
        "stddev_pop",
        "stddev_samp",
        "variance",
        "var_pop",
        "var_samp",
        "corr",
        "covar_pop",
        "covar_samp",
        "regr_avgx",
        "regr_avgy",
        "regr_count",
        "regr_intercept",
        "regr_r2",
        "regr_slope",
        "regr_sxx",
        "regr_sxy",
        "regr_syy",
        "percentile_cont",
        "percentile_disc",
        "mode",
        "range_agg",
        "range_intersect_agg",
        "any_value",
        "rank",
        "dense_rank",
        "percent_rank",
        "cume_dist",
        "row_number",
        "ntile",
        "lag",
        "lead",
        "first_value",
        "last_value",
        "nth_value",
    }
)
_NODE_NAMES: Final[dict[type[ast.Node], str]] = {
    ast.A_ArrayExpr: "array constructors are",
    ast.A_Indirection: "subscripts and field selections are",
    ast.RowExpr: "row constructors are",
    ast.GroupingFunc: "GROUPING() is",
    ast.XmlExpr: "XML expressions are",
    ast.NamedArgExpr: "named function arguments are",
}


@functools.lru_cache(maxsize=256)
def parse(text: str) -> tuple[ParsedFilter, ast.Node]:
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
        stmt.distinctClause,
        stmt.intoClause,
        stmt.groupClause,
        stmt.havingClause,
        stmt.windowClause,
        stmt.valuesLists,
        stmt.sortClause,
        stmt.limitOffset,
        stmt.limitCount,
        stmt.lockingClause,
        stmt.withClause,
        stmt.larg,
        stmt.rarg,
    )
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


# ----------------------------------------------------------------------------------------- pglast nodes


def name_parts(nodes: tuple[Any, ...] | None) -> tuple[str, ...]:
    return tuple((n.sval or "") if isinstance(n, ast.String) else "*" for n in nodes or ())


def func_name(node: ast.FuncCall) -> tuple[str | None, str]:
    """(schema or None, name) of a function call."""
    names = name_parts(node.funcname)
    return (names[0] if len(names) > 1 else None), names[-1]


def operator_name(node: ast.A_Expr) -> str | None:
    """The operator of ``node``, without a pg_catalog qualification; None when qualified otherwise."""
    names = name_parts(node.name)
    if len(names) == 2 and names[0] == "pg_catalog":
        return names[1]
    return names[0] if len(names) == 1 else None


def show(node: ast.Node | None) -> str:
    if node is None:
        return ""
    try:
        return str(RawStream()(node))
    except Exception:  # a node pglast cannot print on its own: name its kind
        return type(node).__name__


def as_tuple(node: ast.Node | tuple[Any, ...] | None) -> tuple[Any, ...]:
    if node is None:
        return ()
    return node if isinstance(node, tuple) else (node,)


def is_like_escape(node: object) -> bool:
    return isinstance(node, ast.FuncCall) and func_name(node) == ("pg_catalog", "like_escape")


# ----------------------------------------------------------------------------------------- checks


def _text_flow(node: ast.Node | None) -> tuple[frozenset[str], bool]:
    """(columns whose collation flows into ``node``'s value, whether an explicit COLLATE decides it)."""
    if isinstance(node, ast.ColumnRef):
        return frozenset(name_parts(node.fields)[-1:]), False
    if isinstance(node, ast.CollateClause):
        return frozenset(), True
    parts: Iterable[ast.Node | None] = ()
    if isinstance(node, ast.TypeCast):
        parts = (node.arg,)
    elif isinstance(node, ast.FuncCall) and func_name(node)[1] in _TEXT_RESULT:
        parts = node.args or ()
    elif isinstance(node, ast.A_Expr) and (node.kind == enums.A_Expr_Kind.AEXPR_NULLIF or operator_name(node) == "||"):
        parts = (node.lexpr, *as_tuple(node.rexpr))
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
            what = _NODE_NAMES.get(type(node)) or f"expression {show(node)} is"
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
        names = name_parts(node.fields)
        if "*" in names:
            self.fail(f"{show(node)} is not allowed: name the columns")
        if len(names) > 1:
            self.fail(f"qualified column reference {show(node)} is not allowed: write the column name alone")
        if names[0] in _SYSTEM_COLUMNS:
            self.fail(f"system column {names[0]} is not allowed in a row filter")
        self.columns.add(names[0])

    def const(self, node: ast.A_Const) -> None:
        if isinstance(node.val, ast.BitString):
            self.fail(f"bit-string constant {show(node)} is not supported")

    def cast(self, node: ast.TypeCast) -> None:
        assert node.typeName is not None
        cast_type(node.typeName, self.fail)
        self.visit(node.arg)

    def a_expr(self, node: ast.A_Expr) -> None:
        kind = node.kind
        name = operator_name(node)
        if kind in _UNSUPPORTED_KINDS:
            self.fail(f"{_UNSUPPORTED_KINDS[kind]} is not supported ({show(node)})")
        if kind == enums.A_Expr_Kind.AEXPR_OP and name not in _OPERATORS:
            self.fail(f"operator {'.'.join(name_parts(node.name))} is not supported ({show(node)})")
        if name in _ORDERINGS or kind in BETWEENS:
            self.collation_sensitive((node.lexpr, *as_tuple(node.rexpr)))
        if name in ("~~*", "!~~*"):
            self.collation_sensitive((node.lexpr, *as_tuple(node.rexpr)))
        self.visit(node.lexpr)
        if kind in (enums.A_Expr_Kind.AEXPR_LIKE, enums.A_Expr_Kind.AEXPR_ILIKE) and is_like_escape(node.rexpr):
            assert isinstance(node.rexpr, ast.FuncCall)
            self.visit_all(node.rexpr.args)
            return
        self.visit_all(as_tuple(node.rexpr))

    def bool_expr(self, node: ast.BoolExpr) -> None:
        self.visit_all(node.args)

    def test(self, node: ast.NullTest | ast.BooleanTest) -> None:
        self.visit(node.arg)

    def func(self, node: ast.FuncCall) -> None:
        schema, name = func_name(node)
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
            self.fail(
                f"function {show(node)} is not supported: {name}() takes {' or '.join(map(str, arities))} argument(s)"
            )
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
        names = name_parts(node.collname)
        self.collations.add(names[-1])
        if len(self.collations) > 1:
            self.fail(f"explicit collations {' and '.join(sorted(self.collations))} are mixed: use one of them")
        if names[-1] not in _C_COLLATIONS or len(names) > 2 or (len(names) == 2 and names[0] != "pg_catalog"):
            self.fail(
                f"collation {'.'.join(names)} is not supported: cdcd evaluates text only as under collation"
                ' "C" (COLLATE "C", "POSIX" or "ucs_basic")'
            )
        self.visit(node.arg)

    def value_function(self, node: ast.SQLValueFunction) -> None:
        self.fail(f"{show(node)} is not immutable (row filters allow only immutable built-in functions)")

    def sublink(self, node: ast.SubLink) -> None:
        self.fail(f"subquery {show(node)} is not allowed in a row filter")

    def param(self, node: ast.ParamRef) -> None:
        self.fail(f"parameter {show(node)} is not allowed in a row filter")


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


# ----------------------------------------------------------------------------------------- cast types


def cast_type(tn: ast.TypeName, fail: Callable[[str], NoReturn]) -> T:
    """The supported built-in type a cast names."""
    names = name_parts(tn.names)
    shown = show(tn)
    if len(names) > 2 or (len(names) == 2 and names[0] != "pg_catalog") or names[-1] not in TYPE_OIDS:
        fail(f"cast to {shown}: casts to user-defined or unsupported types are not allowed")
    if tn.arrayBounds or tn.setof or tn.pct_type:
        fail(f"cast to {shown}: casts to user-defined or unsupported types are not allowed")
    name = names[-1]
    mods = tuple(_typmod_value(m, shown, fail) for m in tn.typmods or ())
    if not mods:
        return T(name)
    if name == "numeric" and len(mods) <= 2:
        precision, scale = mods[0], (mods[1] if len(mods) == 2 else 0)
        if not 1 <= precision <= 1000 or not -1000 <= scale <= 1000:
            fail(f"cast to {shown}: NUMERIC precision must be between 1 and 1000, scale between -1000 and 1000")
        return T(name, (precision, scale))
    if name in ("bpchar", "varchar") and len(mods) == 1:
        if not 1 <= mods[0] <= 10_485_760:
            fail(f"cast to {shown}: length for type {name} must be between 1 and 10485760")
        return T(name, mods)
    fail(f"cast to {shown}: type modifiers are supported only for numeric, char and varchar")


def _typmod_value(node: Any, shown: str, fail: Callable[[str], NoReturn]) -> int:
    if isinstance(node, ast.A_Const) and isinstance(node.val, ast.Integer) and node.val.ival is not None:
        return node.val.ival
    fail(f"cast to {shown}: unsupported type modifier")

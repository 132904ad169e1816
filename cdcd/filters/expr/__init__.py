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

The modules, in the order a filter goes through them: ``parse`` (pglast parsing and the checks that need no
column types), ``compile`` (the compiler, one method per node kind) on ``resolve`` (PostgreSQL's type
resolution), ``closures`` (the per-row closures compiled expressions are made of), ``values`` (column readers
and literal input), ``casts``, ``arith`` (numbers, dates, timestamps) and ``strings`` (text functions, LIKE);
``types`` is the type model and value representation, ``errors`` the two exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence

from cdcd.filters.expr.errors import FilterError, Unevaluable
from cdcd.filters.expr.types import ColumnType, ParsedFilter, Predicate


# pglast (PostgreSQL's parser, ~0.1 s to import) is loaded by the first filter: most configurations have none.
def parse_filter(text: str) -> ParsedFilter:
    """Check ``text`` (syntax and the restrictions that need no column types). Raises FilterError."""
    from cdcd.filters.expr.parse import parse_filter as parse  # noqa: PLC0415 - see above

    return parse(text)


def compile_filter(parsed: ParsedFilter, columns: Sequence[ColumnType]) -> Predicate:
    """``parsed`` compiled for a table's columns (see the module's description). Raises FilterError."""
    from cdcd.filters.expr.compile import compile_filter as compile_  # noqa: PLC0415 - see parse_filter

    return compile_(parsed, columns)


__all__ = ["ColumnType", "FilterError", "ParsedFilter", "Predicate", "Unevaluable", "compile_filter", "parse_filter"]

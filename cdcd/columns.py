"""Column selection and masking (Debezium's ``column.include.list``, ``column.exclude.list``, ``column.mask.*``
and ``column.truncate.*``), as the encoders apply them to each row they write. Pure.

Rules go by table (``schema.table``): an include list or an exclude list of its columns, and a mask rule per
column. A rule reads a value's PostgreSQL text form (what pgoutput and COPY send as text) and gives the text
sent instead, an Avro ``string``:

* ``hash``: the lower-case hex SHA-256 of the salt's UTF-8 bytes followed by the value's, which PostgreSQL
  computes as ``encode(sha256(convert_to(salt || value::text, 'UTF8')), 'hex')``;
* ``keep_first`` / ``keep_last`` n: the first (last) n characters kept, every other one replaced by ``*``;
* ``stars`` n: n ``*`` whatever the value (Debezium's ``column.mask.with.<n>.chars``);
* ``constant``: the same text for every value;
* ``truncate`` n: the first n characters (Debezium's ``column.truncate.to.<n>.chars``);
* ``null``: no value at all; the column's field becomes nullable.

NULL stays NULL, and an unchanged TOAST value stays unchanged (it has no value to mask). Characters are
Unicode code points, as PostgreSQL's ``left``/``right`` count them in a UTF-8 database. Row filters read the
original values: rules apply where rows are encoded, after the filters. The compiled row stage applies the same
rules (native/src/mask.rs); ``Mask.native`` is how they are handed to it.

A key column may only be hashed (a key must stay unique and stable) and never left out; a rule naming a column
the table does not have is refused too (a misspelt mask must not ship the column in clear). Both are
``ColumnRuleError``: a configuration error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from cdcd.pgoutput.messages import Relation

MaskKind = Literal["hash", "keep_first", "keep_last", "stars", "constant", "truncate", "null"]

# the compiled stage's rule codes (native/src/mask.rs); stars go as their constant
_NATIVE_CODES: Final[dict[str, int]] = {
    "hash": 1,
    "keep_first": 2,
    "keep_last": 3,
    "constant": 4,
    "null": 5,
    "truncate": 6,
}


class ColumnRuleError(ValueError):
    """The column rules do not fit a table (a key column excluded or masked other than by hash, an unknown
    column): a configuration error."""


@dataclass(frozen=True)
class Mask:
    """One column's mask rule. ``salt`` is the hash's (never shown); ``n`` the count of the counted rules."""

    kind: MaskKind
    n: int = 0
    constant: str = ""
    salt: bytes = field(default=b"", repr=False)

    def apply(self, text: str) -> str | None:
        """The masked form of a value's text form (None: the ``null`` rule)."""
        kind, n = self.kind, self.n
        if kind == "hash":
            return hashlib.sha256(self.salt + text.encode()).hexdigest()
        if kind == "keep_first":
            return text[:n] + "*" * max(len(text) - n, 0)
        if kind == "keep_last":
            return "*" * max(len(text) - n, 0) + (text[-n:] if n else "")
        if kind == "stars":
            return "*" * n
        if kind == "constant":
            return self.constant
        if kind == "truncate":
            return text[:n]
        return None

    def native(self) -> tuple[int, int, bytes]:
        """(rule code, n, bytes: the salt or the constant's UTF-8) for the compiled row writer."""
        if self.kind == "stars":
            return _NATIVE_CODES["constant"], 0, b"*" * self.n
        if self.kind == "hash":
            return _NATIVE_CODES["hash"], 0, self.salt
        return _NATIVE_CODES[self.kind], self.n, self.constant.encode()


@dataclass(frozen=True)
class TableColumns:
    """One table's rules: ``include`` (None: every column) or ``exclude``, and masks by column name."""

    table: str
    include: frozenset[str] | None = None
    exclude: frozenset[str] = frozenset()
    masks: Mapping[str, Mask] = field(default_factory=dict)

    def sent(self, column: str) -> bool:
        """Whether the column goes to the sink at all."""
        return column not in self.exclude and (self.include is None or column in self.include)

    def check(self, relation: Relation) -> None:
        """Raise ColumnRuleError where the rules do not fit this version of the table."""
        names = {c.name for c in relation.columns}
        named = set(self.exclude) | set(self.masks) | set(self.include or ())
        unknown = sorted(named - names)
        if unknown:
            raise ColumnRuleError(
                f"columns.tables.{self.table}: the table has no column {', '.join(map(repr, unknown))}"
                " (a rule must name a column the stream sends: a virtual generated column is never sent, a stored"
                " one only with publish_generated_columns: stored)"
            )
        for column in relation.columns:
            if not column.is_key:
                continue
            if not self.sent(column.name):
                raise ColumnRuleError(
                    f"columns.tables.{self.table}: key column {column.name!r} cannot be left out (the records'"
                    " key is made of it)"
                )
            mask = self.masks.get(column.name)
            if mask is not None and mask.kind != "hash":
                raise ColumnRuleError(
                    f"columns.tables.{self.table}: key column {column.name!r} can only be masked by hash (a key"
                    f" must stay unique and stable), not by {mask.kind}"
                )


@dataclass(frozen=True)
class ColumnRules:
    """Every table's rules, by ``schema.table``."""

    tables: Mapping[str, TableColumns] = field(default_factory=dict)

    def of(self, relation: Relation) -> TableColumns | None:
        """The rules of a table (checked against this version of it), or None: every column as it is."""
        rules = self.tables.get(f"{relation.schema or 'pg_catalog'}.{relation.name}")
        if rules is not None:
            rules.check(relation)
        return rules

    @property
    def masked(self) -> bool:
        return any(t.masks for t in self.tables.values())

    def shown_key(
        self, relation: Relation, key_columns: Sequence[str], values: Sequence[str | None] | None
    ) -> list[str | None] | None:
        """A chunk key (text values of ``key_columns``) as it may leave the process (notifications, logs): a
        hashed key column's value hashed, as the records' key has it. The clear key stays inside (the next
        chunk's query, the state file)."""
        if values is None:
            return None
        rules = self.tables.get(f"{relation.schema or 'pg_catalog'}.{relation.name}")
        masks = {} if rules is None else rules.masks
        return [
            v if v is None or (mask := masks.get(column)) is None else mask.apply(v)
            for column, v in zip(key_columns, values, strict=True)
        ]


NO_RULES: Final = ColumnRules()

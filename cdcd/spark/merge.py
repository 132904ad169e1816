"""The SQL the job runs on each micro-batch of one table, built by pure functions.

Order of events: by stream position ``(source.commit_lsn, source.lsn)``: transactions in commit order, changes
in WAL order inside one, snapshot (``r``) events at the position cdcd gives them; the Kafka offset breaks ties
(one key's events share one partition). Every mirror row keeps the position of the event that wrote it
(``_cdc_commit_lsn``, ``_cdc_lsn``), which makes the MERGE idempotent: an event applies to a row only when it
is newer than the row, so a replayed batch changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from cdcd.spark.schema import COMMIT_LSN, LSN, TableSchema, literal, quote

# Columns of the decoded events of one table (see job.decode): envelope fields flattened, rows aligned.
OP: Final = "_op"
EV_COMMIT_LSN: Final = "_commit_lsn"
EV_LSN: Final = "_lsn"
OFFSET: Final = "_offset"
UNCHANGED: Final = "_unchanged_toast"
KEEP_PREFIX: Final = "_keep_"

Position = tuple[int, int]


def position_after(commit_lsn: str, lsn: str, position: Position | tuple[str, str]) -> str:
    """SQL: the position (commit_lsn, lsn) is strictly after ``position`` (values, or columns of another row)."""
    c, n = position
    return f"({commit_lsn} > {c} OR ({commit_lsn} = {c} AND {lsn} > {n}))"


def newer(source: str = "s", target: str = "t") -> str:
    """SQL: the source event is strictly after the event that last wrote the target row."""
    return position_after(
        f"{source}.{EV_COMMIT_LSN}", f"{source}.{EV_LSN}", (f"{target}.{COMMIT_LSN}", f"{target}.{LSN}")
    )


def key_expressions(keys: Sequence[str]) -> list[str]:
    """SQL selecting each key column from an event: the old row for a delete, the new one otherwise."""
    return [f"CASE WHEN {OP} = 'd' THEN before.{quote(k)} ELSE after.{quote(k)} END AS {quote(k)}" for k in keys]


def keyed_events_sql(view: str, keys: Sequence[str], since: Position | None = None) -> str:
    """SQL: the events of ``view`` after position ``since`` (a truncate) with their key columns. An update whose
    old row has another key (a table keyed with --key whose REPLICA IDENTITY FULL sends the whole old row; cdcd
    itself splits key changes of keyed tables into a delete and a create) also deletes the old key, at the same
    position."""
    after = "TRUE" if since is None else position_after(EV_COMMIT_LSN, EV_LSN, since)
    fields = f"{EV_COMMIT_LSN}, {EV_LSN}, {OFFSET}, {UNCHANGED}, after"
    old_keys = ", ".join(f"before.{quote(k)} AS {quote(k)}" for k in keys)
    same = " AND ".join(f"before.{quote(k)} <=> after.{quote(k)}" for k in keys)
    return (
        f"SELECT {', '.join(key_expressions(keys))}, {OP}, {fields} FROM {view} WHERE {after} UNION ALL "
        f"SELECT {old_keys}, 'd' AS {OP}, {fields} FROM {view} "
        f"WHERE {after} AND {OP} = 'u' AND before IS NOT NULL AND NOT ({same})"
    )


def latest_sql(view: str, keys: Sequence[str], schema: TableSchema, since: Position | None) -> str:
    """SQL: per key, the newest event of ``view`` after position ``since`` (a truncate), with each column's
    newest value that was sent (an unchanged TOAST value is not: ``_keep_<column>`` tells the MERGE to keep
    the mirror's). One aggregation: ``max_by`` skips rows whose ordering is null."""
    order = f"struct({EV_COMMIT_LSN}, {EV_LSN}, {OFFSET})"
    key_list = ", ".join(quote(k) for k in keys)
    picks = [f"max_by(struct({OP}, {EV_COMMIT_LSN}, {EV_LSN}), {order}) AS _last"]
    values = [c for c in schema.columns if c.name not in keys]  # a key column's value is the key
    for col in values:
        q = quote(col.name)
        sent = f"CASE WHEN {OP} = 'd' OR array_contains({UNCHANGED}, {literal(col.name)}) THEN NULL ELSE {order} END"
        picks.append(f"max_by(struct(after.{q} AS v), {sent}) AS {quote('_v_' + col.name)}")
    outer = [quote(k) for k in keys] + [f"_last.{OP} AS {OP}", f"_last.{EV_COMMIT_LSN} AS {EV_COMMIT_LSN}",
                                         f"_last.{EV_LSN} AS {EV_LSN}"]  # fmt: skip
    outer += [f"false AS {quote(KEEP_PREFIX + k)}" for k in keys]
    for col in values:
        v = quote("_v_" + col.name)
        outer += [f"{v}.v AS {quote(col.name)}", f"{v} IS NULL AS {quote(KEEP_PREFIX + col.name)}"]
    inner = keyed_events_sql(view, keys, since)
    return f"SELECT {', '.join(outer)} FROM (SELECT {key_list}, {', '.join(picks)} FROM ({inner}) GROUP BY {key_list})"


def merge_sql(table: str, source: str, keys: Sequence[str], schema: TableSchema) -> str:
    """The MERGE of the newest event per key (``source``, from :func:`latest_sql`) into the mirror ``table``:
    delete, update when newer (unchanged TOAST columns keep their value), insert what is not there."""
    on = " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in keys)
    sets = [
        f"t.{quote(c.name)} = CASE WHEN s.{quote(KEEP_PREFIX + c.name)} THEN t.{quote(c.name)} "
        f"ELSE s.{quote(c.name)} END"
        for c in schema.columns
    ]
    sets += [f"t.{COMMIT_LSN} = s.{EV_COMMIT_LSN}", f"t.{LSN} = s.{EV_LSN}"]
    names = [quote(c.name) for c in schema.columns] + [COMMIT_LSN, LSN]
    values = [f"s.{quote(c.name)}" for c in schema.columns] + [f"s.{EV_COMMIT_LSN}", f"s.{EV_LSN}"]
    return (
        f"MERGE INTO {table} AS t USING {source} AS s ON {on} "
        f"WHEN MATCHED AND s.{OP} = 'd' AND {newer()} THEN DELETE "
        f"WHEN MATCHED AND s.{OP} <> 'd' AND {newer()} THEN UPDATE SET {', '.join(sets)} "
        f"WHEN NOT MATCHED AND s.{OP} <> 'd' THEN INSERT ({', '.join(names)}) VALUES ({', '.join(values)})"
    )


def truncate_sql(table: str, position: Position) -> str:
    """Clear the mirror as of a truncate: every row written before it goes (rows written after it stay)."""
    return f"DELETE FROM {table} WHERE NOT {position_after(COMMIT_LSN, LSN, position)}"


def evolve_sql(table: str, current: TableSchema, target: TableSchema) -> list[str]:
    """ALTER TABLE statements that turn the mirror's columns ``current`` into ``target`` (added columns are
    null in existing rows, as PostgreSQL's ADD COLUMN without a default; dropped ones go)."""
    have, want = set(current.names), set(target.names)
    changed = [c.name for c in target.columns if c.name in have and c not in current.columns]
    if changed:
        raise ValueError(f"{table}: the type of column(s) {', '.join(changed)} changed; the mirror cannot follow")
    out = []
    added = [c for c in target.columns if c.name not in have]
    if added:
        out.append(f"ALTER TABLE {table} ADD COLUMNS ({TableSchema(tuple(added)).ddl()})")
    dropped = [n for n in current.names if n not in want]
    if dropped:
        out.append(f"ALTER TABLE {table} DROP COLUMNS ({', '.join(quote(n) for n in dropped)})")
    return out

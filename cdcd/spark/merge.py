"""The SQL the job runs on each micro-batch of one table, built by pure functions.

Order of events: by stream position ``(source.commit_lsn, source.lsn)``: transactions in commit order, changes
in WAL order inside one, snapshot (``r``) events at the position cdcd gives them; the Kafka offset breaks ties
(one key's events share one partition). Every mirror row keeps the position of the event that wrote it
(``_cdc_commit_lsn``, ``_cdc_lsn``), which makes the MERGE idempotent: an event applies to a row only when it
is newer than the row, so a replayed batch changes nothing.

A key change is a delete under the old key and a create under the new one, each naming the other key in a
header (``MOVED_FROM`` on the create, ``MOVED_TO`` on the delete). Before the events apply, the mirror's row
moves to the new key, just before the change's position (whichever half arrives first moves it), so the create
updates it and keeps what it did not send: unchanged TOAST values, as PostgreSQL's own subscriber does when it
updates the row in place. The row moves as the batch's earlier events left it: in one MERGE
(:func:`moved_latest_sql`), where the old key's events before the change count as the new key's; a batch with
a chain, a reused key or an earlier event on a new key in one MERGE per part, split at each such change
(:func:`first_conflict_sql`).
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
MOVED_FROM: Final = "_moved_from"  # the create of a key change: the old key (a struct of the key columns)
MOVED_TO: Final = "_moved_to"  # the delete of a key change: the new key
OLD_PREFIX: Final = "_old_"
NEW_PREFIX: Final = "_new_"
BASE_PREFIX: Final = "_base_"  # a moved row: the value under its old key
MOVED: Final = "_moved"  # the row moves to its key in this batch

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


def latest_sql(
    view: str, keys: Sequence[str], schema: TableSchema, since: Position | None, *, lineage: bool = False
) -> str:
    """SQL: per key, the newest event of ``view`` after position ``since`` (a truncate), with each column's
    newest value that was sent (an unchanged TOAST value is not: ``_keep_<column>`` tells the MERGE to keep
    the mirror's). One aggregation: ``max_by`` skips rows whose ordering is null. With ``lineage``, ``view``
    is :func:`lineage_events_sql` (already keyed; its moves send nothing) and the rows keep ``_root`` and
    ``_inherited``."""
    order = f"struct({EV_COMMIT_LSN}, {EV_LSN}, {OFFSET})"
    key_list = ", ".join(quote(k) for k in keys)
    picks = [f"max_by(struct({OP}, {EV_COMMIT_LSN}, {EV_LSN}), {order}) AS _last"]
    values = [c for c in schema.columns if c.name not in keys]  # a key column's value is the key
    nothing = f"{OP} IN ('d', 'm')" if lineage else f"{OP} = 'd'"
    for col in values:
        q = quote(col.name)
        sent = f"CASE WHEN {nothing} OR array_contains({UNCHANGED}, {literal(col.name)}) THEN NULL ELSE {order} END"
        picks.append(f"max_by(struct(after.{q} AS v), {sent}) AS {quote('_v_' + col.name)}")
    outer = [quote(k) for k in keys] + [f"_last.{OP} AS {OP}", f"_last.{EV_COMMIT_LSN} AS {EV_COMMIT_LSN}",
                                         f"_last.{EV_LSN} AS {EV_LSN}"]  # fmt: skip
    outer += [f"false AS {quote(KEEP_PREFIX + k)}" for k in keys]
    for col in values:
        v = quote("_v_" + col.name)
        outer += [f"{v}.v AS {quote(col.name)}", f"{v} IS NULL AS {quote(KEEP_PREFIX + col.name)}"]
    if lineage:
        picks += [f"max_by(_root, CASE WHEN _root IS NOT NULL THEN {order} END) AS _root",
                  "bool_or(_inherited) AS _inherited"]  # fmt: skip
        outer += ["_root", "_inherited"]
    inner = view if lineage else keyed_events_sql(view, keys, since)
    return f"SELECT {', '.join(outer)} FROM (SELECT {key_list}, {', '.join(picks)} FROM ({inner}) GROUP BY {key_list})"


def merge_sql(table: str, source: str, keys: Sequence[str], schema: TableSchema, *, moved: bool = False) -> str:
    """The MERGE of the newest event per key (``source``, from :func:`latest_sql`) into the mirror ``table``:
    delete, update when newer (unchanged TOAST columns keep their value), insert what is not there. With
    ``moved`` (``source`` from :func:`moved_latest_sql`), a row that moves keeps the values of the row it moves
    from instead, and a move with nothing to move does nothing."""
    on = " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in keys)

    def kept(c: str, current: str) -> str:
        if not moved or c in keys:
            return current
        return f"CASE WHEN s.{MOVED} THEN s.{quote(BASE_PREFIX + c)} ELSE {current} END"

    sets = [
        f"t.{quote(c.name)} = CASE WHEN s.{quote(KEEP_PREFIX + c.name)} THEN {kept(c.name, 't.' + quote(c.name))} "
        f"ELSE s.{quote(c.name)} END"
        for c in schema.columns
    ]
    sets += [f"t.{COMMIT_LSN} = s.{EV_COMMIT_LSN}", f"t.{LSN} = s.{EV_LSN}"]
    names = [quote(c.name) for c in schema.columns] + [COMMIT_LSN, LSN]
    values = [
        f"CASE WHEN s.{quote(KEEP_PREFIX + c.name)} THEN {kept(c.name, 'NULL')} ELSE s.{quote(c.name)} END"
        if moved and c.name not in keys
        else f"s.{quote(c.name)}"
        for c in schema.columns
    ]
    values += [f"s.{EV_COMMIT_LSN}", f"s.{EV_LSN}"]
    upsert = f"s.{OP} <> 'd'" + (f" AND (s.{OP} <> 'm' OR s.{MOVED})" if moved else "")
    return (
        f"MERGE INTO {table} AS t USING {source} AS s ON {on} "
        f"WHEN MATCHED AND s.{OP} = 'd' AND {newer()} THEN DELETE "
        f"WHEN MATCHED AND {upsert} AND {newer()} THEN UPDATE SET {', '.join(sets)} "
        f"WHEN NOT MATCHED AND {upsert} THEN INSERT ({', '.join(names)}) VALUES ({', '.join(values)})"
    )


def insert_sql(table: str, source: str, keys: Sequence[str], schema: TableSchema) -> str:
    """What :func:`merge_sql` does to an empty mirror ``table``, without the join: insert what is not deleted."""
    del keys  # the signature of merge_sql
    names = [quote(c.name) for c in schema.columns]
    return (
        f"INSERT INTO {table} ({', '.join([*names, COMMIT_LSN, LSN])}) "
        f"SELECT {', '.join([*names, EV_COMMIT_LSN, EV_LSN])} FROM {source} WHERE {OP} <> 'd'"
    )


def window_sql(view: str, since: Position | None, start: Position | None, end: Position | None) -> str:
    """SQL: the events of ``view`` after ``since`` (a truncate), from ``start`` (inclusive) and before ``end``."""
    at = (EV_COMMIT_LSN, EV_LSN)
    conditions = ["TRUE"]
    if since is not None:
        conditions.append(position_after(*at, since))
    if start is not None:
        conditions.append(f"NOT {position_after(str(start[0]), str(start[1]), at)}")
    if end is not None:
        conditions.append(position_after(str(end[0]), str(end[1]), at))
    return f"SELECT * FROM {view} WHERE {' AND '.join(conditions)}"


def moves_sql(view: str, keys: Sequence[str]) -> str:
    """SQL: the key changes among the events of ``view``, one row each whichever halves are there: the old key
    (``_old_<k>``), the new key (``_new_<k>``) and the change's position."""

    def side(prefix: str, struct: str) -> str:
        return ", ".join(f"{struct}.{quote(k)} AS {quote(prefix + k)}" for k in keys)

    at = f"{EV_COMMIT_LSN}, {EV_LSN}"
    return (
        f"SELECT {side(OLD_PREFIX, MOVED_FROM)}, {side(NEW_PREFIX, 'after')}, {at} FROM {view} "
        f"WHERE {OP} = 'c' AND {MOVED_FROM} IS NOT NULL UNION "
        f"SELECT {side(OLD_PREFIX, 'before')}, {side(NEW_PREFIX, MOVED_TO)}, {at} FROM {view} "
        f"WHERE {OP} = 'd' AND {MOVED_TO} IS NOT NULL"
    )


def first_conflict_sql(view: str, moves: str, keys: Sequence[str]) -> str:
    """SQL: ``first``, the position of the first key change in ``moves`` that one pass cannot resolve (see
    :func:`lineage_events_sql`), null when none: one with an earlier event or key change on its new key, or an
    earlier delete or key change on its old key (chains, reused keys). The events from there on are applied
    after the others."""
    events = keyed_events_sql(view, keys)
    old, new = ", ".join(quote(OLD_PREFIX + k) for k in keys), ", ".join(quote(NEW_PREFIX + k) for k in keys)
    at = f"{EV_COMMIT_LSN}, {EV_LSN}"
    touches = (
        f"SELECT {', '.join(quote(k) for k in keys)}, {at}, {OP} AS _kind FROM ({events}) UNION ALL "
        f"SELECT {old}, {at}, 'moved' FROM {moves} UNION ALL SELECT {new}, {at}, 'moved' FROM {moves}"
    )
    earlier = position_after(f"m.{EV_COMMIT_LSN}", f"m.{EV_LSN}", (f"e.{EV_COMMIT_LSN}", f"e.{EV_LSN}"))
    parts = []
    for prefix, kinds in ((NEW_PREFIX, ""), (OLD_PREFIX, " AND e._kind IN ('d', 'moved')")):
        on = " AND ".join(f"e.{quote(k)} <=> m.{quote(prefix + k)}" for k in keys)
        join = f"{moves} m JOIN ({touches}) e ON {on} AND {earlier}{kinds}"
        parts.append(f"SELECT m.{EV_COMMIT_LSN}, m.{EV_LSN} FROM {join}")
    return f"SELECT min(struct({EV_COMMIT_LSN}, {EV_LSN})) AS first FROM ({' UNION ALL '.join(parts)})"


def lineage_events_sql(view: str, moves: str, keys: Sequence[str]) -> str:
    """SQL: the keyed events of ``view`` (:func:`keyed_events_sql`) with what the key changes of ``moves`` add,
    for one pass over events without a :func:`first_conflict_sql`. For each key change from key o to key n at
    position p: o's events before p again, under n (``_inherited``: the values the row had when it moved); a
    move (op ``m``) under n one byte of WAL before p, naming o and p in ``_root`` (the mirror's row under o,
    when older than p, gives what no event sent); a delete of o at p (whichever half of the change is here)."""
    events = keyed_events_sql(view, keys)
    fields = f"{OP}, {EV_COMMIT_LSN}, {EV_LSN}, {OFFSET}, {UNCHANGED}, after"
    key_list = ", ".join(quote(k) for k in keys)
    new = ", ".join(f"m.{quote(NEW_PREFIX + k)} AS {quote(k)}" for k in keys)
    old = ", ".join(f"m.{quote(OLD_PREFIX + k)} AS {quote(k)}" for k in keys)
    root = ", ".join(f"{literal(k)}, m.{quote(OLD_PREFIX + k)}" for k in keys)
    root += f", {literal(EV_COMMIT_LSN)}, m.{EV_COMMIT_LSN}, {literal(EV_LSN)}, m.{EV_LSN}"
    on_old = " AND ".join(f"e.{quote(k)} <=> m.{quote(OLD_PREFIX + k)}" for k in keys)
    before = position_after(f"m.{EV_COMMIT_LSN}", f"m.{EV_LSN}", (f"e.{EV_COMMIT_LSN}", f"e.{EV_LSN}"))
    nothing = f"CAST(array() AS array<string>) AS {UNCHANGED}, NULL AS after"
    return (
        f"SELECT {key_list}, {fields}, NULL AS _root, false AS _inherited FROM ({events}) UNION ALL "
        f"SELECT {new}, e.{OP}, e.{EV_COMMIT_LSN}, e.{EV_LSN}, e.{OFFSET}, e.{UNCHANGED}, e.after, NULL, true "
        f"FROM ({events}) e JOIN {moves} m ON {on_old} AND {before} UNION ALL "
        f"SELECT {new}, 'm', m.{EV_COMMIT_LSN}, m.{EV_LSN} - 1, -1, {nothing}, named_struct({root}), false "
        f"FROM {moves} m UNION ALL "
        f"SELECT {old}, 'd', m.{EV_COMMIT_LSN}, m.{EV_LSN}, -1, {nothing}, NULL, false FROM {moves} m"
    )


def moved_latest_sql(view: str, moves: str, table: str, keys: Sequence[str], schema: TableSchema) -> str:
    """SQL: :func:`latest_sql` over :func:`lineage_events_sql`, each row joined with the mirror's row it moves
    from (``_base_<column>``; ``_moved`` when a row moves: its own or inherited events, or a row to take)."""
    latest = latest_sql(f"({lineage_events_sql(view, moves, keys)})", keys, schema, None, lineage=True)
    values = [c for c in schema.columns if c.name not in keys]
    on = " AND ".join(f"o.{quote(k)} <=> s._root.{quote(k)}" for k in keys)
    older = position_after(f"s._root.{EV_COMMIT_LSN}", f"s._root.{EV_LSN}", (f"o.{COMMIT_LSN}", f"o.{LSN}"))
    base = [f"o.{quote(c.name)} AS {quote(BASE_PREFIX + c.name)}" for c in values]
    moved = f"(o.{LSN} IS NOT NULL OR s._inherited) AS {MOVED}"
    return f"SELECT s.*, {', '.join([*base, moved])} FROM ({latest}) s LEFT JOIN {table} o ON {on} AND {older}"


def truncate_sql(table: str, position: Position) -> str:
    """Clear the mirror as of a truncate: every row written before it goes (rows written after it stay)."""
    return f"DELETE FROM {table} WHERE NOT {position_after(COMMIT_LSN, LSN, position)}"


def evolve_sql(table: str, current: TableSchema, target: TableSchema) -> list[str]:
    """ALTER TABLE statements that turn the mirror's columns ``current`` into ``target`` (added columns are
    null in existing rows, as PostgreSQL's ADD COLUMN without a default; dropped ones go)."""
    have, want = {c.name: c.ddl for c in current.columns}, set(target.names)
    changed = [c.name for c in target.columns if c.name in have and have[c.name] != c.ddl]
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

"""A workload that knows what it committed: each transaction mirrors its changes, savepoints and rollbacks
in a model, so tests compare cdcd's output with what the database committed, not with cdcd's own view."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

# (op, table, before, after) with rows as {column: text value}; before is the key (default replica identity)
# or the full old row (REPLICA IDENTITY FULL), None where PostgreSQL sends no old tuple.
Change = tuple[str, str, dict[str, str] | None, dict[str, str] | None]

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL, n int);
CREATE TABLE audit (id int PRIMARY KEY, v text NOT NULL, n int);
ALTER TABLE audit REPLICA IDENTITY FULL;
CREATE PUBLICATION cdcd_pub FOR TABLE items, audit;
"""

FULL_IDENTITY = {"audit"}


@dataclass
class Model:
    """Committed rows per table, to know old values for updates and deletes."""

    rows: dict[str, dict[int, dict[str, str]]] = field(default_factory=lambda: {"items": {}, "audit": {}})
    committed: list[tuple[int, list[Change]]] = field(default_factory=list)  # (xid, changes) in commit order


def _row(id_: int, v: str, n: int | None) -> dict[str, str]:
    return {"id": str(id_), "v": v, "n": None if n is None else str(n)}  # type: ignore[dict-item]


class Txn:
    """One open transaction on its own connection, with savepoint-aware expected changes."""

    def __init__(self, dsn: str, model: Model) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.model = model
        self.conn.execute("BEGIN")
        self.xid: int = self.conn.execute("SELECT txid_current()").fetchone()[0]  # type: ignore[index]
        self.changes: list[Change] = []
        self._start = {table: dict(rows) for table, rows in model.rows.items()}
        self.rows = {table: dict(rows) for table, rows in model.rows.items()}
        self._savepoints: dict[str, tuple[int, dict[str, dict[int, dict[str, str]]]]] = {}

    def _before(self, table: str, id_: int) -> dict[str, str]:
        return dict(self.rows[table][id_]) if table in FULL_IDENTITY else {"id": str(id_)}

    def insert(self, table: str, id_: int, v: str, n: int | None = None) -> None:
        self.conn.execute(f"INSERT INTO {table} (id, v, n) VALUES (%s, %s, %s)", [id_, v, n])
        self.rows[table][id_] = _row(id_, v, n)
        self.changes.append(("c", table, None, _row(id_, v, n)))

    def insert_many(self, table: str, start: int, count: int, v: str) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {table} (id, v, n) VALUES (%s, %s, %s)",
                [(i, f"{v}{i}", i) for i in range(start, start + count)],
            )
        for i in range(start, start + count):
            self.rows[table][i] = _row(i, f"{v}{i}", i)
            self.changes.append(("c", table, None, _row(i, f"{v}{i}", i)))

    def update(self, table: str, id_: int, v: str) -> None:
        before = self._before(table, id_) if table in FULL_IDENTITY else None
        self.conn.execute(f"UPDATE {table} SET v = %s WHERE id = %s", [v, id_])
        self.rows[table][id_] = {**self.rows[table][id_], "v": v}
        self.changes.append(("u", table, before, dict(self.rows[table][id_])))

    def update_key(self, table: str, id_: int, new_id: int) -> None:
        before = self._before(table, id_)
        self.conn.execute(f"UPDATE {table} SET id = %s WHERE id = %s", [new_id, id_])
        row = self.rows[table].pop(id_)
        self.rows[table][new_id] = {**row, "id": str(new_id)}
        self.changes.append(("u", table, before, dict(self.rows[table][new_id])))

    def delete(self, table: str, id_: int) -> None:
        before = self._before(table, id_)
        self.conn.execute(f"DELETE FROM {table} WHERE id = %s", [id_])
        del self.rows[table][id_]
        self.changes.append(("d", table, before, None))

    def savepoint(self, name: str) -> None:
        self.conn.execute(f"SAVEPOINT {name}")
        rows = {t: {k: dict(v) for k, v in r.items()} for t, r in self.rows.items()}
        self._savepoints[name] = (len(self.changes), rows)

    def rollback_to(self, name: str) -> None:
        self.conn.execute(f"ROLLBACK TO SAVEPOINT {name}")
        count, rows = self._savepoints[name]
        del self.changes[count:]
        self.rows = {t: {k: dict(v) for k, v in r.items()} for t, r in rows.items()}

    def release(self, name: str) -> None:
        self.conn.execute(f"RELEASE SAVEPOINT {name}")

    def commit(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.close()
        for table, rows in self.rows.items():  # merge only what this transaction changed
            start, target = self._start[table], self.model.rows[table]
            for id_ in start.keys() - rows.keys():
                del target[id_]
            target.update({id_: row for id_, row in rows.items() if start.get(id_) != row})
        self.model.committed.append((self.xid, self.changes))

    def rollback(self) -> None:
        self.conn.execute("ROLLBACK")
        self.conn.close()


def normalize(line: dict[str, Any]) -> Change:
    return (line["op"], line["table"], line["before"], line["after"])


def group_by_xid(lines: list[dict[str, Any]]) -> list[tuple[int, list[Change]]]:
    """Group consecutive output lines by transaction, in the order they were written."""
    groups: list[tuple[int, list[Change]]] = []
    for line in lines:
        if not groups or groups[-1][0] != line["xid"]:
            groups.append((line["xid"], []))
        groups[-1][1].append(normalize(line))
    return groups


def interleaved_workload(dsn: str, model: Model) -> None:
    """Several transactions open at once, large enough to stream with logical_decoding_work_mem=64kB:
    one committed big, one with savepoints partly rolled back, one aborted whole, small ones in between."""
    seed = Txn(dsn, model)
    seed.insert_many("items", 1, 20, "seed")
    seed.insert_many("audit", 1, 20, "seed")
    seed.commit()

    big = Txn(dsn, model)
    saves = Txn(dsn, model)
    doomed = Txn(dsn, model)
    for round_ in range(3):
        big.insert_many("items", 1000 + round_ * 400, 400, "big")
        doomed.insert_many("items", 5000 + round_ * 400, 400, "doomed")
        small = Txn(dsn, model)
        small.update("items", 1 + round_, f"small{round_}")
        small.update("audit", 1 + round_, f"small{round_}")
        small.commit()

    saves.insert_many("items", 10_000, 300, "keep")
    saves.savepoint("a")
    saves.insert_many("items", 11_000, 300, "rolledback_a")
    saves.update("audit", 5, "rolledback_a")
    saves.savepoint("b")
    saves.insert_many("items", 12_000, 300, "rolledback_b")
    saves.release("b")
    saves.rollback_to("a")
    saves.insert_many("audit", 13_000, 300, "after_a")
    saves.savepoint("c")
    saves.delete("audit", 6)
    saves.update_key("items", 7, 70_007)
    saves.update("audit", 8, "kept_c")
    saves.release("c")
    saves.savepoint("d")
    saves.insert_many("items", 14_000, 300, "rolledback_d")
    saves.rollback_to("d")
    saves.delete("items", 9)

    big.update("items", 1000, "big-updated")
    big.delete("items", 1001)
    saves.commit()
    doomed.rollback()
    big.commit()

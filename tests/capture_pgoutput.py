"""Capture raw pgoutput messages from a real PostgreSQL into a JSON fixture for the decoder tests.

    python tests/capture_pgoutput.py --dsn "host=127.0.0.1 port=5498 user=postgres" \\
        --out tests/fixtures/pgoutput/pg15.json

The server needs ``wal_level = logical`` and ``max_prepared_transactions > 0``; the DSN's user must be a superuser
(replication origins, CREATE DATABASE). Everything is done in a scratch database, ``cdcd_capture``, created here and
dropped at the end together with the slots and the replication origin. The SQL decoding interface
(``pg_logical_slot_peek_binary_changes``) is used, so no walsender connection is needed: one slot per workload is
created, the workload runs, and the slot is peeked once per (protocol version, option set) before being dropped.

One exception: a streamed transaction that is rolled back whole. The SQL interface decodes after the fact, and by
then the transaction is known to be aborted, so nothing of it is streamed (the server notices the abort on its first
catalog access) and no Stream Abort is sent. That workload is therefore captured through walsender sessions
(``START_REPLICATION``, one per protocol version and option set, all started before the workload) that stream the
transaction while it is still open; the transaction is rolled back once every session has received stream blocks.

This module is also the single source of truth for the workload data: the tests import the constants below to build
their expected values, and ``load_fixture`` to read what this script wrote.
"""

from __future__ import annotations

import argparse
import json
import select
import struct
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import psycopg
from psycopg import pq, sql

FIXTURE_DIR: Final = Path(__file__).resolve().parent / "fixtures" / "pgoutput"
FIXTURE_FORMAT: Final = 1

DATABASE: Final = "cdcd_capture"
SCHEMA: Final = "cdcd_capture"
PUBLICATION: Final = "cdcd_capture_pub"
SLOT_PREFIX: Final = "cdcd_capture_"
ORIGIN_NAME: Final = "cdcd_capture_origin"
WORK_MEM: Final = "64kB"  # logical_decoding_work_mem of the decoding session: the minimum, so big transactions stream
KEEP_INSERTS_PER_BLOCK: Final = 3  # bulk inserts kept per (stream block, xid); the rest are elided from the fixture

PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)


def pg_timestamp_us(moment: datetime) -> int:
    """A timestamptz as pgoutput sends it: microseconds since 2000-01-01 00:00:00 UTC."""
    delta = moment - PG_EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


# ----------------------------------------------------------------------------------------------- schema ----------


@dataclass(frozen=True)
class Col:
    name: str
    sql_type: str  # as written in CREATE TABLE
    kind: str  # how the tests render a value: "int4", "int8", "text", "bool" (enum labels are "text")


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Col, ...]
    constraints: str = ""
    full_identity: bool = False
    external: str | None = None  # column stored out of line uncompressed (STORAGE EXTERNAL), so it TOASTs

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


ENUM_TYPE: Final = "mood"
ENUM_LABELS: Final = ("happy", "sad", "meh")
_ENUM = f"{SCHEMA}.{ENUM_TYPE}"

ITEMS: Final = Table(
    "items",
    (
        Col("id", "int4 PRIMARY KEY", "int4"),
        Col("name", "varchar(40) NOT NULL", "text"),
        Col("qty", "int8", "int8"),
        Col("mood", _ENUM, "text"),
        Col("note", "text", "text"),
        Col("flag", "bool", "bool"),
    ),
)
FULL_ROWS: Final = Table(
    "full_rows",
    (Col("id", "int4 NOT NULL", "int4"), Col("label", "text", "text"), Col("amount", "int8", "int8")),
    full_identity=True,
)
DOCS: Final = Table(
    "docs",
    (Col("id", "int4 PRIMARY KEY", "int4"), Col("title", "text", "text"), Col("body", "text", "text")),
    external="body",
)
PARENT: Final = Table("parent", (Col("id", "bigserial PRIMARY KEY", "int8"), Col("name", "text", "text")))
CHILD: Final = Table(
    "child",
    (
        Col("id", "bigserial PRIMARY KEY", "int8"),
        Col("parent_id", f"int8 REFERENCES {SCHEMA}.parent (id)", "int8"),
        Col("name", "text", "text"),
    ),
)
EVENTS: Final = Table("events", (Col("id", "int4 PRIMARY KEY", "int4"), Col("body", "text", "text")))
BULK: Final = Table(
    "bulk", (Col("id", "int4 PRIMARY KEY", "int4"), Col("mood", _ENUM, "text"), Col("v", "text", "text"))
)
SCRATCH: Final = Table("scratch", (Col("id", "int4 PRIMARY KEY", "int4"),))
TABLES: Final = (ITEMS, FULL_ROWS, DOCS, PARENT, CHILD, EVENTS, BULK, SCRATCH)
ENUM_TABLES: Final = frozenset(t.name for t in TABLES if any(c.sql_type == _ENUM for c in t.columns))

# ----------------------------------------------------------------------------------------------- workload data ---

Row = tuple[int | str | bool | None, ...]

# basic: one transaction per step, in this order
ITEM_ROWS: Final[tuple[Row, ...]] = (
    (1, "apple", 3, "happy", None, True),
    (2, "pêche", 5, "sad", "ripe ✓", False),
)
ITEM_QTY_UPDATE: Final = (1, 4)  # UPDATE items SET qty = [1] WHERE id = [0]   (no old tuple)
ITEM_PK_CHANGE: Final = (2, 10)  # UPDATE items SET id = [1] WHERE id = [0]    (old 'K' tuple)
ITEM_DELETE_ID: Final = 10  # DELETE FROM items WHERE id = ...                 (old 'K' tuple)
FULL_ROW: Final[Row] = (1, "alpha", 150)
FULL_ROW_NEW_AMOUNT: Final = 225  # UPDATE then DELETE on the REPLICA IDENTITY FULL table ('O' tuples)
DOC_BODY: Final = "".join(f"{i:05d}|" for i in range(500))  # 3000 bytes, stored out of line
DOC_ROW: Final[Row] = (1, "first", DOC_BODY)
DOC_NEW_TITLE: Final = "second"  # UPDATE docs SET title = ... : body is sent as 'u' (unchanged TOAST)
PARENT_NAMES: Final = ("p1", "p2")  # ids 1, 2 from the fresh bigserial
CHILD_ROWS: Final = ((1, "c1"), (2, "c2"))  # (parent_id, name); ids 1, 2
# then TRUNCATE parent RESTART IDENTITY CASCADE (truncates child too), then a plain TRUNCATE full_rows
ITEM_WITH_MESSAGE: Final[Row] = (3, "fig", None, "meh", "with message", None)
TX_MESSAGE: Final = ("cdcd-tx", b"hello, transactional world")  # emitted in the same transaction
NONTX_MESSAGE: Final = ("cdcd-nontx", b"\x00\xff\x01non-transactional")
ORIGIN_ITEM: Final[Row] = (4, "plum", 7, "happy", "from origin", True)
ORIGIN_LSN: Final = 0x5_1A2B3C4D
ORIGIN_TIMESTAMP: Final = datetime(2021, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)


def bulk_row(i: int) -> Row:
    """The row the big (streamed) transactions insert for id ``i``."""
    return (i, ENUM_LABELS[i % 3], f"bulk-{i:06d}")


# stream_commit: one big transaction, committed
STREAM_COMMIT_IDS: Final = range(1, 1501)
STREAM_COMMIT_UPDATE: Final = (1, "updated in stream")  # UPDATE bulk SET v = [1] WHERE id = [0]
STREAM_COMMIT_DELETE_ID: Final = 2
STREAM_MESSAGE: Final = ("cdcd-stream", b"inside a streamed transaction")
# ... then TRUNCATE scratch, then COMMIT
# stream_abort: one big transaction, rolled back whole
STREAM_ABORT_IDS: Final = range(100_001, 101_501)
# stream_savepoint: BEGIN; TOP; SAVEPOINT s; SUB; ROLLBACK TO SAVEPOINT s; RELEASE SAVEPOINT s; TAIL; COMMIT
SAVEPOINT_TOP_IDS: Final = range(200_001, 200_601)
SAVEPOINT_SUB_IDS: Final = range(300_001, 301_201)
SAVEPOINT_TAIL_IDS: Final = range(400_001, 400_004)
# twophase: PREPARE + COMMIT PREPARED, then PREPARE + ROLLBACK PREPARED
GID_COMMIT: Final = "cdcd-gid-commit"
GID_ROLLBACK: Final = "cdcd-gid-rollback"
TWOPHASE_ROWS: Final[tuple[Row, Row]] = ((1, "committed"), (2, "rolled back"))
# stream_prepare: a big transaction, PREPARE (streamed: Stream Prepare) then COMMIT PREPARED
STREAM_PREPARE_IDS: Final = range(500_001, 501_501)
GID_STREAM: Final = "cdcd-gid-stream"

# ----------------------------------------------------------------------------------------------- captures --------


@dataclass(frozen=True)
class CaptureSpec:
    scenario: str
    workload: str
    min_proto: int
    options: tuple[tuple[str, str], ...]


CAPTURES: Final = (
    CaptureSpec("basic", "basic", 1, (("messages", "true"),)),
    CaptureSpec("basic_binary", "basic", 1, (("messages", "true"), ("binary", "true"))),
    CaptureSpec("stream_commit", "stream_commit", 2, (("messages", "true"), ("streaming", "on"))),
    CaptureSpec("stream_abort", "stream_abort", 2, (("streaming", "on"),)),
    CaptureSpec("stream_abort_parallel", "stream_abort", 4, (("streaming", "parallel"),)),
    CaptureSpec("stream_savepoint", "stream_savepoint", 2, (("streaming", "on"),)),
    CaptureSpec("stream_savepoint_parallel", "stream_savepoint", 4, (("streaming", "parallel"),)),
    CaptureSpec("twophase", "twophase", 3, (("two_phase", "on"),)),
    CaptureSpec("stream_prepare", "stream_prepare", 3, (("two_phase", "on"), ("streaming", "on"))),
)
TWO_PHASE_WORKLOADS: Final = frozenset({"twophase", "stream_prepare"})
WALSENDER_WORKLOADS: Final = frozenset({"stream_abort"})  # see the module docstring


def max_proto_version(server_version_num: int) -> int:
    """Highest pgoutput protocol version a server supports: 2 from 14, 3 from 15, 4 from 16."""
    major = server_version_num // 10_000
    return 1 if major < 14 else 2 if major == 14 else 3 if major == 15 else 4


def scenarios_for(proto: int) -> tuple[str, ...]:
    return tuple(c.scenario for c in CAPTURES if c.min_proto <= proto)


# ----------------------------------------------------------------------------------------------- fixture I/O -----


@dataclass(frozen=True)
class FixtureMessage:
    proto: int
    scenario: str
    lsn: int
    xid: int
    data: bytes


@dataclass(frozen=True)
class CaptureInfo:
    proto: int
    scenario: str
    options: dict[str, str]
    elided_inserts: dict[int, int]  # xid -> bulk Insert messages left out of the fixture


@dataclass(frozen=True)
class RelationInfo:
    oid: int
    replica_identity: str
    columns: tuple[tuple[str, int, int, bool], ...]  # name, type oid, typmod, part of the replica identity


@dataclass(frozen=True)
class Fixture:
    path: Path
    server_version: str
    server_version_num: int
    relations: dict[str, RelationInfo]
    types: dict[str, int]
    workloads: dict[str, tuple[int, int]]  # server clock before and after the workload, PostgreSQL µs
    captures: tuple[CaptureInfo, ...]
    messages: tuple[FixtureMessage, ...]

    def stream(self, proto: int, scenario: str) -> list[FixtureMessage]:
        return [m for m in self.messages if m.proto == proto and m.scenario == scenario]

    def capture(self, proto: int, scenario: str) -> CaptureInfo:
        return next(c for c in self.captures if c.proto == proto and c.scenario == scenario)

    @property
    def protos(self) -> tuple[int, ...]:
        return tuple(sorted({c.proto for c in self.captures}))


def load_fixture(path: Path) -> Fixture:
    raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if raw["format"] != FIXTURE_FORMAT:
        raise ValueError(f"{path}: fixture format {raw['format']}, expected {FIXTURE_FORMAT}")
    return Fixture(
        path=path,
        server_version=str(raw["server_version"]),
        server_version_num=int(raw["server_version_num"]),
        relations={
            name: RelationInfo(
                int(r["oid"]),
                str(r["replica_identity"]),
                tuple((str(c[0]), int(c[1]), int(c[2]), bool(c[3])) for c in r["columns"]),
            )
            for name, r in raw["relations"].items()
        },
        types={str(k): int(v) for k, v in raw["types"].items()},
        workloads={str(k): (int(v[0]), int(v[1])) for k, v in raw["workloads"].items()},
        captures=tuple(
            CaptureInfo(
                int(c["proto"]),
                str(c["scenario"]),
                {str(k): str(v) for k, v in c["options"].items()},
                {int(k): int(v) for k, v in c["elided_inserts"].items()},
            )
            for c in raw["captures"]
        ),
        messages=tuple(
            FixtureMessage(
                int(m["proto"]), str(m["scenario"]), parse_lsn(m["lsn"]), int(m["xid"]), bytes.fromhex(m["hex"])
            )
            for m in raw["messages"]
        ),
    )


def fixture_paths() -> list[Path]:
    return sorted(FIXTURE_DIR.glob("pg*.json"))


# ----------------------------------------------------------------------------------------------- workloads -------

Conn = psycopg.Connection[tuple[Any, ...]]
Streamed = Callable[[int], None]  # called by a workload with its open transaction's xid: wait until it streamed


def _insert(conn: Conn, table: Table, rows: Sequence[Row], columns: Sequence[str] | None = None) -> None:
    names = tuple(columns) if columns is not None else table.column_names
    query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(SCHEMA, table.name),
        sql.SQL(", ").join(sql.Identifier(n) for n in names),
        sql.SQL(", ").join(sql.Placeholder() * len(names)),
    )
    with conn.cursor() as cur:
        cur.executemany(query, list(rows))


def _one(conn: Conn, query: str, params: Sequence[Any] = ()) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def _prepare(conn: Conn, gid: str) -> None:
    conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))


def _finish_prepared(conn: Conn, verb: str, gid: str) -> None:
    conn.execute(sql.SQL(verb + " PREPARED {}").format(sql.Literal(gid)))


def workload_basic(conn: Conn, streamed: Streamed) -> None:
    s = SCHEMA
    with conn.transaction():
        _insert(conn, ITEMS, ITEM_ROWS)
    conn.execute(f"UPDATE {s}.items SET qty = %s WHERE id = %s", (ITEM_QTY_UPDATE[1], ITEM_QTY_UPDATE[0]))
    conn.execute(f"UPDATE {s}.items SET id = %s WHERE id = %s", (ITEM_PK_CHANGE[1], ITEM_PK_CHANGE[0]))
    conn.execute(f"DELETE FROM {s}.items WHERE id = %s", (ITEM_DELETE_ID,))
    with conn.transaction():
        _insert(conn, FULL_ROWS, [FULL_ROW])
        conn.execute(f"UPDATE {s}.full_rows SET amount = %s WHERE id = %s", (FULL_ROW_NEW_AMOUNT, FULL_ROW[0]))
        conn.execute(f"DELETE FROM {s}.full_rows WHERE id = %s", (FULL_ROW[0],))
    with conn.transaction():
        _insert(conn, DOCS, [DOC_ROW])
    conn.execute(f"UPDATE {s}.docs SET title = %s WHERE id = %s", (DOC_NEW_TITLE, DOC_ROW[0]))
    with conn.transaction():
        _insert(conn, PARENT, [(n,) for n in PARENT_NAMES], ["name"])
        _insert(conn, CHILD, CHILD_ROWS, ["parent_id", "name"])
    conn.execute(f"TRUNCATE {s}.parent RESTART IDENTITY CASCADE")
    conn.execute(f"TRUNCATE {s}.full_rows")
    with conn.transaction():
        _insert(conn, ITEMS, [ITEM_WITH_MESSAGE])
        conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", TX_MESSAGE)
    conn.execute("SELECT pg_logical_emit_message(false, %s, %s)", NONTX_MESSAGE)
    conn.execute("SELECT pg_replication_origin_session_setup(%s)", (ORIGIN_NAME,))
    try:
        with conn.transaction():
            conn.execute(
                "SELECT pg_replication_origin_xact_setup(%s::pg_lsn, %s)", (format_lsn(ORIGIN_LSN), ORIGIN_TIMESTAMP)
            )
            _insert(conn, ITEMS, [ORIGIN_ITEM])
    finally:
        conn.execute("SELECT pg_replication_origin_session_reset()")


def workload_stream_commit(conn: Conn, streamed: Streamed) -> None:
    with conn.transaction():
        _insert(conn, BULK, [bulk_row(i) for i in STREAM_COMMIT_IDS])
        conn.execute(
            f"UPDATE {SCHEMA}.bulk SET v = %s WHERE id = %s", (STREAM_COMMIT_UPDATE[1], STREAM_COMMIT_UPDATE[0])
        )
        conn.execute(f"DELETE FROM {SCHEMA}.bulk WHERE id = %s", (STREAM_COMMIT_DELETE_ID,))
        conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", STREAM_MESSAGE)
        conn.execute(f"TRUNCATE {SCHEMA}.scratch")


def workload_stream_abort(conn: Conn, streamed: Streamed) -> None:
    conn.execute("BEGIN")
    xid = int(_one(conn, "SELECT pg_current_xact_id()::text")) & 0xFFFFFFFF
    _insert(conn, BULK, [bulk_row(i) for i in STREAM_ABORT_IDS])
    streamed(xid)
    conn.execute("ROLLBACK")


def workload_stream_savepoint(conn: Conn, streamed: Streamed) -> None:
    conn.execute("BEGIN")
    _insert(conn, BULK, [bulk_row(i) for i in SAVEPOINT_TOP_IDS])
    conn.execute("SAVEPOINT s")
    _insert(conn, BULK, [bulk_row(i) for i in SAVEPOINT_SUB_IDS])
    conn.execute("ROLLBACK TO SAVEPOINT s")
    conn.execute("RELEASE SAVEPOINT s")
    _insert(conn, BULK, [bulk_row(i) for i in SAVEPOINT_TAIL_IDS])
    conn.execute("COMMIT")


def workload_twophase(conn: Conn, streamed: Streamed) -> None:
    for row, gid, verb in ((TWOPHASE_ROWS[0], GID_COMMIT, "COMMIT"), (TWOPHASE_ROWS[1], GID_ROLLBACK, "ROLLBACK")):
        conn.execute("BEGIN")
        _insert(conn, EVENTS, [row])
        _prepare(conn, gid)
        _finish_prepared(conn, verb, gid)


def workload_stream_prepare(conn: Conn, streamed: Streamed) -> None:
    conn.execute("BEGIN")
    _insert(conn, BULK, [bulk_row(i) for i in STREAM_PREPARE_IDS])
    _prepare(conn, GID_STREAM)
    _finish_prepared(conn, "COMMIT", GID_STREAM)


WORKLOADS: Final[dict[str, Callable[[Conn, Streamed], None]]] = {
    "basic": workload_basic,
    "stream_commit": workload_stream_commit,
    "stream_abort": workload_stream_abort,
    "stream_savepoint": workload_stream_savepoint,
    "twophase": workload_twophase,
    "stream_prepare": workload_stream_prepare,
}

# ----------------------------------------------------------------------------------------------- capture ---------


def _setup(conn: Conn) -> None:
    s = SCHEMA
    conn.execute(f"CREATE SCHEMA {s}")
    conn.execute(f"CREATE TYPE {s}.{ENUM_TYPE} AS ENUM ({', '.join(repr(x) for x in ENUM_LABELS)})")
    for t in TABLES:
        columns = ", ".join(f"{c.name} {c.sql_type}" for c in t.columns)
        conn.execute(f"CREATE TABLE {s}.{t.name} ({columns}) WITH (autovacuum_enabled = false)")
        if t.full_identity:
            conn.execute(f"ALTER TABLE {s}.{t.name} REPLICA IDENTITY FULL")
        if t.external:
            conn.execute(f"ALTER TABLE {s}.{t.name} ALTER COLUMN {t.external} SET STORAGE EXTERNAL")
    conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(f'{s}.{t.name}' for t in TABLES)}")
    conn.execute("SELECT pg_replication_origin_create(%s)", (ORIGIN_NAME,))


def _catalog(conn: Conn) -> tuple[dict[str, Any], dict[str, int]]:
    relations: dict[str, Any] = {}
    for t in TABLES:
        oid, ident = conn.execute(
            "SELECT c.oid::int8, c.relreplident::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s",
            (SCHEMA, t.name),
        ).fetchall()[0]
        # pgoutput flags a column as key when it is in the replica identity index, or every column when FULL
        columns = conn.execute(
            "SELECT a.attname::text, a.atttypid::int8, a.atttypmod,"
            " c.relreplident = 'f' OR EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary"
            "   AND a.attnum = ANY (i.indkey))"
            " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (oid,),
        ).fetchall()
        relations[t.name] = {"oid": oid, "replica_identity": ident, "columns": [list(c) for c in columns]}
    type_oid = _one(
        conn,
        "SELECT t.oid::int8 FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
        " WHERE n.nspname = %s AND t.typname = %s",
        (SCHEMA, ENUM_TYPE),
    )
    return relations, {ENUM_TYPE: int(type_oid)}


def _now_us(conn: Conn) -> int:
    return int(_one(conn, "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8 - 946684800000000"))


def _peek(conn: Conn, slot: str, proto: int, options: tuple[tuple[str, str], ...]) -> list[tuple[str, int, bytes]]:
    args = ["proto_version", str(proto), "publication_names", PUBLICATION]
    for key, value in options:
        args += [key, value]
    rows = conn.execute(
        "SELECT lsn::text, xid::text::int8, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
        " VARIADIC %s::text[])",
        (slot, args),
    ).fetchall()
    return [(str(lsn), int(xid), bytes(data)) for lsn, xid, data in rows]


def _trim(rows: list[tuple[str, int, bytes]], bulk_oid: int) -> tuple[list[tuple[str, int, bytes]], dict[int, int]]:
    """Keep every message except bulk Inserts past the first few per (stream block, xid)."""
    kept: list[tuple[str, int, bytes]] = []
    seen: Counter[tuple[int, int]] = Counter()
    elided: defaultdict[int, int] = defaultdict(int)
    block, in_block = -1, False
    for row in rows:
        data = row[2]
        if data[:1] == b"S":
            block, in_block = block + 1, True
        elif data[:1] == b"E":
            in_block = False
        elif in_block and data[:1] == b"I" and len(data) >= 9:
            xid, relation_id = struct.unpack_from(">II", data, 1)
            if relation_id == bulk_oid:
                seen[block, xid] += 1
                if seen[block, xid] > KEEP_INSERTS_PER_BLOCK:
                    elided[xid] += 1
                    continue
        kept.append(row)
    return kept, dict(elided)


def _cleanup(admin: Conn, dsn: str) -> None:
    """Drop whatever a previous (interrupted) run of this script left behind."""
    for (slot,) in admin.execute(
        "SELECT slot_name::text FROM pg_replication_slots WHERE slot_name LIKE %s", (SLOT_PREFIX + "%",)
    ).fetchall():
        admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    leftovers = admin.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = %s AND gid LIKE 'cdcd-gid-%%'", (DATABASE,)
    ).fetchall()
    if leftovers:  # a prepared transaction can only be finished from its own database
        with psycopg.connect(psycopg.conninfo.make_conninfo(dsn, dbname=DATABASE), autocommit=True) as conn:
            for (gid,) in leftovers:
                _finish_prepared(conn, "ROLLBACK", gid)
    if _one(admin, "SELECT count(*) FROM pg_replication_origin WHERE roname = %s", (ORIGIN_NAME,)):
        admin.execute("SELECT pg_replication_origin_drop(%s)", (ORIGIN_NAME,))
    admin.execute(f"DROP DATABASE IF EXISTS {DATABASE}")


def capture(dsn: str, out: Path) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as admin:
        version = str(_one(admin, "SHOW server_version"))
        version_num = int(_one(admin, "SHOW server_version_num"))
        if _one(admin, "SHOW wal_level") != "logical":
            raise SystemExit("the server needs wal_level = logical")
        if int(_one(admin, "SHOW max_prepared_transactions")) < 1 and version_num >= 150000:
            raise SystemExit("the server needs max_prepared_transactions > 0")
        max_proto = max_proto_version(version_num)
        _cleanup(admin, dsn)
        admin.execute(f"CREATE DATABASE {DATABASE} TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'")
        try:
            result = _capture_in(psycopg.conninfo.make_conninfo(dsn, dbname=DATABASE), version, version_num, max_proto)
        finally:
            _cleanup(admin, dsn)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return result


class _WalSession:
    """A walsender session streaming one slot with one protocol version and option set."""

    def __init__(self, dsn: str, slot: str, proto: int, options: tuple[tuple[str, str], ...]) -> None:
        self.rows: list[tuple[str, int, bytes]] = []
        self.conn: Conn = psycopg.connect(
            dsn, autocommit=True, replication="database", options=f"-c logical_decoding_work_mem={WORK_MEM}"
        )
        args = [("proto_version", str(proto)), ("publication_names", PUBLICATION), *options]
        command = f'START_REPLICATION SLOT "{slot}" LOGICAL 0/0 ({", ".join(f"{k} {v!r}" for k, v in args)})'
        result = self.conn.pgconn.exec_(command.encode())
        if result.status != pq.ExecStatus.COPY_BOTH:
            raise RuntimeError(f"{command}: {(result.error_message or b'').decode()}")

    def pump(self, xid: int) -> None:
        """Take in whatever the server sent; messages are recorded with ``xid`` (the workload's transaction)."""
        pgconn = self.conn.pgconn
        pgconn.consume_input()
        while True:
            size, frame = pgconn.get_copy_data(1)
            if size == 0:
                return
            if size < 0:
                raise RuntimeError(f"replication stream ended: {pgconn.get_error_message()}")
            data = bytes(frame)
            if data[:1] == b"w":  # XLogData: start LSN, end LSN, send time, pgoutput message
                self.rows.append((format_lsn(struct.unpack_from(">Q", data, 1)[0]), xid, data[25:]))
            elif data[:1] == b"k" and data[17]:  # keepalive asking for a reply
                position = struct.unpack_from(">Q", data, 1)[0]
                status = b"r" + struct.pack(">QQQqB", position, position, position, 0, 0)
                pgconn.put_copy_data(status)
                pgconn.flush()

    def count(self, kind: bytes) -> int:
        return sum(1 for row in self.rows if row[2][:1] == kind)


def _pump_until(sessions: list[_WalSession], xid: int, done: Callable[[_WalSession], bool], what: str) -> None:
    deadline = time.monotonic() + 120
    while not all(done(s) for s in sessions):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        select.select([s.conn.pgconn.socket for s in sessions], [], [], 0.2)
        for session in sessions:
            session.pump(xid)


def _drop_slot(conn: Conn, slot: str) -> None:
    deadline = time.monotonic() + 30
    while _one(conn, "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"slot {slot} stays active")
        time.sleep(0.1)
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def _capture_in(dsn: str, version: str, version_num: int, max_proto: int) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as work, psycopg.connect(dsn, autocommit=True) as decode:
        _setup(work)
        relations, types = _catalog(work)
        bulk_oid = int(relations["bulk"]["oid"])
        decode.execute(f"SET logical_decoding_work_mem = '{WORK_MEM}'")
        captures: list[dict[str, Any]] = []
        messages: list[dict[str, Any]] = []
        workloads: dict[str, list[int]] = {}

        def record(spec: CaptureSpec, proto: int, rows: list[tuple[str, int, bytes]]) -> None:
            kept, elided = _trim(rows, bulk_oid)
            captures.append(
                {
                    "proto": proto,
                    "scenario": spec.scenario,
                    "options": dict(spec.options),
                    "elided_inserts": {str(k): v for k, v in sorted(elided.items())},
                }
            )
            messages.extend(
                {"proto": proto, "scenario": spec.scenario, "lsn": lsn, "xid": xid, "hex": data.hex()}
                for lsn, xid, data in kept
            )

        for workload, run in WORKLOADS.items():
            peeks = [
                (spec, proto)
                for spec in CAPTURES
                if spec.workload == workload
                for proto in range(spec.min_proto, max_proto + 1)
            ]
            if not peeks:
                continue
            started = _now_us(work)
            if workload in WALSENDER_WORKLOADS:
                slots = [f"{SLOT_PREFIX}{workload}_{i}" for i in range(len(peeks))]
                for slot in slots:
                    decode.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
                sessions = [
                    _WalSession(dsn, slot, proto, spec.options)
                    for slot, (spec, proto) in zip(slots, peeks, strict=True)
                ]
                xids: list[int] = []

                def streamed(xid: int, sessions: list[_WalSession] = sessions, xids: list[int] = xids) -> None:
                    xids.append(xid)
                    _pump_until(sessions, xid, lambda s: s.count(b"E") >= 2, "two stream blocks")

                run(work, streamed)
                _pump_until(sessions, xids[0], lambda s: s.count(b"A") >= 1, "Stream Abort")
                for session in sessions:
                    session.conn.close()
                for (spec, proto), session in zip(peeks, sessions, strict=True):
                    record(spec, proto, session.rows)
                for slot in slots:
                    _drop_slot(decode, slot)
            else:
                slot = SLOT_PREFIX + workload
                decode.execute(
                    "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)",
                    (slot, workload in TWO_PHASE_WORKLOADS),
                )
                run(work, lambda xid: None)
                for spec, proto in peeks:
                    record(spec, proto, _peek(decode, slot, proto, spec.options))
                _drop_slot(decode, slot)
            workloads[workload] = [started, _now_us(work)]
    return {
        "format": FIXTURE_FORMAT,
        "server_version": version,
        "server_version_num": version_num,
        "relations": relations,
        "types": types,
        "workloads": workloads,
        "captures": captures,
        "messages": messages,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", required=True, help="libpq connection string of a superuser")
    parser.add_argument("--out", required=True, type=Path, help="fixture file to write, e.g. .../pg15.json")
    args = parser.parse_args(argv)
    result = capture(args.dsn, args.out)
    by_proto: defaultdict[int, Counter[str]] = defaultdict(Counter)
    for m in result["messages"]:
        by_proto[m["proto"]][chr(int(m["hex"][:2], 16))] += 1
    print(f"{args.out}: PostgreSQL {result['server_version']}, {args.out.stat().st_size} bytes", file=sys.stderr)
    for proto, counts in sorted(by_proto.items()):
        print(f"  proto {proto}: " + " ".join(f"{k}={v}" for k, v in sorted(counts.items())), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Differential test: PostgreSQL's own subscriber is the oracle for cdcd's row filters.

The oracle is a native ``CREATE SUBSCRIPTION`` on the stack's PostgreSQL 15, in a second database, on
publications with WHERE clauses. The same randomized workloads (hypothesis) run on the oracle's publisher and on
cdcd's source database (the version under test; on 14 cdcd alone filters, as publications have no WHERE there).
After each workload the tables a consumer rebuilds from cdcd's Kafka topics must equal the subscriber's tables.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.conftest import STACK, Database, PgServer, stack_env
from tests.integration.kafka_harness import Run
from tests.integration.test_filters import mirror

pytestmark = [pytest.mark.integration, pytest.mark.every_pg]  # version-sensitive: on every major

TABLES = """
CREATE TABLE t1 (a int, b int, c text, PRIMARY KEY (a, c));
CREATE TABLE t2 (d int PRIMARY KEY, e int, f text);
ALTER TABLE t2 REPLICA IDENTITY FULL;
CREATE TABLE t3 (g int PRIMARY KEY, h int, i text);
CREATE TABLE t4 (id int PRIMARY KEY, n int, big text);
ALTER TABLE t4 ALTER COLUMN big SET STORAGE EXTERNAL;
"""
# Every rule at once: a filter per table, ORed filters (t2), a redundant filter (t3 in p5 without one for
# deletes), an insert-only publication filtering on a non-identity column (h), NULLs, LIKE, arithmetic.
# The workload never changes t3's key: with different filters per operation, an update moving a row that only
# the insert filter let through would leave a stale row that makes PostgreSQL's own subscriber fail later on a
# duplicate key (cdcd publishes the same events; the oracle just could not apply them).
PUBLICATIONS: list[dict[str, Any]] = [
    {"name": "p1", "tables": [{"name": "public.t1", "where": "a > 5 AND c = 'NSW'"}]},
    {"name": "p2", "tables": [{"name": "public.t2", "where": "e > 50 OR f IS NULL"}]},
    {
        "name": "p3",
        "tables": [
            {"name": "public.t2", "where": "d % 3 = 0 AND f LIKE 'x%'"},
            {"name": "public.t3", "where": "g BETWEEN 10 AND 20"},
        ],
    },
    {"name": "p4", "tables": [{"name": "public.t3", "where": "h IS NOT NULL AND h < 100"}], "publish": ["insert"]},
    {"name": "p5", "tables": [{"name": "public.t3"}], "publish": ["delete"]},
    {"name": "p6", "tables": [{"name": "public.t4"}]},
]
COLUMNS = {"t1": ("a", "b", "c"), "t2": ("d", "e", "f"), "t3": ("g", "h", "i"), "t4": ("id", "n", "big")}
KEYS = {"t1": ("a", "c"), "t2": ("d",), "t3": ("g",), "t4": ("id",)}


def create_publication_sql(publication: Any) -> str:
    tables = ", ".join(t["name"] + (f" WHERE ({t['where']})" if "where" in t else "") for t in publication["tables"])
    publish = ", ".join(publication.get("publish", ["insert", "update", "delete", "truncate"]))
    return f"CREATE PUBLICATION {publication['name']} FOR TABLE {tables} WITH (publish = '{publish}')"


@dataclass
class Oracle:
    """A PostgreSQL 15 publisher database and a subscriber database with a native subscription."""

    server: PgServer
    publisher: str
    subscriber: str
    ticks: int = 0

    def execute(self, dbname: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.server.dsn(dbname), autocommit=True) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def caught_up(self, timeout: float = 60) -> None:
        """Wait until the subscriber applied everything committed so far (a marker row, applied in order)."""
        self.ticks += 1
        self.execute(self.publisher, "INSERT INTO tick VALUES (%s)", [self.ticks])
        deadline = time.monotonic() + timeout
        while not self.execute(self.subscriber, "SELECT 1 FROM tick WHERE n = %s", [self.ticks]):
            errors = self.execute(self.subscriber, "SELECT sum(apply_error_count) FROM pg_stat_subscription_stats")
            assert not errors[0][0], "the oracle subscriber failed to apply a change (see the PostgreSQL 15 log)"
            assert time.monotonic() < deadline, "the oracle subscriber did not catch up"
            time.sleep(0.1)

    def tables(self) -> dict[str, set[tuple[Any, ...]]]:
        return {t: set(self.execute(self.subscriber, f"SELECT {', '.join(c)} FROM {t}")) for t, c in COLUMNS.items()}


@pytest.fixture
def oracle() -> Iterator[Oracle]:
    subprocess.run([str(STACK), "up", "pg"], check=True, env={**os.environ, "PG_VERSION": "15"})
    server = PgServer(15, stack_env("15"))
    suffix = uuid.uuid4().hex[:8]
    made = Oracle(server, f"o_pub_{suffix}", f"o_sub_{suffix}")
    with psycopg.connect(server.dsn(), autocommit=True) as admin:
        for name in (made.publisher, made.subscriber):
            admin.execute(f"CREATE DATABASE {name}")
    for name in (made.publisher, made.subscriber):
        made.execute(name, TABLES + "CREATE TABLE tick (n int PRIMARY KEY);")
    for publication in PUBLICATIONS:
        made.execute(made.publisher, create_publication_sql(publication))
    made.execute(made.publisher, "CREATE PUBLICATION ticks FOR TABLE tick")
    slot = f"o_{suffix}"
    # A subscription to the same cluster cannot create its slot itself.
    made.execute(made.publisher, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
    names = ", ".join([p["name"] for p in PUBLICATIONS] + ["ticks"])
    made.execute(
        made.subscriber,
        f"CREATE SUBSCRIPTION s_{suffix} CONNECTION '{server.dsn(made.publisher)}'"
        f" PUBLICATION {names} WITH (create_slot = false, slot_name = '{slot}',"
        " copy_data = false, streaming = on)",
    )
    yield made
    made.execute(made.subscriber, f"ALTER SUBSCRIPTION s_{suffix} DISABLE")
    made.execute(made.subscriber, f"ALTER SUBSCRIPTION s_{suffix} SET (slot_name = NONE)")
    made.execute(made.subscriber, f"DROP SUBSCRIPTION s_{suffix}")
    with psycopg.connect(server.dsn(), autocommit=True) as admin:
        for _ in range(100):
            if not admin.execute(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", [slot]
            ).fetchall():
                break
            time.sleep(0.1)
        admin.execute("SELECT pg_drop_replication_slot(%s)", [slot])
        for name in (made.publisher, made.subscriber):
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


# -- workloads --------------------------------------------------------------------------------------------

small = st.integers(min_value=0, max_value=24)
maybe = st.one_of(st.none(), st.sampled_from([0, 7, 51, 99, 120]))
region = st.sampled_from(["NSW", "QLD", "VIC"])
label = st.one_of(st.none(), st.sampled_from(["x1", "x22", "y3", ""]))

insert = st.one_of(
    st.builds(
        lambda a, b, c: ("INSERT INTO t1 VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", [a, b, c]), small, maybe, region
    ),
    st.builds(
        lambda d, e, f: ("INSERT INTO t2 VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", [d, e, f]), small, maybe, label
    ),
    st.builds(
        lambda g, h, i: ("INSERT INTO t3 VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", [g, h, i]), small, maybe, label
    ),
    # big is stored out of line (3,000+ bytes, EXTERNAL): updates that leave it alone send it as unchanged TOAST
    st.builds(
        lambda k, n, i: (
            "INSERT INTO t4 VALUES (%s, %s, repeat(%s, 1000)) ON CONFLICT DO NOTHING",
            [k, n, f"{i}:{k}|"],
        ),
        small,
        maybe,
        st.sampled_from("abc"),
    ),
)
update = st.one_of(
    # moves rows in and out of t1's filter, and changes its key
    st.builds(
        lambda a, c, na, nc: (
            "UPDATE t1 SET a = %s, c = %s WHERE a = %s AND c = %s AND NOT EXISTS"
            " (SELECT 1 FROM t1 x WHERE x.a = %s AND x.c = %s)",
            [na, nc, a, c, na, nc],
        ),
        small,
        region,
        small,
        region,
    ),
    st.builds(lambda a, b: ("UPDATE t1 SET b = %s WHERE a = %s", [b, a]), small, maybe),
    st.builds(lambda d, e, f: ("UPDATE t2 SET e = %s, f = %s WHERE d = %s", [e, f, d]), small, maybe, label),
    st.builds(lambda g, h: ("UPDATE t3 SET h = %s WHERE g = %s", [h, g]), small, maybe),
    # key changes and updates of t4 that leave its TOASTed column alone
    st.builds(
        lambda k, nk: (
            "UPDATE t4 SET id = %s WHERE id = %s AND NOT EXISTS (SELECT 1 FROM t4 x WHERE x.id = %s)",
            [nk, k, nk],
        ),
        small,
        small,
    ),
    st.builds(lambda k, n: ("UPDATE t4 SET n = %s WHERE id = %s", [n, k]), small, maybe),
    st.builds(lambda k: ("UPDATE t4 SET big = repeat('u', 3000) WHERE id = %s", [k]), small),
)
delete = st.one_of(
    st.builds(lambda a: ("DELETE FROM t1 WHERE a = %s", [a]), small),
    st.builds(lambda d: ("DELETE FROM t2 WHERE d = %s", [d]), small),
    st.builds(lambda g: ("DELETE FROM t3 WHERE g = %s", [g]), small),
    st.builds(lambda k: ("DELETE FROM t4 WHERE id = %s", [k]), small),
)
# many rows at once (%% is a literal % with parameters), and updates that move many rows across the filters' boundaries
bulk = st.one_of(
    st.builds(
        lambda lo, n: (
            "INSERT INTO t1 SELECT x, x * 7 %% 120, (ARRAY['NSW', 'QLD', 'VIC'])[x %% 3 + 1]"
            " FROM generate_series(%s::int, %s::int) x"
            " ON CONFLICT DO NOTHING",
            [lo, lo + n],
        ),
        small,
        small,
    ),
    st.builds(
        lambda lo, n: (
            "INSERT INTO t2 SELECT x, NULLIF(x * 13 %% 110, 0),"
            " CASE WHEN x %% 4 = 0 THEN NULL ELSE 'x' || x END"
            " FROM generate_series(%s::int, %s::int) x"
            " ON CONFLICT DO NOTHING",
            [lo, lo + n],
        ),
        small,
        small,
    ),
    st.builds(
        lambda lo, n: (
            "INSERT INTO t3 SELECT x, NULLIF(x * 11 %% 130, 0), 'i' || x"
            " FROM generate_series(%s::int, %s::int) x"
            " ON CONFLICT DO NOTHING",
            [lo, lo + n],
        ),
        small,
        small,
    ),
    st.builds(lambda k: ("UPDATE t1 SET b = coalesce(b, 0) + 1 WHERE a %% %s = 0", [k]), st.integers(1, 4)),
    st.builds(
        lambda k: (
            "UPDATE t2 SET e = (coalesce(e, 0) + 45) %% 110, f = CASE WHEN f IS NULL THEN 'x0' END WHERE d %% %s = 0",
            [k],
        ),
        st.integers(1, 4),
    ),
    st.builds(
        lambda k: ("UPDATE t3 SET h = NULLIF((coalesce(h, 0) + 60) %% 130, 0) WHERE g %% %s = 0", [k]),
        st.integers(1, 4),
    ),
    st.builds(
        lambda k: (
            "UPDATE t4 SET id = -id, n = coalesce(n, 0) + 1 WHERE id %% %s = 0 AND NOT EXISTS"
            " (SELECT 1 FROM t4 x WHERE x.id = -t4.id)",
            [k],
        ),
        st.integers(1, 4),
    ),
)
truncate: st.SearchStrategy[tuple[str, list[Any]]] = st.sampled_from(
    [("TRUNCATE t1", []), ("TRUNCATE t2", []), ("TRUNCATE t3", []), ("TRUNCATE t4", [])]
)
statement = st.one_of(*[insert] * 6, *[update] * 4, *[bulk] * 3, delete, delete, truncate)  # some truncates


@dataclass(frozen=True)
class Transaction:
    statements: list[tuple[str, list[Any]]]
    rolled_back: list[tuple[str, list[Any]]]  # run inside a savepoint that is rolled back
    padding: int  # rows inserted and deleted again: makes the transaction big enough to be streamed


transaction = st.builds(
    Transaction,
    st.lists(statement, min_size=3, max_size=12),
    st.lists(statement, max_size=4),
    st.sampled_from([0, 0, 0, 1000]),
)


def apply(dsn: str, transactions: list[Transaction]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for txn in transactions:
            with conn.transaction():
                for sql, params in txn.statements[: len(txn.statements) // 2]:
                    conn.execute(sql, params)
                if txn.rolled_back:
                    conn.execute("SAVEPOINT sp")
                    for sql, params in txn.rolled_back:
                        conn.execute(sql, params)
                    conn.execute("ROLLBACK TO SAVEPOINT sp")
                if txn.padding:
                    # outside every filter: dropped by PostgreSQL and by cdcd
                    conn.execute(
                        "INSERT INTO t2 SELECT 1000 + n, 0, repeat('p', 50) FROM generate_series(1, %s) n",
                        [txn.padding],
                    )
                    conn.execute("DELETE FROM t2 WHERE d > 1000")
                for sql, params in txn.statements[len(txn.statements) // 2 :]:
                    conn.execute(sql, params)


@pytest.fixture
def cdcd(db: Database, kafka_env: dict[str, str], tmp_path: Path) -> Iterator[Run]:
    db.execute(TABLES)
    run = Run(db, kafka_env, tmp_path)
    run.start(source={"publications": PUBLICATIONS, "manage_publications": True})
    yield run
    run.close()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=st.lists(transaction, min_size=4, max_size=12))
def test_cdcd_matches_postgresql_subscriber(
    cdcd: Run, db: Database, oracle: Oracle, workload: list[Transaction]
) -> None:
    apply(oracle.server.dsn(oracle.publisher), workload)
    apply(db.dsn(), workload)
    oracle.caught_up()
    cdcd.reread()
    events = cdcd.sync()
    expected = oracle.tables()
    for table in COLUMNS:
        assert mirror(events, f"{cdcd.prefix}.public.{table}") == expected[table], table

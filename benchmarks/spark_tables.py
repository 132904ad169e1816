"""cdcd.spark: a micro-batch that touches several tables, with its tables written one after the other
(``table_threads=1``) and by several threads at once (``--threads``, default 4), in one warm local[2] JVM.

In a scratch database ``multi_<random>`` on the stack's PostgreSQL 15, ``--tables`` tables (default 6) of
``--rows`` rows each (default 20,000) are published by ``cdcd run`` (initial snapshot, then streaming). Each
setting keeps its own checkpoint and mirror; their first micro-batch creates the mirror tables (not timed). Then
``--rounds`` times (default 4), alternating the settings: one transaction updates every 50th row of every table,
cdcd confirms it, and the job applies it with ``availableNow`` for each setting in turn. Prints per setting the
seconds of each micro-batch (query start to end) and of its writes (the job's own log line), and their medians.
The mirrors are then compared with the source tables (count and sum of n). Run from the repository root with the
local stack up (``deploy/local/stack up pg kafka registry spark``)::

    .venv/bin/python benchmarks/spark_tables.py
    .venv/bin/python benchmarks/spark_tables.py --tables 3 --rounds 3
"""

from __future__ import annotations

import argparse
import logging
import re
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from local_stack import stack_env
from spark import cleanup, start_cdcd, wait_confirmed

from cdcd.spark.job import Options, session, start

WRITE = re.compile(r"write ([\d.]+) s\)")


class Writes(logging.Handler):
    """The write seconds of each micro-batch the job logs."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if match := WRITE.search(record.getMessage()):
            self.seconds.append(float(match.group(1)))


def apply(spark: Any, options: Options, writes: Writes) -> tuple[float, float]:
    began = time.monotonic()
    query = start(spark, options)
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"the job failed: {query.exception()}")
    return time.monotonic() - began, writes.seconds[-1]


def check(spark: Any, conn: psycopg.Connection[Any], mirror: Path, tables: int) -> None:
    for i in range(tables):
        source = conn.execute(f"SELECT count(*), sum(n) FROM t{i}").fetchone()
        row = spark.read.format("delta").load(str(mirror / "public" / f"t{i}")).selectExpr("count(*)", "sum(n)").first()
        if source is None or (int(row[0]), int(row[1])) != (int(source[0]), int(source[1])):
            raise SystemExit(f"mirror {mirror} differs from the source for t{i}")


def run(args: argparse.Namespace, env: dict[str, str], name: str, work: Path) -> None:
    with psycopg.connect(env["CDCD_SOURCE__DSN"], autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    dsn = env["CDCD_SOURCE__DSN"] + f" dbname={name}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(args.tables):
            conn.execute(f"CREATE TABLE t{i} (id int PRIMARY KEY, v text, n int)")
            conn.execute(f"INSERT INTO t{i} SELECT g, md5(g::text), g FROM generate_series(1, %s) g", [args.rows])
        conn.execute("CREATE PUBLICATION bench_pub FOR ALL TABLES")
        proc = start_cdcd(env, dsn, name, work)
        try:
            slot = "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active"
            while not conn.execute(slot, [name]).fetchall():
                time.sleep(0.1)
            wait_confirmed(conn, name, proc, work / "cdcd.log")
            writes = Writes()
            logging.getLogger("cdcd.spark").addHandler(writes)
            logging.getLogger("cdcd.spark").setLevel(logging.INFO)
            spark = session("local[2]", env["CDCD_SPARK_JARS"], {"spark.ui.enabled": "false"})
            spark.sparkContext.setLogLevel("WARN")
            settings = {threads: Options(
                bootstrap_servers=env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], topic_prefix=name,
                registry_url=env["CDCD_SCHEMA_REGISTRY__URL"], checkpoint=str(work / f"checkpoint-{threads}"),
                mirror=str(work / f"mirror-{threads}"), available_now=True, table_threads=threads,
            ) for threads in (1, args.threads)}  # fmt: skip
            for options in settings.values():
                apply(spark, options, writes)  # creates the mirror tables
            timed: dict[int, list[tuple[float, float]]] = {threads: [] for threads in settings}
            for round_ in range(args.rounds):
                with conn.transaction():
                    for i in range(args.tables):
                        conn.execute(f"UPDATE t{i} SET n = n + 1 WHERE id %% 50 = %s", [round_ % 50])
                wait_confirmed(conn, name, proc, work / "cdcd.log")
                order = list(settings.items()) if round_ % 2 == 0 else list(reversed(settings.items()))
                for threads, options in order:
                    timed[threads].append(apply(spark, options, writes))
            for threads, runs in timed.items():
                batch, write = [r[0] for r in runs], [r[1] for r in runs]
                print(f"table_threads={threads}: micro-batch {statistics.median(batch):.1f} s median "
                      f"({', '.join(f'{s:.1f}' for s in batch)}), its writes {statistics.median(write):.1f} s "
                      f"({', '.join(f'{s:.1f}' for s in write)})")  # fmt: skip
            for options in settings.values():
                assert options.mirror is not None
                check(spark, conn, Path(options.mirror), args.tables)
            print(f"every mirror equals the source ({args.tables} tables)")
            spark.stop()
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=6)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    env = stack_env()
    name = f"multi_{secrets.token_hex(4)}"
    work = Path(tempfile.mkdtemp(prefix="cdcd-bench-"))
    print(f"{args.tables} tables of {args.rows} rows; every 50th row of each updated per round ({args.rounds} rounds)")
    try:
        run(args, env, name, work)
    finally:
        cleanup(env, name, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

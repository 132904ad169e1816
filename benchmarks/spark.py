"""cdcd.spark: how fast the Spark job applies cdcd's events to a Delta or an Iceberg mirror with local[2], and how
long after the last commit the mirror equals the source.

In a scratch database ``bench_<random>`` on the stack's PostgreSQL 15, with table ``bench (id int primary key,
v text, n int, ts timestamptz)``, ``cdcd run`` (Kafka sink, topic prefix ``bench_<random>``) gets the standard
workload: ``--rows`` inserted rows (default 200,000) in transactions of 1,000 rows, then every fifth row updated
and every tenth deleted, 1,000 rows per transaction (280,000 Kafka messages with the delete tombstones). Once
cdcd confirmed the end of the workload (so Kafka holds every event), two measurements:

* **backlog**: the job with ``availableNow`` on a fresh checkpoint applies every event; events/s = Kafka
  messages read (tombstones included; must equal what Kafka holds) / seconds from the query's start to its end
  (the Spark session is started before, not timed), with the number of micro-batches (one unless
  ``--max-offsets-per-trigger``); then the same backlog again by a new query (new checkpoint, new mirror) in
  the same session: the first run also pays for the JVM's warm-up, the second shows the rate of a warm job;
* **convergence**: the job keeps running (``--trigger-interval``, default 1 s); a last transaction updates
  rows 1..1,000 (900 left after the deletes); the time from its COMMIT until the mirror equals the source
  (count and sum of n and of length(v)) is reported. Then the job stops. The mirror only changes when the job
  commits a new version of its table, so the harness watches the table's log (Delta's ``_delta_log``, Iceberg's
  ``metadata/version-hint.text`` of the Hadoop catalog: a file check every 0.1 s) and computes the summary, in
  the job's JVM, only for a new version: polling it by query every 0.5 s (as it did until 2026-11-26) ran a read
  and an aggregation beside each MERGE, on the same two cores.

``--format iceberg`` writes Iceberg tables (a Hadoop catalog in the run's directory) instead of Delta; given
twice (``--format delta --format iceberg``), or with ``--reference``, each variant runs in a process (a JVM) of
its own, alternating, ``--rounds`` times, and a table of the figures is printed.

The mirror is then compared to the source row for row (exit 1 if it differs). The database, slot, topics and
subjects are removed at the end. Run from the repository root with the local stack up
(``deploy/local/stack up pg kafka registry spark``)::

    .venv/bin/python benchmarks/spark.py              # 200,000 rows (~1.5 min)
    .venv/bin/python benchmarks/spark.py --rows 20000 # quick
    .venv/bin/python benchmarks/spark.py --reference ../other-checkout --rounds 2   # before / after, alternating
    .venv/bin/python benchmarks/spark.py --format delta --format iceberg --rounds 2   # the formats, alternating
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
from local_stack import CDCD_ENV, ROOT, count_messages, delete_topics, stack_env, wait_until, write_config

from cdcd.spark.job import Options, session, start


def workload(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start_id in range(1, rows + 1, 1000):
            end = min(start_id + 999, rows)
            conn.execute(
                "INSERT INTO bench SELECT g, md5(g::text), g %% 1000, now() FROM generate_series(%s::int, %s::int) g",
                [start_id, end],
            )
        for start_id in range(1, rows + 1, 5000):
            conn.execute(
                "UPDATE bench SET n = n + 1 WHERE id %% 5 = 0 AND id BETWEEN %s AND %s", [start_id, start_id + 4999]
            )
        for start_id in range(1, rows + 1, 10000):
            conn.execute("DELETE FROM bench WHERE id %% 10 = 0 AND id BETWEEN %s AND %s", [start_id, start_id + 9999])


SUMMARY = "SELECT count(*), coalesce(sum(n), 0), coalesce(sum(length(v)), 0) FROM bench"


def table_version(path: str, fmt: str) -> int:
    """The newest committed version of the Delta or Iceberg (Hadoop catalog) table at ``path`` (-1 before its
    first commit)."""
    if fmt == "iceberg":
        hint = Path(path) / "metadata" / "version-hint.text"
        try:
            return int(hint.read_text().strip() or -1)
        except FileNotFoundError:
            return -1
    return max((int(p.stem) for p in (Path(path) / "_delta_log").glob("*.json") if p.stem.isdigit()), default=-1)


def read_mirror(spark: Any, path: str, fmt: str) -> Any:
    """The mirror table at ``path``, read at its newest version (Iceberg: by path, not through the job's
    catalog, whose cache could hold an older one)."""
    return spark.read.format(fmt).load(path)


def mirror_summary(spark: Any, path: str, fmt: str) -> tuple[int, int, int]:
    row = read_mirror(spark, path, fmt).selectExpr("count(*)", "coalesce(sum(n), 0)", "coalesce(sum(length(v)), 0)")
    first = row.first()
    return int(first[0]), int(first[1]), int(first[2])


def start_cdcd(env: dict[str, str], dsn: str, name: str, work: Path) -> subprocess.Popen[bytes]:
    path = write_config(work, "cdcd", dsn, name, {
        "sink": {"kind": "kafka"},
        "kafka": {"bootstrap_servers": env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], "topic_prefix": name},
        "schema_registry": {"url": env["CDCD_SCHEMA_REGISTRY__URL"]},
    })  # fmt: skip
    with (work / "cdcd.log").open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "cdcd", "run", "--config", str(path)],
                                stderr=out, stdout=subprocess.DEVNULL, env=CDCD_ENV)  # fmt: skip


def wait_confirmed(conn: psycopg.Connection[Any], slot: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the slot confirmed the server's current WAL position (Kafka holds every event)."""
    lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
    query = "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s"
    wait_until(lambda: conn.execute(query, [lsn, slot]).fetchone()[0], proc, log, 0.2)  # type: ignore[index]


def backlog(spark: Any, options: Options, messages: int, label: str = "backlog") -> None:
    began = time.monotonic()
    query = start(spark, options)
    query.awaitTermination()
    seconds = time.monotonic() - began
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    read = sum(int(p["numInputRows"]) for p in batches)
    if read != messages:
        raise SystemExit(f"the job read {read} messages, Kafka holds {messages}")
    print(f"{label}: {read} Kafka messages applied in {seconds:.1f} s = {read / seconds:,.0f} events/s "
          f"({len(batches)} micro-batches)")  # fmt: skip


def convergence(spark: Any, options: Options, conn: psycopg.Connection[Any], path: str, updates: int) -> None:
    fmt = getattr(options, "format", "delta")
    options.available_now = False
    query = start(spark, options)
    seconds = []
    try:
        time.sleep(3)  # let it reach its steady state: nothing new to do
        for i in range(updates):
            conn.execute(
                "UPDATE bench SET n = n + 7, v = v || 'x' WHERE id BETWEEN %s AND %s", [1000 * i + 1, 1000 * i + 1000]
            )
            committed = time.monotonic()
            row = conn.execute(SUMMARY).fetchone()
            assert row is not None
            expected = (int(row[0]), int(row[1]), int(row[2]))
            seen = -1
            while True:
                version = table_version(path, fmt)
                if version != seen:
                    seen = version
                    if mirror_summary(spark, path, fmt) == expected:
                        break
                if time.monotonic() - committed > 120:
                    raise SystemExit("the mirror did not converge within 120 s")
                time.sleep(0.1)
            seconds.append(time.monotonic() - committed)
        print(f"convergence: mirror equal to the source {statistics.median(seconds):.1f} s after the last COMMIT "
              f"(median of {updates}: {', '.join(f'{s:.1f}' for s in seconds)} s; trigger interval "
              f"{options.trigger_interval})")  # fmt: skip
    finally:
        query.stop()


def compare(spark: Any, conn: psycopg.Connection[Any], path: str, fmt: str) -> None:
    source = sorted(conn.execute("SELECT id, v, n FROM bench").fetchall())
    rows = read_mirror(spark, path, fmt).select("id", "v", "n").collect()
    if source != sorted((r[0], r[1], r[2]) for r in rows):
        raise SystemExit("the mirror differs from the source")
    print(f"mirror equals the source row for row ({len(source)} rows)")


def bench(args: argparse.Namespace, env: dict[str, str], name: str, work: Path) -> None:
    dsn = env["CDCD_SOURCE__DSN"] + f" dbname={name}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench (id int PRIMARY KEY, v text, n int, ts timestamptz)")
        conn.execute("CREATE PUBLICATION bench_pub FOR TABLE bench")
        proc = start_cdcd(env, dsn, name, work)
        try:
            while not conn.execute(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", [name]
            ).fetchall():
                time.sleep(0.1)
            started = time.monotonic()
            workload(dsn, args.rows)
            wait_confirmed(conn, name, proc, work / "cdcd.log")
            print(f"workload: {args.rows} rows in {time.monotonic() - started:.1f} s (cdcd confirmed everything)")
            spark = session("local[2]", env["CDCD_SPARK_JARS"], {"spark.ui.enabled": "false"})
            spark.sparkContext.setLogLevel("WARN")
            fmt = args.format[0]
            iceberg = fmt == "iceberg"  # a Hadoop catalog in the run's directory; the mirror is a namespace
            options = Options(
                bootstrap_servers=env["CDCD_KAFKA__BOOTSTRAP_SERVERS"],
                topic_prefix=name,
                registry_url=env["CDCD_SCHEMA_REGISTRY__URL"],
                checkpoint=str(work / "checkpoint"),
                mirror="mirror" if iceberg else str(work / "mirror"),
                available_now=True,
                max_offsets_per_trigger=args.max_offsets_per_trigger,
                trigger_interval=args.trigger_interval,
                # only when asked: --reference runs this harness with older trees' Options, which have no format
                **({"format": fmt, "catalog": "bench", "warehouse": str(work / "warehouse")} if iceberg else {}),
            )
            messages = count_messages(env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], name + ".public.")
            backlog(spark, options, messages)
            # The same backlog again, by a new query into a new mirror: the first one also paid for the JVM's
            # warm-up (class loading, JIT, Spark's code generation), which a long-running job pays once.
            warm_mirror = "mirror_warm" if iceberg else str(work / "mirror-warm")
            warm = replace(options, checkpoint=str(work / "checkpoint-warm"), mirror=warm_mirror)
            backlog(spark, warm, messages, "backlog, warm JVM")
            path = str((work / "warehouse" if iceberg else work) / "mirror" / "public" / "bench")
            convergence(spark, options, conn, path, args.updates)
            compare(spark, conn, path, fmt)
            spark.stop()
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def cleanup(env: dict[str, str], name: str, work: Path) -> None:
    with psycopg.connect(env["CDCD_SOURCE__DSN"], autocommit=True) as admin:
        admin.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", [name]
        )
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    delete_topics(env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], env["CDCD_SCHEMA_REGISTRY__URL"], name + ".")
    shutil.rmtree(work, ignore_errors=True)


FIGURES = {
    "backlog events/s": re.compile(r"^backlog: .* = ([\d,]+) events/s", re.M),
    "warm backlog events/s": re.compile(r"^backlog, warm JVM: .* = ([\d,]+) events/s", re.M),
    "micro-batches": re.compile(r"^backlog: .*\((\d+) micro-batches\)", re.M),
    "last COMMIT -> mirror equal, s": re.compile(r"^convergence: mirror equal to the source ([\d.]+) s", re.M),
}


def alternate(args: argparse.Namespace) -> int:
    """Run this benchmark once per variant (each format given; with ``--reference``, the reference tree's
    ``cdcd``, the job and the daemon, and this tree's), alternating, each in a process of its own (a cold JVM),
    ``--rounds`` times, and print their figures side by side."""
    own = ["--rows", str(args.rows), "--trigger-interval", args.trigger_interval, "--updates", str(args.updates)]
    if args.max_offsets_per_trigger:
        own += ["--max-offsets-per-trigger", str(args.max_offsets_per_trigger)]
    trees = {"reference": Path(args.reference).resolve(), "this tree": ROOT} if args.reference else {"": ROOT}
    variants = {f"{tree_name} {fmt}".strip(): (tree, fmt) for tree_name, tree in trees.items() for fmt in args.format}
    results: dict[str, list[dict[str, str]]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        for name, (tree, fmt) in variants.items():
            print(f"--- round {round_ + 1}: {name} ({tree}) ---", flush=True)
            env = {**os.environ, "PYTHONPATH": str(tree)}
            command = [sys.executable, str(ROOT / "benchmarks" / "spark.py"), *own, "--format", fmt]
            done = subprocess.run(command, check=False, env=env, capture_output=True, text=True)
            print(done.stdout, end="", flush=True)
            if done.returncode:
                print(done.stderr[-3000:])
                return done.returncode
            results[name].append({k: m.group(1) if (m := r.search(done.stdout)) else "?" for k, r in FIGURES.items()})
    print("\n| variant | " + " | ".join(FIGURES) + " |\n|---|" + "---|" * len(FIGURES))
    for name, runs in results.items():
        for run in runs:
            print(f"| {name} | " + " | ".join(run[k] for k in FIGURES) + " |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--trigger-interval", default="1 second")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    parser.add_argument("--verbose", action="store_true", help="log each micro-batch (events, seconds)")
    parser.add_argument("--updates", type=int, default=3, help="transactions of 900 updates, one after the other")
    parser.add_argument("--format", action="append", choices=["delta", "iceberg"],
                        help="of the mirror (default delta); twice: both, alternating")  # fmt: skip
    parser.add_argument("--reference", help="a checkout of another commit: run its benchmark too, alternating")
    parser.add_argument("--rounds", type=int, default=1, help="with --reference or two formats: runs of each")
    args = parser.parse_args(argv)
    args.format = args.format or ["delta"]
    if args.reference or len(args.format) > 1:
        if args.reference and "iceberg" in args.format:
            parser.error("--reference compares trees with Delta mirrors (older trees have no --format)")
        return alternate(args)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    env = stack_env()
    name = f"bench_{secrets.token_hex(4)}"
    work = Path(tempfile.mkdtemp(prefix="cdcd-spark-bench-"))
    with psycopg.connect(env["CDCD_SOURCE__DSN"], autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        bench(args, env, name, work)
    finally:
        cleanup(env, name, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

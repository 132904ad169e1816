"""Initial snapshot speed: ``cdcd run`` with ``snapshot.mode: initial_only`` against ``COPY bench TO STDOUT``
into /dev/null (psql), on the same table, in one run.

A scratch database ``bench_<random>`` gets ``bench (id int primary key, v text, n int, ts timestamptz, doc
text)`` with ``--rows`` rows (default 1,000,000; doc is NULL except on every 100th row, a 330-byte string).
Then per round, one after the other:

* ``psql -c "COPY bench TO STDOUT" > /dev/null``: PostgreSQL's own export, the floor;
* ``cdcd run`` to JSON lines on /dev/null (``sink.kind: jsonl``): read, parse COPY text, write JSON;
* ``cdcd run`` to Kafka (Avro through the registry, acks=all): the production path; the daemon exits only
  after Kafka acknowledged every row (then the topic must hold ``--rows`` messages, else exit 1);
* an incremental snapshot of the same table to Kafka: a daemon streaming an idle database (``mode: never``)
  gets ``cdcd snapshot --table public.bench``; timed from the request until it logs the table finished (every
  chunk acknowledged), chunks of ``--chunk-size`` rows each read between two watermarks.

Each cdcd run creates its own temporary slot (initial_only) with an exported snapshot, reads the table in key
order (``COPY (SELECT ... ORDER BY id) TO STDOUT``), and exits 0 when done; it is timed from launch to exit, so
Python start-up (~0.5 s) is included. MB/s is the COPY text size of the table per second, for all three.

With ``--parallelism 1,2,4`` the Kafka run is made once per value in each round, one after the other
(``snapshot.parallelism``: the table cut into key ranges read on that many connections), so that their ratios
come from one invocation on the machine as it is then; each such run's CPU is sampled per thread
(``/proc/<pid>/task``): the main thread (encoding, producing), librdkafka's threads, the snapshot readers.

    .venv/bin/python benchmarks/snapshot.py                 # 1,000,000 rows, 2 rounds (~1.5 min)
    .venv/bin/python benchmarks/snapshot.py --rows 100000 --repeat 1   # quick (~10 s)
    .venv/bin/python benchmarks/snapshot.py --parallelism 1,2,4 --repeat 3 --only kafka

Servers as in kafka.py: ``--dsn`` (else the stack's PostgreSQL 15), Kafka and registry from the stack's
environment. The database, topics and registry subjects are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from local_stack import CDCD_ENV, count_messages, delete_topics, stack_env, wait_until, write_config


def create_table(admin_dsn: str, name: str, rows: int) -> str:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    dsn = f"{admin_dsn} dbname={name}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench (id int PRIMARY KEY, v text, n int, ts timestamptz, doc text)")
        conn.execute(
            "INSERT INTO bench SELECT g, 'value ' || g, g %% 1000, '2026-01-01'::timestamptz + g * interval '1 s',"
            " CASE WHEN g %% 100 = 0 THEN repeat(md5(g::text), 10) END FROM generate_series(1, %s) g",
            [rows],
        )
        conn.execute("VACUUM ANALYZE bench")
        conn.execute("CREATE PUBLICATION bench_pub FOR TABLE bench")
    return dsn


def time_copy(dsn: str) -> float:
    """Seconds of psql's COPY to /dev/null."""
    start = time.perf_counter()
    with open(os.devnull, "wb") as devnull:
        subprocess.run(["psql", dsn, "-qc", "COPY bench TO STDOUT"], check=True, stdout=devnull)
    return time.perf_counter() - start


def copy_size(dsn: str) -> int:
    size = 0
    with psycopg.connect(dsn) as conn, conn.cursor().copy("COPY bench TO STDOUT") as copy:
        for data in copy:
            size += len(data)
    return size


def time_cdcd(
    dsn: str, sink: dict[str, Any], extra: dict[str, Any], work: Path
) -> tuple[float, dict[str, Any], dict[str, float]]:
    """Seconds from launch to exit, the "initial snapshot read" log line, and CPU seconds by thread kind."""
    path = write_config(work, "bench", dsn, f"bench_{uuid.uuid4().hex[:8]}", {"sink": sink, **extra})
    log = work / "cdcd.log"
    start = time.perf_counter()
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cdcd", "run", "--config", str(path)],
            stderr=err,
            env=CDCD_ENV,
            stdout=subprocess.DEVNULL,
        )
        cpu = sample_threads(proc)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"cdcd exited {proc.returncode}:\n{log.read_text()[-3000:]}")
    read = next(json.loads(x) for x in log.read_text().splitlines() if '"initial snapshot read"' in x)
    return seconds, read, cpu


def sample_threads(proc: subprocess.Popen[bytes]) -> dict[str, float]:
    """CPU seconds (user + system) of ``proc``'s threads until it exits, by kind: ``main``, ``librdkafka``
    (threads named rdk:*), ``other`` (the snapshot readers, Python's other threads); sampled every 20 ms, the last
    value seen of each thread."""
    tick = os.sysconf("SC_CLK_TCK")
    seen: dict[int, tuple[str, float]] = {}
    while proc.poll() is None:
        for task in Path(f"/proc/{proc.pid}/task").glob("*"):
            try:
                comm = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            kind = "main" if int(task.name) == proc.pid else "librdkafka" if comm.startswith("rdk:") else "other"
            seen[int(task.name)] = (kind, (int(fields[11]) + int(fields[12])) / tick)
        time.sleep(0.02)
    out = {"main": 0.0, "librdkafka": 0.0, "other": 0.0}
    for kind, seconds in seen.values():
        out[kind] += seconds
    return out


def time_incremental(dsn: str, kafka: dict[str, Any], work: Path, chunk_size: int) -> float:
    """Seconds from ``cdcd snapshot --table public.bench`` until the daemon logs the table finished (every
    chunk acknowledged by Kafka), with an idle stream."""
    slot = f"bench_inc_{uuid.uuid4().hex[:8]}"
    snapshot = {"mode": "never", "state_dir": str(work / "state"), "chunk_size": chunk_size}
    path = write_config(work, "incremental", dsn, slot, {"snapshot": snapshot, "sink": {"kind": "kafka"}, **kafka})
    log = work / "incremental.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cdcd", "run", "--config", str(path)],
            stderr=err,
            env=CDCD_ENV,
            stdout=subprocess.DEVNULL,
        )
    try:
        wait_until(lambda: '"streaming"' in log.read_text(), proc, log, 0.02)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "cdcd", "snapshot", "--config", str(path), "--table", "public.bench"],
            check=True,
            env=CDCD_ENV,
            stdout=subprocess.DEVNULL,
        )
        wait_until(lambda: '"table snapshot finished"' in log.read_text(), proc, log, 0.02)
        return time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=10_000, help="snapshot.chunk_size (rows per saved step)")
    parser.add_argument("--dsn", help="admin DSN of the server (default: the stack's PostgreSQL 15)")
    parser.add_argument(
        "--parallelism", default="1", help="snapshot.parallelism of the Kafka run, comma-separated: each per round"
    )
    parser.add_argument("--only", choices=["kafka"], help="kafka: only the COPY floor and the Kafka runs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ways = [int(n) for n in args.parallelism.split(",")]
    env = stack_env()
    admin_dsn = args.dsn or env["CDCD_SOURCE__DSN"]
    bootstrap, registry_url = env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], env["CDCD_SCHEMA_REGISTRY__URL"]
    name = f"bench_{uuid.uuid4().hex[:8]}"
    prefix = f"snapbench_{uuid.uuid4().hex[:6]}"
    results: dict[str, list[float]] = {"COPY TO STDOUT (psql)": []}
    if args.only is None:
        results["cdcd -> JSON lines"] = []
    for n in ways:
        results[kafka_run(n)] = []
    if args.only is None:
        results["cdcd incremental -> Kafka"] = []
    reads: dict[str, list[float]] = {kafka_run(n): [] for n in ways}
    cpus: dict[str, list[dict[str, float]]] = {kafka_run(n): [] for n in ways}
    dsn = f"{admin_dsn} dbname={name}"
    runs = KafkaRuns(dsn, bootstrap, registry_url, prefix, args.rows, results, reads, cpus)
    try:
        print(f"creating {args.rows:,} rows in {name}.bench ...", flush=True)
        dsn = create_table(admin_dsn, name, args.rows)
        size = copy_size(dsn)
        print(
            f"COPY text size {size / 1e6:.1f} MB; chunk_size {args.chunk_size}; {args.repeat} round(s);"
            f" load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores\n"
        )
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            snapshot = {
                "snapshot": {"mode": "initial_only", "state_dir": str(work / "state"), "chunk_size": args.chunk_size}
            }
            for round_ in range(1, args.repeat + 1):
                results["COPY TO STDOUT (psql)"].append(time_copy(dsn))
                if args.only is None:
                    seconds, _, _ = time_cdcd(dsn, {"kind": "jsonl", "path": os.devnull}, snapshot, work)
                    results["cdcd -> JSON lines"].append(seconds)
                if not all(runs.run(n, round_, snapshot["snapshot"], work) for n in ways):
                    return 1
                if args.only is not None:
                    line = ", ".join(f"{k} {v[-1]:.2f} s" for k, v in results.items())
                    print(f"round {round_}: {line}; load {os.getloadavg()[0]:.2f}", flush=True)
                    continue
                kafka = {
                    "kafka": {"bootstrap_servers": bootstrap, "topic_prefix": f"{prefix}_inc{round_}"},
                    "schema_registry": {"url": registry_url},
                }
                results["cdcd incremental -> Kafka"].append(time_incremental(dsn, kafka, work, args.chunk_size))
                messages = count_messages(bootstrap, f"{prefix}_inc{round_}.public.bench")
                if messages != args.rows:
                    print(f"incremental: Kafka holds {messages} messages, expected {args.rows}", file=sys.stderr)
                    return 1
                line = ", ".join(f"{k} {v[-1]:.2f} s" for k, v in results.items())
                print(f"round {round_}: {line}", flush=True)
    finally:
        cleanup(admin_dsn, name, bootstrap, registry_url, prefix)
    report(results, reads, cpus, args.rows, size)
    return 0


@dataclass
class KafkaRuns:
    """The Kafka runs of each round, one per parallelism, and what they measured."""

    dsn: str
    bootstrap: str
    registry_url: str
    prefix: str
    rows: int
    results: dict[str, list[float]]
    reads: dict[str, list[float]]
    cpus: dict[str, list[dict[str, float]]]

    def run(self, parallelism: int, round_: int, snapshot: dict[str, Any], work: Path) -> bool:
        """One run; False when Kafka does not hold one message per row."""
        run = kafka_run(parallelism)
        topics = f"{self.prefix}_{round_}_{parallelism}"
        kafka = {
            "kafka": {"bootstrap_servers": self.bootstrap, "topic_prefix": topics},
            "schema_registry": {"url": self.registry_url},
            "snapshot": {**snapshot, "parallelism": parallelism},
        }
        seconds, read, cpu = time_cdcd(self.dsn, {"kind": "kafka"}, kafka, work)
        self.results[run].append(seconds)
        self.reads[run].append(read["rows_per_s"])
        self.cpus[run].append(cpu)
        messages = count_messages(self.bootstrap, f"{topics}.public.bench")
        if messages != self.rows:
            print(f"{run}: Kafka holds {messages} messages, expected {self.rows}", file=sys.stderr)
        return messages == self.rows


def kafka_run(parallelism: int) -> str:
    return "cdcd -> Kafka" if parallelism == 1 else f"cdcd -> Kafka, {parallelism} conn"


def report(
    results: dict[str, list[float]],
    reads: dict[str, list[float]],
    cpus: dict[str, list[dict[str, float]]],
    rows: int,
    size: int,
) -> None:
    copy_best = min(results["COPY TO STDOUT (psql)"])
    print(f"\n{'':24} {'best s':>8} {'median s':>9} {'rows/s':>10} {'MB/s':>7} {'vs COPY':>8}")
    for name, times in results.items():
        best = min(times)
        print(
            f"{name:24} {best:8.2f} {statistics.median(times):9.2f} {rows / best:10,.0f} {size / 1e6 / best:7.1f}"
            f" {copy_best / best:8.2f}"
        )
    base = results.get("cdcd -> Kafka")
    print()
    for run, values in reads.items():
        times = results[run]
        per_round = ", ".join(f"{b / t:.2f}" for b, t in zip(base or [], times, strict=False))
        ratios = "" if base is None else f"; per round vs 1 connection: {per_round}"
        print(f"{run}: read phase (its 'initial snapshot read' log line) best {max(values):,.0f} rows/s{ratios}")
        for cpu, seconds in zip(cpus[run], times, strict=True):
            shares = ", ".join(f"{kind} {value:.2f}" for kind, value in cpu.items())
            print(f"  CPU s: {shares} (wall {seconds:.2f} s)")


def cleanup(admin_dsn: str, name: str, bootstrap: str, registry_url: str, prefix: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    delete_topics(bootstrap, registry_url, prefix)


if __name__ == "__main__":
    sys.exit(main())

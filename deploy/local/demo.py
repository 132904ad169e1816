"""`make demo`: cdcd on the local stack, on a demo workload, showing committed changes as they flow.

Creates the `cdcd_demo` database (afresh each run), starts `cdcd tail` with config/demo.yaml, runs a small
shop workload (plain transactions, a large transaction that PostgreSQL streams before commit, savepoints
rolled back, a transaction aborted whole, a truncate) and prints what cdcd emits, then stops it with SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
DB = "cdcd_demo"


def stack_env() -> dict[str, str]:
    out = subprocess.run(
        ["bash", "-c", f'eval "$({ROOT}/deploy/local/stack env)" && env -0'], check=True, capture_output=True
    ).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def reset_database(admin_dsn: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", [DB])
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")


def workload(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE SCHEMA shop;"
            "CREATE TABLE shop.customers (id int PRIMARY KEY, name text NOT NULL, city text);"
            "CREATE TABLE shop.orders (id bigserial PRIMARY KEY, customer int, amount numeric(10,2), note text)"
        )
    time.sleep(1.5)  # let cdcd create the publication and start streaming
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO shop.customers VALUES (1, 'Ada', 'London'), (2, 'Grace', 'NYC'), (3, 'Linus', NULL)")
        conn.commit()
        conn.execute("UPDATE shop.customers SET city = 'Helsinki' WHERE id = 3")
        conn.execute("DELETE FROM shop.customers WHERE id = 2")
        conn.commit()
        # Large enough to be streamed with logical_decoding_work_mem = 64kB, with a savepoint rolled back.
        conn.execute("INSERT INTO shop.orders (customer, amount) SELECT 1, g FROM generate_series(1, 2000) g")
        conn.execute("SAVEPOINT oops")
        conn.execute(
            "INSERT INTO shop.orders (customer, amount, note) SELECT 3, g, 'rolled back' FROM generate_series(1, 500) g"
        )
        conn.execute("ROLLBACK TO SAVEPOINT oops")
        conn.execute("SELECT pg_logical_emit_message(true, 'demo', 'batch imported')")
        conn.commit()
        conn.execute(
            "INSERT INTO shop.orders (customer, amount, note) SELECT 2, g, 'aborted' FROM generate_series(1, 800) g"
        )
        conn.rollback()
        conn.execute("TRUNCATE shop.orders")
        conn.commit()


def summarize(lines: list[dict[str, Any]]) -> None:
    print("\n--- first changes emitted by cdcd tail ---")
    for line in lines[:6]:
        print(json.dumps(line))
    print("...")
    counts = Counter(
        (line["op"], f"{line['schema']}.{line['table']}" if line["table"] else "(message)") for line in lines
    )
    print("\n--- committed changes by (op, table) ---")
    for (op, table), count in sorted(counts.items()):
        print(f"  {op}  {table:<16} {count}")
    notes = Counter(str((line.get("after") or {}).get("note")) for line in lines)
    print(f"\nrows emitted from a rolled-back savepoint: {notes['rolled back']}")
    print(f"rows emitted from an aborted transaction: {notes['aborted']}")


def main() -> int:
    env = stack_env()
    reset_database(env["CDCD_SOURCE__DSN"])
    dsn = env["CDCD_SOURCE__DSN"].replace("dbname=cdcd", f"dbname={DB}")
    child_env = {**os.environ, **env, "CDCD_SOURCE__DSN": dsn + " options='-c logical_decoding_work_mem=64kB'"}
    output = Path("/tmp/cdcd-demo.jsonl")
    output.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "cdcd", "tail", "--config", str(ROOT / "config/demo.yaml"), "--output", str(output)]
    print("$", " ".join(cmd[2:]))
    tail = subprocess.Popen(cmd, env=child_env)
    try:
        workload(dsn)
        expected = 3 + 2 + 2000 + 1 + 1  # inserts, update+delete, streamed batch, message, truncate
        deadline = time.monotonic() + 60
        lines: list[dict[str, Any]] = []
        while len(lines) < expected and time.monotonic() < deadline and tail.poll() is None:
            time.sleep(0.2)
            lines = [json.loads(x) for x in output.read_text().splitlines()] if output.exists() else []
        summarize(lines)
        time.sleep(1.5)  # one more status interval so the confirmed LSN is visible
    finally:
        tail.send_signal(signal.SIGTERM)
        code = tail.wait(30)
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn, pg_current_wal_lsn() FROM pg_replication_slots WHERE slot_name = %s", [DB]
        ).fetchone()
    confirmed, wal = row if row else ("?", "?")
    print(f"\ncdcd tail exited {code}; slot {DB} confirmed up to {confirmed} (server WAL at {wal})")
    print(f"all {len(lines)} lines: {output}")
    return 0 if code == 0 and len(lines) >= expected else 1


if __name__ == "__main__":
    sys.exit(main())

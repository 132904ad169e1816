"""The operator view on the real stack: snapshot progress (log lines, metrics, the planner's estimate) and
`cdcd status` against a running daemon, during a snapshot and while streaming, and against a port where
nothing answers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.http import scrape
from tests.integration.conftest import cdcd_env
from tests.integration.kafka_harness import Run
from tests.integration.test_snapshot import BIG, cdcd_snapshot, wait_log, wait_until

pytestmark = pytest.mark.integration

ROWS = 600_000  # read in ~3 s on an idle machine: time for `cdcd status` (a process of its own) to ask meanwhile
BIG_TABLE = ("table", "public.big")


def cdcd_status(*args: str) -> subprocess.CompletedProcess[str]:
    env = cdcd_env()
    return subprocess.run(
        [sys.executable, "-m", "cdcd", "status", *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def ask_both(base: str) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """`cdcd status` and `cdcd status --json` at once (each takes seconds to start on a loaded machine)."""
    with ThreadPoolExecutor(2) as pool:
        human, as_json = pool.map(lambda extra: cdcd_status("--url", base, *extra), [(), ("--json",)])
    return human, as_json


class Sampler(threading.Thread):
    """Scrapes cdcd_snapshot_rows of public.big until stopped, and asks `cdcd status` once while the table is
    being read (on a thread of its own: the scraping goes on meanwhile)."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.rows: list[float] = []
        self.halt = threading.Event()
        self.during: tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]] | None = None
        self.asking: threading.Thread | None = None

    def ask(self) -> None:
        self.during = ask_both(self.base)

    def run(self) -> None:
        while not self.halt.is_set():
            got = scrape(self.base)
            rows = got.get(("cdcd_snapshot_rows", (BIG_TABLE,)))
            if rows is not None:
                self.rows.append(rows)
                if self.asking is None and 0 < rows < ROWS / 2:
                    self.asking = threading.Thread(target=self.ask, daemon=True)
                    self.asking.start()
            time.sleep(0.05)
        if self.asking is not None:
            self.asking.join(timeout=120)


def progress_lines(run: Run, kind: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in run.log.read_text().splitlines() if x.startswith("{")]
    return [x for x in lines if x.get("event") == "snapshot progress" and x["kind"] == kind]


def test_initial_snapshot_progress_and_cdcd_status_during_the_snapshot_while_streaming_and_when_stopped(
    run15: Run,
) -> None:
    run, db = run15, run15.db
    db.execute(BIG.replace("ROWS", str(ROWS)) + "CREATE PUBLICATION cdcd_pub FOR TABLE big")
    db.execute("ANALYZE big")  # as autovacuum would have: the estimate reads pg_class.reltuples
    config = {"state_dir": str(run.tmp_path / "state"), "chunk_size": 1000, "progress_interval_s": 0.25}
    # run.start returns once streaming (the slot is active only then): meanwhile, sample
    starting = threading.Thread(target=lambda: run.start(extra={"snapshot": config}), daemon=True)
    starting.start()
    wait_until(lambda: run.proc is not None, "cdcd run never started")
    base = run.metrics_url()
    sampler = Sampler(base)
    sampler.start()
    finished = wait_log(run, "table snapshot finished")[0]
    sampler.halt.set()
    sampler.join()
    starting.join(timeout=60)
    estimated = check_progress_lines(progress_lines(run, "initial"), finished, ROWS)

    # metrics: rows only rise, up to the final count
    assert len(sampler.rows) >= 3
    assert sampler.rows == sorted(sampler.rows)
    got = scrape(base)
    assert got["cdcd_snapshot_rows", (BIG_TABLE,)] == ROWS
    assert got["cdcd_snapshot_rows_estimated", (BIG_TABLE,)] == estimated
    assert (got["cdcd_snapshot_tables", ()], got["cdcd_snapshot_tables_done", ()]) == (1, 1)

    assert sampler.during is not None, "the snapshot finished before `cdcd status` could be asked"
    check_status_during_the_snapshot(*sampler.during, run.slot, estimated)

    run.wait_confirmed(timeout=180)
    db.execute("INSERT INTO big SELECT g, 1, 'x', NULL FROM generate_series(1000001, 1000500) g")
    run.wait_confirmed()
    check_status_while_streaming(run, base)

    assert run.stop() == 0
    gone = cdcd_status("--url", base)
    assert gone.returncode == 1
    assert f"cdcd status: no answer from {base}" in gone.stderr


def check_progress_lines(lines: list[dict[str, Any]], finished: dict[str, Any], rows: int) -> int:
    """Several lines, rows rising, consistent figures, the estimate within a sane factor of the real count;
    returns the estimate."""
    assert len(lines) >= 3, lines
    counts = [x["rows"] for x in lines]
    assert counts == sorted(counts)
    assert len(set(counts)) == len(counts)
    assert counts[-1] <= rows == finished["rows"]
    estimated: int = lines[0]["estimated_rows"]
    assert rows / 2 < estimated < rows * 2
    assert {x["estimated_rows"] for x in lines} == {estimated}
    assert finished["estimated_rows"] == estimated
    for x in lines:
        assert (x["table"], x["state"]) == ("public.big", "running")
        assert x["rows_per_s"] > 0
        assert x["percent"] == pytest.approx(min(100.0, 100 * x["rows"] / estimated), abs=0.1)
        if x["rows"] < estimated:
            assert x["eta_s"] == pytest.approx((estimated - x["rows"]) / x["rows_per_s"], rel=0.05, abs=0.2)
    return estimated


def check_status_during_the_snapshot(
    human: subprocess.CompletedProcess[str], as_json: subprocess.CompletedProcess[str], slot: str, estimated: int
) -> None:
    assert human.returncode == 0, human.stderr
    assert "state      initial snapshot" in human.stdout
    assert f"slot       {slot}" in human.stdout
    table_line = next(line for line in human.stdout.splitlines() if "public.big" in line)
    for part in ("[#", "ETA ", f"/ ~{estimated:,} rows", "rows/s"):
        assert part in table_line, table_line
    doc = json.loads(as_json.stdout)
    assert doc["state"] == "initial snapshot"
    [table] = doc["snapshot"]["tables"]
    assert (table["table"], table["kind"], table["state"]) == ("public.big", "initial", "running")
    assert 0 < table["rows"] < ROWS
    assert table["estimated_rows"] == estimated
    assert table["eta_s"] > 0


def check_status_while_streaming(run: Run, base: str) -> None:
    """Through the config file: its metrics.listen (here with the port the daemon picked)."""
    config_file = run.tmp_path / "status.yaml"
    config_file.write_text((run.tmp_path / "run.yaml").read_text().replace("127.0.0.1:0", base.split("//")[1]))
    human = cdcd_status("--config", str(config_file))
    assert human.returncode == 0, human.stderr
    for expected in (
        "state      streaming",
        f"slot       {run.slot}",
        f"/{run.db.name} (PostgreSQL 15.",
        "events     ",
        "in flight  0 messages",
        "snapshots  1 of 1 tables done, 0 pending",
    ):
        assert expected in human.stdout, (expected, human.stdout)
    assert "done in" in next(line for line in human.stdout.splitlines() if "public.big" in line)
    doc = json.loads(cdcd_status("--config", str(config_file), "--json").stdout)
    assert (doc["state"], doc["ready"], doc["healthy"]) == ("streaming", True, True)
    assert doc["events_total"] >= ROWS + 500
    assert doc["events_per_s"] > 0
    assert doc["lag_bytes"] >= 0
    assert doc["slot_retained_wal_bytes"] > 0
    assert doc["snapshot"]["tables"][0]["state"] == "done"


def test_incremental_snapshot_progress_shows_in_cdcd_status_while_streaming(run15: Run) -> None:
    run, db = run15, run15.db
    rows = 150_000
    db.execute(BIG.replace("ROWS", str(rows)) + "CREATE PUBLICATION cdcd_pub FOR TABLE big; ANALYZE big")
    config = {"mode": "never", "state_dir": str(run.tmp_path / "state"), "chunk_size": 500, "progress_interval_s": 0.2}
    run.start(extra={"snapshot": config})
    base = run.metrics_url()
    assert cdcd_snapshot(run, "public.big").returncode == 0
    wait_log(run, "snapshotting table")
    human_run, json_run = ask_both(base)  # the snapshot takes several seconds: still running then
    during, human = json.loads(json_run.stdout), human_run.stdout
    finished = wait_log(run, "table snapshot finished")[0]
    assert during["state"] == "streaming"
    [table] = during["snapshot"]["tables"]
    assert (table["table"], table["kind"], table["state"]) == ("public.big", "incremental", "running")
    assert 0 <= table["rows"] < rows
    assert "snapshots  0 of 1 tables done, 1 pending" in human
    assert "ETA " in human
    assert "(incremental)" in human
    lines = progress_lines(run, "incremental")
    assert len(lines) >= 2
    counts = [x["rows"] for x in lines]
    assert counts == sorted(counts)
    assert counts[-1] <= finished["rows"] == rows
    assert rows / 2 < finished["estimated_rows"] < rows * 2
    assert scrape(base)["cdcd_snapshot_rows", (BIG_TABLE,)] == rows
    assert run.stop() == 0


def test_cdcd_status_where_nothing_answers_exits_1_and_a_config_without_a_port_exits_2(tmp_path: Any) -> None:
    with socket.socket() as sock:  # a port nobody listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        result = cdcd_status("--url", f"http://127.0.0.1:{port}")
    assert result.returncode == 1
    assert f"cdcd status: no answer from http://127.0.0.1:{port}: " in result.stderr
    assert "Traceback" not in result.stderr
    config = tmp_path / "c.yaml"
    config.write_text("source: {dsn: 'host=h password=hunter2'}\nmetrics: {listen: ''}\n")
    result = cdcd_status("--config", str(config))
    assert result.returncode == 2
    assert "metrics.listen is empty" in result.stderr

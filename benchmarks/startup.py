"""Start-up: `cdcd run` (Kafka sink) from process launch until its replication slot is active, this tree's cdcd
against a reference cdcd (another checkout's, e.g. the previous commit's), alternating in one invocation; median
of --runs each.

"Active" is ``pg_replication_slots.active_pid`` set, polled every 2 ms from a separate connection: cdcd has
connected, checked, and issued START_REPLICATION. Each run is then stopped with SIGTERM (exit 0 required) and the
next one waits until the slot is free again. One run of each first, not counted, caches their byte code
(PYTHONPYCACHEPREFIX, --pycache) as an installed cdcd has it. Both commands use the same generated config, the
same slot and no workload: the time is cdcd's own. Then one `python -X importtime` run of this tree's cdcd prints
the imports that took longest (cumulative and self) over that run.

    .venv/bin/python benchmarks/startup.py --reference none                # this tree alone, 5 runs
    .venv/bin/python benchmarks/startup.py --reference ../previous/.venv/bin/cdcd --delivery exactly_once

Needs the local stack's PostgreSQL, Kafka and registry. benchmarks/ is on sys.path when run as a script.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import yaml
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from drain import DEFAULT_DSN, PUBLICATION, TABLE, BenchError, _cdcd_command, _connect, _cpu_s, _log_tail
from kafka import DEFAULT_BOOTSTRAP, DEFAULT_REGISTRY
from psycopg import sql
from psycopg.conninfo import make_conninfo


@dataclass
class Variant:
    name: str
    command: list[str]
    commit: str
    seconds: list[float]
    cpu_s: list[float]  # the process's CPU time (all threads) when the slot became active


def _commit_of(command: list[str]) -> str:
    """The git commit of the tree the command's cdcd package is imported from."""
    python = Path(command[0]).parent / "python"
    probe = [str(python) if python.exists() else sys.executable, "-c", "import cdcd, os; print(cdcd.__file__)"]
    found = subprocess.run(probe, capture_output=True, text=True, check=False, cwd=tempfile.gettempdir())
    if found.returncode != 0:
        return "?"
    tree = Path(found.stdout.strip()).parent.parent
    head = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--", "cdcd"], capture_output=True, check=False
    )
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if head.returncode == 0 else "?"


class Startup:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.admin = _connect(args.dsn)
        self.database = f"bench_{secrets.token_hex(4)}"
        self.dsn = make_conninfo(args.dsn, dbname=self.database)
        self.slot = f"bench_startup_{secrets.token_hex(3)}"
        self.prefix = f"cdcdbench-startup-{secrets.token_hex(3)}"
        self.kafka = AdminClient({"bootstrap.servers": args.bootstrap_servers})
        self.created = False

    def setup(self) -> None:
        self.admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
        self.created = True
        with _connect(self.dsn) as conn:
            conn.execute(f"CREATE TABLE {TABLE} (id int PRIMARY KEY, v text NOT NULL, n int, ts timestamptz)")
            conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE}")
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [self.slot])
        if self.args.delivery == "exactly_once":
            topic = NewTopic(f"__cdcd-progress-{self.prefix}", num_partitions=1, config={"cleanup.policy": "compact"})
            try:
                self.kafka.create_topics([topic], operation_timeout=30)[topic.topic].result(timeout=60)
            except KafkaException as exc:
                raise BenchError(f"cannot create {topic.topic}: {exc}") from None

    def config(self) -> Path:
        config = {
            "source": {
                "dsn": self.dsn,
                "slot": self.slot,
                "create_slot": False,
                "publications": [{"name": PUBLICATION, "tables": [{"name": f"public.{TABLE}"}]}],
                "reconnect": {"max_attempts": 1},
            },
            "snapshot": {"state_dir": str(self.workdir / "state")},
            "buffer": {"spill_dir": str(self.workdir / "spill")},
            "log": {"level": "info", "format": "json"},
            "sink": {"kind": "kafka"},
            "kafka": {
                "bootstrap_servers": self.args.bootstrap_servers,
                "topic_prefix": self.prefix,
                "delivery": self.args.delivery,
            },
            "schema_registry": {"url": self.args.registry},
            "metrics": {"listen": "127.0.0.1:0"},
        }
        path = self.workdir / "cdcd.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def _active_pid(self) -> int | None:
        row = self.admin.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", [self.slot])
        found = row.fetchone()
        if found is None:
            raise BenchError(f"slot {self.slot} disappeared")
        return found[0]  # type: ignore[no-any-return]

    def _wait_free(self) -> None:
        deadline = time.monotonic() + 30
        while self._active_pid() is not None:
            if time.monotonic() > deadline:
                raise BenchError(f"slot {self.slot} still active 30 s after cdcd stopped")
            time.sleep(0.01)

    def environment(self) -> dict[str, str]:
        """cdcd's environment: no CDCD_* overrides, and byte code cached as an installed cdcd has it (in a directory
        of this benchmark's, not in the trees: PYTHONDONTWRITEBYTECODE, if set, would compile every module at every
        launch)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CDCD_") and k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(self.args.pycache)
        return env

    def run_once(self, command: list[str], config: Path, log: Path) -> tuple[float, float]:
        """Seconds from launch until the slot is active, and the CPU seconds the process had used by then; the
        process is then stopped with SIGTERM."""
        self._wait_free()
        env = self.environment()
        with log.open("wb") as err:
            start = time.perf_counter()
            proc = subprocess.Popen(
                [*command, "run", "--config", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
            )
        try:
            while self._active_pid() is None:
                if proc.poll() is not None:
                    raise BenchError(f"cdcd exited {proc.returncode} before streaming:\n{_log_tail(log)}")
                if time.perf_counter() - start > 60:
                    raise BenchError(f"cdcd not streaming after 60 s:\n{_log_tail(log)}")
                time.sleep(0.002)
            seconds = time.perf_counter() - start
            cpu = _cpu_s(proc.pid) or math.nan
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
            if code != 0:
                raise BenchError(f"cdcd exited {code} after SIGTERM:\n{_log_tail(log)}")
            return seconds, cpu
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def import_profile(self, config: Path, top: int) -> None:
        """One run under ``python -X importtime``: the imports completed before the slot became active."""
        log = self.workdir / "importtime.log"
        command = [sys.executable, "-X", "importtime", "-m", "cdcd"]
        self.run_once(command, config, log)
        rows = []
        for line in log.read_text(errors="replace").splitlines():
            match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
            if match:
                self_us, cumulative_us, indent, name = match.groups()
                rows.append((int(self_us), int(cumulative_us), len(indent) // 2, name))
        total = sum(r[0] for r in rows)
        print(
            f"\npython -X importtime of this tree's `cdcd run` (whole run): {total / 1e6:.3f} s in {len(rows)} modules"
        )
        print(f"top {top} top-level imports by cumulative time:")
        for _self, cumulative_us, _depth, name in sorted((r for r in rows if r[2] == 0), key=lambda r: -r[1])[:top]:
            print(f"  {cumulative_us / 1000:8.1f} ms  {name}")
        print(f"top {top} modules by self time:")
        for self_us, _cumulative, _depth, name in sorted(rows, key=lambda r: -r[0])[:top]:
            print(f"  {self_us / 1000:8.1f} ms  {name}")

    def cleanup(self) -> list[str]:
        problems = []
        try:
            self.admin.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", [self.slot]
            )
            if self.created:
                self.admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(self.database)))
        except psycopg.Error as exc:
            problems.append(f"cannot drop {self.slot} / {self.database}: {exc}")
        topics = [t for t in self.kafka.list_topics(timeout=10).topics if self.prefix in t]
        if topics:
            for topic, future in self.kafka.delete_topics(topics, operation_timeout=30).items():
                try:
                    future.result(timeout=60)
                except KafkaException as exc:
                    problems.append(f"cannot delete topic {topic}: {exc}")
        self.admin.close()
        return problems


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each command, alternating (default 5)")
    parser.add_argument(
        "--reference",
        required=True,
        help="the cdcd command to compare with (another checkout's, e.g. ../previous/.venv/bin/cdcd; 'none': this "
        "tree's alone)",
    )
    parser.add_argument("--delivery", choices=["at_least_once", "exactly_once"], default="at_least_once")
    parser.add_argument("--dsn", default=os.environ.get("CDCD_SOURCE__DSN", DEFAULT_DSN))
    parser.add_argument(
        "--bootstrap-servers", default=os.environ.get("CDCD_KAFKA__BOOTSTRAP_SERVERS", DEFAULT_BOOTSTRAP)
    )
    parser.add_argument("--registry", default=os.environ.get("CDCD_SCHEMA_REGISTRY__URL", DEFAULT_REGISTRY))
    parser.add_argument(
        "--pycache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "cdcd-bench-startup-pycache",
        help="PYTHONPYCACHEPREFIX of the runs (kept between invocations)",
    )
    parser.add_argument("--top", type=int, default=12, help="import offenders to print (0: no import profile)")
    parser.add_argument("--keep-workdir", action="store_true")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="cdcd-bench-startup-"))
    bench = Startup(args, workdir)
    failed = False
    try:
        bench.setup()
        config = bench.config()
        this = _cdcd_command()
        variants = [Variant("this tree", this, _commit_of(this), [], [])]
        if args.reference != "none":
            reference = [args.reference]
            variants.append(Variant("reference", reference, _commit_of(reference), [], []))
        for variant in variants:  # not counted: compiles and caches the byte code if it is not cached yet
            bench.run_once(variant.command, config, workdir / f"warm-up-{variant.name[:4]}.log")
        for run in range(1, args.runs + 1):
            for variant in variants if run % 2 else variants[::-1]:
                seconds, cpu = bench.run_once(variant.command, config, workdir / f"run-{run}-{variant.name[:4]}.log")
                variant.seconds.append(seconds)
                variant.cpu_s.append(cpu)
                print(f"run {run}: {variant.name}: {seconds:.3f} s ({cpu:.2f} CPU s)", flush=True)
        print(
            f"\nlaunch -> slot active, `cdcd run` {args.delivery}, median of {args.runs} (min .. max), CPU s by then:"
        )
        for variant in variants:
            s = variant.seconds
            print(
                f"  {variant.name:10} {statistics.median(s):.3f} s ({min(s):.3f} .. {max(s):.3f}), "
                f"{statistics.median(variant.cpu_s):.3f} CPU s  {' '.join(variant.command)} @ {variant.commit}"
            )
        if len(variants) == 2:
            ours, theirs = variants
            ratio = statistics.median(ours.seconds) / statistics.median(theirs.seconds)
            cpu_ratio = statistics.median(ours.cpu_s) / statistics.median(theirs.cpu_s)
            print(f"  ratio this tree / reference: {ratio:.2f} (CPU s: {cpu_ratio:.2f})")
        if args.top:
            bench.import_profile(config, args.top)
    except (BenchError, psycopg.Error, OSError, subprocess.SubprocessError) as exc:
        print(f"startup: FAILED: {exc}", file=sys.stderr)
        failed = True
    finally:
        for problem in bench.cleanup():
            print(f"startup: cleanup: {problem}", file=sys.stderr)
            failed = True
        if args.keep_workdir or failed:
            print(f"startup: configs and logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

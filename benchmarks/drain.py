"""Drain one large transaction: ``cdcd tail --output /dev/null`` against PostgreSQL's own ``pg_recvlogical``.

What it measures: the wall time each consumer needs to receive a single transaction of ``--rows`` inserted
rows (default 1,000,000) from a logical replication slot, with the same pgoutput options (the server's
highest proto_version, publication_names, streaming on from PostgreSQL 14, messages on), the same
``logical_decoding_work_mem`` and the same WAL: both slots are created before the insert.

* pg_recvlogical: ``--start --endpos <commit end LSN> -f /dev/null``; timed from launch until it exits.
* cdcd: ``cdcd tail --config F --output /dev/null`` on an existing slot (create_slot false); timed from
  launch until the slot's confirmed_flush_lsn reaches the commit's end LSN, then stopped with SIGTERM
  (it must exit 0). Its status interval (``--status-interval``, default 0.1 s) bounds the measuring error.

They run one after the other (they would compete for the cores otherwise), pg_recvlogical first; with
``--repeat N`` every round has its own pair of slots (all made before the one insert) and the best and the
median are reported. Peak RSS: ``ru_maxrss`` from wait4 for both, and VmHWM of cdcd read just before
SIGTERM. ``pg_stat_replication_slots`` tells whether the transaction was streamed or spilled by the server.

Everything happens in a scratch database (``bench_<random>``) that is dropped, with its slots, at the end.

Run from the repository root, with the local stack's PostgreSQL up (``deploy/local/stack up pg``)::

    .venv/bin/python benchmarks/drain.py                       # 1,000,000 rows, 3 rounds (~1 min)
    .venv/bin/python benchmarks/drain.py --rows 100000 --repeat 1   # quick
    .venv/bin/python benchmarks/drain.py --repeat 3 --work-mem 256MB
    .venv/bin/python benchmarks/drain.py --profile /tmp/cdcd.prof   # plus one cdcd run under cProfile

The server comes from ``--dsn``, else ``CDCD_SOURCE__DSN``, else the stack's PostgreSQL 15 (port 5415).
CDCD_* variables are removed from cdcd's environment so they cannot override the generated config.
Exits 1 if a consumer fails or times out, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pstats
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdcd.lsn import format_lsn, parse_lsn
from cdcd.source.protocol import protocol_version_for

DEFAULT_DSN = "host=127.0.0.1 port=5415 dbname=cdcd user=postgres password=postgres"
TABLE = "bench"
PUBLICATION = "bench_pub"
POLL_S = 0.02


class BenchError(RuntimeError):
    """A consumer failed, or the setup did."""


@dataclass
class Run:
    consumer: str
    round: int
    slot: str
    seconds: float  # launch -> done (pg_recvlogical exited; cdcd's slot confirmed the end LSN)
    startup_s: float | None  # launch -> the slot is active (connected, START_REPLICATION issued)
    sent_s: float | None  # launch -> the walsender has decoded and sent up to the end LSN (its sent_lsn)
    cpu_s: float  # the consumer's user + system CPU (wait4)
    walsender_cpu_s: float | None  # the server process decoding for it (/proc, sampled; approximate)
    peak_rss_kib: int
    stats: dict[str, Any] = field(default_factory=dict)  # the slot's pg_stat_replication_slots row
    profiled: bool = False


@dataclass
class Exit:
    code: int
    maxrss_kib: int
    cpu_s: float


@dataclass
class Watch:
    seconds: float = 0.0
    startup_s: float | None = None
    sent_s: float | None = None
    walsender_cpu_s: float | None = None
    exited: Exit | None = None


@dataclass
class Setup:
    dsn: str  # the scratch database, with the logical_decoding_work_mem option if any
    proto: int
    streaming: bool
    end_lsn: int
    rows: int
    wal_bytes: int
    insert_s: float
    end_lsn_source: str


def _connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def _scalar(conn: psycopg.Connection[Any], query: str, params: list[Any] | None = None) -> Any:
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise BenchError(f"no row from {query}")
    return row[0]


def _safe_dsn(dsn: str) -> str:
    parts = conninfo_to_dict(dsn)
    return " ".join(f"{k}={v}" for k, v in parts.items() if k != "password")


def _find_pg_recvlogical(explicit: str | None, major: int) -> str:
    candidates = [explicit] if explicit else []
    candidates += [f"/usr/lib/postgresql/{major}/bin/pg_recvlogical"]
    if os.environ.get("CDCD_PG_BIN"):
        candidates.append(str(Path(os.environ["CDCD_PG_BIN"]) / "pg_recvlogical"))
    candidates.append(shutil.which("pg_recvlogical") or "")
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise BenchError("pg_recvlogical not found (use --pg-recvlogical PATH)")


def _cdcd_command() -> list[str]:
    script = Path(sys.executable).parent / "cdcd"
    return [str(script)] if script.exists() else [sys.executable, "-m", "cdcd"]


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> Exit | None:
    """Reap the child with wait4 within ``timeout`` seconds (0: just check)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return Exit(proc.returncode, usage.ru_maxrss, usage.ru_utime + usage.ru_stime)
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S / 2)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        _wait_exit(proc, 10)


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of any process on this machine, from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Bench:
    def __init__(self, args: argparse.Namespace, admin: psycopg.Connection[Any], workdir: Path) -> None:
        self.args = args
        self.admin = admin
        self.workdir = workdir
        self.database = f"bench_{secrets.token_hex(4)}"
        self.slots: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.db_created = False
        base = args.dsn
        options = f"-c logical_decoding_work_mem={args.work_mem}" if args.work_mem else None
        self.scratch_dsn = make_conninfo(base, dbname=self.database)
        self.consumer_dsn = make_conninfo(self.scratch_dsn, options=options) if options else self.scratch_dsn

    # -- setup ------------------------------------------------------------------------------

    def create_scratch(self) -> psycopg.Connection[Any]:
        """Create the scratch database with the benchmark table and publication; return a connection to it."""
        self.admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
        self.db_created = True
        conn = _connect(self.scratch_dsn)
        conn.execute(f"CREATE TABLE {TABLE} (id int PRIMARY KEY, v text NOT NULL, n int, ts timestamptz)")
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE}")
        return conn

    def prepare(self, slot_names: list[str]) -> Setup:
        with self.create_scratch() as conn:
            walinspect = self._walinspect(conn)
            for slot in slot_names:  # before the insert: every slot sees the same WAL
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
                self.slots.append(slot)
            server_version = conn.info.server_version
            proto = protocol_version_for(server_version)
            start = time.perf_counter()
            conn.execute("SET synchronous_commit = on")  # the commit is flushed: walsenders can send it at once
            wal_before = parse_lsn(str(_scalar(conn, "SELECT pg_current_wal_insert_lsn()")))
            with conn.transaction():
                xid = int(_scalar(conn, "SELECT txid_current()"))
                conn.execute(
                    f"INSERT INTO {TABLE} SELECT g, md5(g::text), g %% 1000, "
                    "timestamptz '2024-05-03 12:00+00' + g * interval '1 second' FROM generate_series(1, %s) g",
                    [self.args.rows],
                )
                before_commit = str(_scalar(conn, "SELECT pg_current_wal_insert_lsn()"))
            insert_s = time.perf_counter() - start
            after = str(_scalar(conn, "SELECT pg_current_wal_flush_lsn()"))
            end_lsn, source = parse_lsn(after), "pg_current_wal_flush_lsn() after COMMIT (upper bound)"
            if walinspect:
                row = conn.execute(
                    "SELECT end_lsn FROM pg_get_wal_records_info(%s, %s) WHERE resource_manager = 'Transaction' "
                    "AND record_type LIKE 'COMMIT%%' AND xid::text::bigint = %s",
                    [before_commit, after, xid & 0xFFFFFFFF],
                ).fetchone()
                if row is not None:
                    end_lsn, source = parse_lsn(str(row[0])), "commit record end (pg_walinspect)"
        return Setup(
            self.consumer_dsn,
            proto,
            server_version >= 140000,
            end_lsn,
            self.args.rows,
            end_lsn - wal_before,
            insert_s,
            source,
        )

    @staticmethod
    def _walinspect(conn: psycopg.Connection[Any]) -> bool:
        if conn.info.server_version < 150000:
            return False
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        except psycopg.Error:
            return False
        return True

    # -- consumers --------------------------------------------------------------------------

    def _slot(self, slot: str) -> tuple[int | None, int | None]:
        """(active_pid, confirmed_flush_lsn) of a slot."""
        row = self.admin.execute(
            "SELECT active_pid, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [slot]
        ).fetchone()
        if row is None:
            raise BenchError(f"slot {slot} disappeared")
        return row[0], parse_lsn(row[1]) if row[1] else None

    def _slot_stats(self, slot: str) -> dict[str, Any]:
        for _ in range(20):  # the walsender reports its decoding stats as it exits; give it a moment
            cur = self.admin.execute("SELECT * FROM pg_stat_replication_slots WHERE slot_name = %s", [slot])
            row = cur.fetchone()
            if row is not None and cur.description is not None:
                stats = {d.name: v for d, v in zip(cur.description, row, strict=True)}
                if stats.get("total_txns") or stats.get("stream_txns"):
                    return stats
            time.sleep(0.05)
        return {}

    def drop_slot(self, slot: str) -> None:
        if slot in self.slots:
            self.admin.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", [slot]
            )
            self.slots.remove(slot)

    def _launch(self, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with log.open("wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
        self.procs.append(proc)
        return proc

    def _watch(self, proc: subprocess.Popen[bytes], slot: str, setup: Setup, start: float, log: Path) -> Watch:
        """Poll until the child exits or the slot is confirmed to the end LSN, whichever comes first."""
        watch = Watch()
        deadline = start + self.args.timeout
        while True:
            watch.exited = _wait_exit(proc, 0)
            now = time.perf_counter()
            if watch.exited is not None:
                watch.seconds = now - start
                return watch
            row = self.admin.execute(
                "SELECT s.active_pid, s.confirmed_flush_lsn::text, r.sent_lsn::text FROM pg_replication_slots s "
                "LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = %s",
                [slot],
            ).fetchone()
            if row is None:
                raise BenchError(f"slot {slot} disappeared")
            active, confirmed, sent = row
            if active is not None:
                watch.startup_s = watch.startup_s or now - start
                watch.walsender_cpu_s = _cpu_s(active) or watch.walsender_cpu_s
            if watch.sent_s is None and sent and parse_lsn(sent) >= setup.end_lsn:
                watch.sent_s = now - start
            if confirmed and parse_lsn(confirmed) >= setup.end_lsn:
                watch.seconds = now - start
                watch.sent_s = watch.sent_s or watch.seconds
                return watch
            if now > deadline:
                _kill(proc)
                raise BenchError(
                    f"{slot}: no confirmation of the end LSN in {self.args.timeout:.0f} s:\n{_log_tail(log)}"
                )
            time.sleep(POLL_S)

    def run_pg_recvlogical(self, setup: Setup, slot: str, round_no: int) -> Run:
        options = [f"proto_version={setup.proto}", f"publication_names={PUBLICATION}"]
        if setup.streaming:
            options += ["streaming=on", "messages=true"]
        cmd = [
            self.args.pg_recvlogical,
            "-d",
            setup.dsn,
            "--slot",
            slot,
            "--start",
            "--no-loop",
            "--endpos",
            format_lsn(setup.end_lsn),
            "-f",
            "/dev/null",
        ]
        for option in options:
            cmd += ["-o", option]
        log = self.workdir / f"{slot}.log"
        start = time.perf_counter()
        proc = self._launch(cmd, log)
        watch = self._watch(proc, slot, setup, start, log)
        exited = watch.exited or _wait_exit(proc, 60)  # it exits right after confirming the end LSN
        seconds = time.perf_counter() - start if watch.exited is None else watch.seconds
        if exited is None:
            _kill(proc)
            raise BenchError(f"pg_recvlogical did not exit at its end position:\n{_log_tail(log)}")
        if exited.code != 0:
            raise BenchError(f"pg_recvlogical exited {exited.code}:\n{_log_tail(log)}")
        confirmed = self._slot(slot)[1]
        if confirmed is None or confirmed < setup.end_lsn:
            raise BenchError(f"pg_recvlogical exited, but the slot is confirmed only to {format_lsn(confirmed or 0)}")
        return Run(
            "pg_recvlogical",
            round_no,
            slot,
            seconds,
            watch.startup_s,
            watch.sent_s or seconds,
            exited.cpu_s,
            watch.walsender_cpu_s,
            exited.maxrss_kib,
            self._slot_stats(slot),
        )

    def cdcd_command(
        self, setup: Setup, slot: str, args: list[str], profile: Path | None, **sections: Any
    ) -> list[str]:
        """Write the slot's cdcd config (the common source/buffer/log sections plus ``sections``) and return the
        command ``cdcd <args> --config <it>``, under cProfile when ``profile`` is given."""
        config = {
            "source": {
                "dsn": setup.dsn,
                "slot": slot,
                "create_slot": False,
                "publications": [{"name": PUBLICATION, "tables": [{"name": f"public.{TABLE}"}]}],
                "protocol_version": setup.proto,
                "streaming": "on",
                "status_interval_s": self.args.status_interval,
                "reconnect": {"max_attempts": 1},
            },
            "buffer": {"memory_limit": self.args.memory_limit, "spill_dir": str(self.workdir / f"spill-{slot}")},
            "snapshot": {"state_dir": str(self.workdir / f"state-{slot}")},
            "log": {"level": "info", "format": "json"},
            **sections,
        }
        config_path = self.workdir / f"{slot}.yaml"
        config_path.write_text(yaml.safe_dump(config))
        cdcd_args = [args[0], "--config", str(config_path), *args[1:]]
        if profile is not None:
            return [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "cdcd", *cdcd_args]
        return _cdcd_command() + cdcd_args

    @staticmethod
    def stop_cdcd(proc: subprocess.Popen[bytes], log: Path) -> Exit:
        """SIGTERM, which must end cdcd with exit 0 within 60 s."""
        proc.send_signal(signal.SIGTERM)
        exited = _wait_exit(proc, 60)
        if exited is None:
            _kill(proc)
            raise BenchError(f"cdcd did not stop within 60 s of SIGTERM:\n{_log_tail(log)}")
        if exited.code != 0:
            raise BenchError(f"cdcd exited {exited.code} after SIGTERM:\n{_log_tail(log)}")
        return exited

    def run_cdcd(self, setup: Setup, slot: str, round_no: int, profile: Path | None = None) -> Run:
        cmd = self.cdcd_command(setup, slot, ["tail", "--output", "/dev/null"], profile)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CDCD_")}
        log = self.workdir / f"{slot}.log"
        start = time.perf_counter()
        proc = self._launch(cmd, log, env)
        watch = self._watch(proc, slot, setup, start, log)
        if watch.exited is not None:
            raise BenchError(f"cdcd exited {watch.exited.code} before reaching the end LSN:\n{_log_tail(log)}")
        hwm = _vm_hwm_kib(proc.pid)
        exited = self.stop_cdcd(proc, log)
        return Run(
            "cdcd",
            round_no,
            slot,
            watch.seconds,
            watch.startup_s,
            watch.sent_s,
            exited.cpu_s,
            watch.walsender_cpu_s,
            max(hwm, exited.maxrss_kib),
            self._slot_stats(slot),
            profiled=profile is not None,
        )

    # -- cleanup ----------------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        problems = []
        for proc in self.procs:
            _kill(proc)
        for slot in list(self.slots):
            try:
                self.drop_slot(slot)
            except psycopg.Error as exc:
                problems.append(f"cannot drop slot {slot}: {exc}")
        if self.db_created:
            try:
                self.admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.database))
                )
            except psycopg.Error as exc:
                problems.append(f"cannot drop database {self.database}: {exc}")
        return problems


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """The options every cdcd-vs-pg_recvlogical benchmark takes."""
    parser.add_argument(
        "--dsn",
        default=os.environ.get("CDCD_SOURCE__DSN", DEFAULT_DSN),
        help="an existing database of the server (default: $CDCD_SOURCE__DSN, else the stack's PG 15)",
    )
    parser.add_argument(
        "--work-mem", default=None, help="logical_decoding_work_mem for both consumers, e.g. 64MB (default: server's)"
    )
    parser.add_argument("--memory-limit", default="64MiB", help="cdcd buffer.memory_limit (default 64MiB)")
    parser.add_argument("--status-interval", type=float, default=0.1, help="cdcd status_interval_s (default 0.1)")
    parser.add_argument("--pg-recvlogical", default=None, help="path (default: the server major's, or PATH)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per consumer run (default 600)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep configs and logs (printed path)")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the one transaction (default 1000000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds, each on its own slots (default 3)")
    add_common_args(parser)
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="also run cdcd once under cProfile, write its stats here",
    )
    args = parser.parse_args(argv)
    if args.rows < 1 or args.repeat < 1:
        parser.error("--rows and --repeat must be >= 1")
    return args


def _mib(kib: int) -> str:
    return f"{kib / 1024:.0f} MiB"


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "?" if value is None else format(value, spec)


def _report(setup: Setup, runs: list[Run], header: list[str]) -> None:
    print()
    for line in header:
        print(line)
    print(
        f"transaction: {setup.rows:,} rows, {setup.wal_bytes / 2**20:.0f} MiB of WAL, inserted in "
        f"{setup.insert_s:.1f} s; end LSN {format_lsn(setup.end_lsn)} ({setup.end_lsn_source})"
    )
    print()
    title = (
        f"{'consumer':<15} {'round':>5} {'seconds':>8} {'rows/s':>9} {'startup':>7} {'sent':>6} {'CPU s':>6} "
        f"{'wsnd CPU':>8} {'peak RSS':>8} {'streamed':>8} {'spilled':>7} {'MiB sent':>8}"
    )
    print(title)
    print("-" * len(title))
    for run in runs:
        s = run.stats
        name = run.consumer + (" (cProfile)" if run.profiled else "")
        print(
            f"{name:<15} {run.round:>5} {run.seconds:>8.2f} {setup.rows / run.seconds:>9,.0f} "
            f"{_fmt(run.startup_s):>7} {_fmt(run.sent_s):>6} {run.cpu_s:>6.2f} {_fmt(run.walsender_cpu_s):>8} "
            f"{_mib(run.peak_rss_kib):>8} {s.get('stream_txns', '?')!s:>8} {s.get('spill_txns', '?')!s:>7} "
            f"{(s.get('total_bytes') or 0) / 2**20:>8.0f}"
        )
    print("seconds: launch until done (pg_recvlogical exited at --endpos; cdcd's slot confirmed the end LSN)")
    print(
        "startup: launch until the slot is active; sent: until the walsender's sent_lsn reached the end LSN "
        "(it has decoded everything; the rest is the consumer catching up)"
    )
    print(
        "CPU s: the consumer's user+sys; wsnd CPU: the server walsender's (sampled every "
        f"{POLL_S * 1000:.0f} ms, approximate); streamed/spilled/MiB sent: pg_stat_replication_slots"
    )
    print()
    timed = [r for r in runs if not r.profiled]
    summary: dict[str, tuple[float, float]] = {}
    for consumer in ("pg_recvlogical", "cdcd"):
        mine = [r for r in timed if r.consumer == consumer]
        if mine:
            times = [r.seconds for r in mine]
            summary[consumer] = (min(times), statistics.median(times))
            print(
                f"{consumer:<15} best {min(times):6.2f} s ({setup.rows / min(times):>9,.0f} rows/s)   "
                f"median {statistics.median(times):6.2f} s   peak RSS {_mib(max(r.peak_rss_kib for r in mine))}  "
                f"CPU {statistics.median(r.cpu_s for r in mine):.2f} s (median)"
            )
    if len(summary) == 2:
        (rb, rm), (cb, cm) = summary["pg_recvlogical"], summary["cdcd"]
        print(
            f"ratio cdcd / pg_recvlogical (time): best {cb / rb:.2f}x, median {cm / rm:.2f}x "
            f"(cdcd's throughput is {rb / cb:.0%} of pg_recvlogical's)"
        )


def _print_profile(path: Path) -> None:
    print(f"\ncdcd under cProfile: top 15 functions by tottime ({path})")
    stats = pstats.Stats(str(path), stream=sys.stdout)
    stats.strip_dirs().sort_stats("tottime").print_stats(15)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        admin = _connect(args.dsn)
    except psycopg.OperationalError as exc:
        print(f"drain: cannot connect to {_safe_dsn(args.dsn)}: {exc}", file=sys.stderr)
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="cdcd-bench-drain-"))
    bench = Bench(args, admin, workdir)
    runs: list[Run] = []
    failed = False
    try:
        major = admin.info.server_version // 10000
        args.pg_recvlogical = _find_pg_recvlogical(args.pg_recvlogical, major)
        recv_version = subprocess.run([args.pg_recvlogical, "--version"], capture_output=True, text=True, check=True)
        server = str(_scalar(admin, "SELECT version()"))
        work_mem = str(_scalar(admin, "SHOW logical_decoding_work_mem"))
        suffix = secrets.token_hex(3)
        rounds = [(f"bench_recv_{i}_{suffix}", f"bench_cdcd_{i}_{suffix}") for i in range(1, args.repeat + 1)]
        profile_slot = f"bench_prof_{suffix}" if args.profile else None
        slots = [s for pair in rounds for s in pair] + ([profile_slot] if profile_slot else [])
        print(f"server: {server}")
        print(f"creating database {bench.database}, {len(slots)} slots, inserting {args.rows:,} rows ...")
        setup = bench.prepare(slots)
        header = [
            f"server: {server}",
            f"pg_recvlogical: {args.pg_recvlogical} ({recv_version.stdout.strip()}); cdcd: {' '.join(_cdcd_command())}",
            f"pgoutput options (both): proto_version={setup.proto}, publication_names={PUBLICATION}"
            + (", streaming=on, messages=true" if setup.streaming else ""),
            "logical_decoding_work_mem: "
            + (f"{args.work_mem} (set in both DSNs)" if args.work_mem else f"{work_mem} (server default)"),
            f"cdcd: buffer.memory_limit {args.memory_limit}, status_interval_s {args.status_interval}; "
            f"machine: {os.cpu_count()} CPUs",
        ]
        for round_no, (recv_slot, cdcd_slot) in enumerate(rounds, start=1):
            print(f"round {round_no}: pg_recvlogical ...", flush=True)
            runs.append(bench.run_pg_recvlogical(setup, recv_slot, round_no))
            bench.drop_slot(recv_slot)
            print(f"round {round_no}: pg_recvlogical {runs[-1].seconds:.2f} s; cdcd ...", flush=True)
            runs.append(bench.run_cdcd(setup, cdcd_slot, round_no))
            bench.drop_slot(cdcd_slot)
            print(f"round {round_no}: cdcd {runs[-1].seconds:.2f} s", flush=True)
        if args.profile and profile_slot:
            print("profiled cdcd run ...", flush=True)
            runs.append(bench.run_cdcd(setup, profile_slot, 0, profile=args.profile))
            bench.drop_slot(profile_slot)
        _report(setup, runs, header)
        if args.profile:
            _print_profile(args.profile)
    except (BenchError, psycopg.Error, OSError, subprocess.CalledProcessError) as exc:
        print(f"drain: FAILED: {exc}", file=sys.stderr)
        failed = True
    finally:
        failed = finish(bench, admin, workdir, "drain", failed=failed, keep=args.keep_workdir)
    return 1 if failed else 0


def finish(bench: Bench, admin: psycopg.Connection[Any], workdir: Path, name: str, *, failed: bool, keep: bool) -> bool:
    """Drop what the run created; keep its configs and logs when asked or when it failed. Returns ``failed``."""
    for problem in bench.cleanup():
        print(f"{name}: cleanup: {problem}", file=sys.stderr)
        failed = True
    admin.close()
    if keep or failed:
        print(f"{name}: configs and logs kept in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())

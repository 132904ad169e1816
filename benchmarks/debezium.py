"""cdcd against Debezium's PostgreSQL connector: the same WAL to the same Kafka, every message in Kafka.

The workloads of kafka.py (whose machinery this imports), in one scratch database (``bench_<random>``, table
``bench`` and publication ``bench_pub`` as in drain.py):

* ``large``: one transaction of ``--rows`` inserted rows (default 1,000,000);
* ``small``: ``--small-txns`` one-row transactions (default 100,000).

For each workload every logical slot (pgoutput) is created first, then the workload runs, so all slots see the
same WAL. Then, one after the other (they would compete for the two cores otherwise), per round and per
``--variants`` entry:

* ``plain``: cdcd with ``kafka.transaction_topic: false`` against Debezium's defaults (no transaction metadata);
* ``tx``: cdcd with its transaction topic against Debezium with ``provide.transaction.metadata=true``; both then
  write a BEGIN and an END event per transaction to ``<prefix>.transaction``;
* ``dbz``: ``tx`` with cdcd in ``kafka.envelope: debezium`` (Debezium's types and layouts): the same messages
  as Debezium's, byte for byte but the differences docs/kafka.md lists.

Debezium 3.6 runs in a Kafka Connect standalone worker of its own per run (``deploy/local/stack
debezium-standalone``: a fresh JVM, its own offsets file in the run's directory, REST on a free loopback port),
with the connector's properties from ``stack debezium-connector config``: pgoutput, the run's pre-created slot,
the bench publication, ``snapshot.mode=no_data`` (so it streams from the slot), keys and values in Avro through
Apicurio's converter in the Confluent wire format (content ids) on the same registry as cdcd. It is timed from
the worker's launch until the high watermarks of its topics hold the expected number of messages (one per row,
plus two per transaction for ``tx``). cdcd is run as kafka.py runs it: from launch until its slot confirms the
workload's end LSN, which it does only once Kafka acknowledged every message (then its topics are counted too).

Reported per run: seconds, rows/s, start-up (launch until the slot is active: for Debezium a JVM, Connect's
plugin discovery and the connector's start), the consumer's CPU (cdcd: wait4; Debezium: /proc when the count was
reached) and the part of it spent before the slot was active, the walsender's and broker's CPU, peak RSS (VmHWM
sampled every 20 ms), the messages in Kafka. The summary gives the ratio cdcd rows/s / Debezium rows/s, from
launch and excluding start-up (seconds after the slot became active).

Run from the repository root, with the stack up (``deploy/local/stack up pg kafka registry debezium``; the
benchmark uses the component's jars, not its shared worker)::

    .venv/bin/python benchmarks/debezium.py            # 1,000,000 rows + 100,000 transactions, 1 round (~5 min)
    .venv/bin/python benchmarks/debezium.py --quick    # 100,000 rows + 10,000 transactions (~2 min)
    .venv/bin/python benchmarks/debezium.py --variants plain --workloads large --repeat 2

Servers: as kafka.py (``--dsn``, ``--bootstrap-servers``, ``--registry``); Debezium gets the DSN's host, port,
user and password, and the registry's ``/apis/registry/v2``; its worker always uses the stack's broker. The
database, slots, topics and registry subjects are removed at the end, also on failure. Exits 1 if a run fails or a
message count is wrong, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaException, TopicPartition
from drain import (
    POLL_S,
    PUBLICATION,
    BenchError,
    Run,
    _connect,
    _cpu_s,
    _fmt,
    _kill,
    _log_tail,
    _mib,
    _safe_dsn,
    _vm_hwm_kib,
    _wait_exit,
    add_common_args,
    finish,
)
from kafka import DEFAULT_BOOTSTRAP, DEFAULT_REGISTRY, WORKLOADS, KafkaBench, Result, Workload
from psycopg.conninfo import conninfo_to_dict

from cdcd.lsn import parse_lsn

STACK = Path(__file__).resolve().parents[1] / "deploy" / "local" / "stack"
# variant -> (cdcd's kafka.py variant, Debezium's extra connector properties)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "plain": ("notx", []),
    "tx": ("tx", ["provide.transaction.metadata=true"]),
    "dbz": ("txdbz", ["provide.transaction.metadata=true"]),  # cdcd in Debezium's envelope (kafka.envelope)
}
COUNT_INTERVAL_S = 0.1  # how often Debezium's topics are counted while it runs


@dataclass
class Progress:
    """What the watch loop of a Debezium run saw."""

    seconds: float = 0.0
    startup_s: float | None = None
    startup_cpu_s: float | None = None
    sent_s: float | None = None
    walsender_cpu_s: float | None = None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DebeziumBench(KafkaBench):
    def __init__(self, args: argparse.Namespace, admin: psycopg.Connection[Any], workdir: Path) -> None:
        # KafkaBench knows cdcd's variants (notx, tx) by kafka.py's names
        super().__init__(
            argparse.Namespace(**{**vars(args), "variants": [VARIANTS[v][0] for v in args.variants]}), admin, workdir
        )

    def connector_properties(self, name: str, slot: str, extra: list[str]) -> str:
        """The connector's properties from the stack, pointed at the benchmark's server, slot and registry."""
        dsn = conninfo_to_dict(self.scratch_dsn)
        registry = self.args.registry.split("/apis/")[0] + "/apis/registry/v2"
        overrides = [
            f"database.hostname={dsn.get('host', '127.0.0.1')}",
            f"database.port={dsn.get('port', 5432)}",
            f"database.user={dsn.get('user', 'postgres')}",
            f"database.password={dsn.get('password', '')}",
            *(f"{side}.converter.apicurio.registry.url={registry}" for side in ("key", "value")),
            *extra,
        ]
        cmd = [str(STACK), "debezium-connector", "config", name, self.database, slot, PUBLICATION, *overrides]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout

    def run_debezium(self, workload: Workload, variant: str, slot: str, round_no: int) -> tuple[Result, float]:
        """One Debezium run on ``slot``; returns its result and the CPU it spent before its slot was active."""
        prefix = f"dbzbench-{self.database.removeprefix('bench_')}-{workload.name}-{variant}-{round_no}"
        self.prefixes.append(prefix)
        transactions = "provide.transaction.metadata=true" in VARIANTS[variant][1]
        expected = {"public.bench": workload.setup.rows} | ({"transaction": 2 * workload.txns} if transactions else {})
        rundir = self.workdir / f"dbz-{slot}"
        rundir.mkdir()
        props = rundir / "connector.properties"
        props.write_text(self.connector_properties(prefix, slot, VARIANTS[variant][1]))
        log = self.workdir / f"{slot}.log"
        cmd = [str(STACK), "debezium-standalone", str(rundir), str(_free_port()), str(props)]
        broker_before = _cpu_s(self.broker_pid) if self.broker_pid else None
        start = time.perf_counter()
        proc = self._launch(cmd, log, {k: v for k, v in os.environ.items() if not k.startswith("CDCD_")})
        progress = self._watch_debezium(proc, slot, prefix, expected, workload=workload, start=start, log=log)
        cpu = _cpu_s(proc.pid) or 0.0
        hwm = _vm_hwm_kib(proc.pid)
        broker_after = _cpu_s(self.broker_pid) if self.broker_pid else None
        messages = self.count_messages(prefix)
        self._stop_debezium(proc, log)
        self.delete_topics(prefix)
        run = Run(
            f"debezium {variant}",
            round_no,
            slot,
            progress.seconds,
            progress.startup_s,
            progress.sent_s,
            cpu,
            progress.walsender_cpu_s,
            max(hwm, self.peak_rss_kib(proc.pid)),
        )
        broker_cpu = None if broker_before is None or broker_after is None else broker_after - broker_before
        result = Result(workload.name, f"debezium {variant}", run, broker_cpu, messages, expected)
        return result, progress.startup_cpu_s or 0.0

    def _watch_debezium(
        self,
        proc: subprocess.Popen[bytes],
        slot: str,
        prefix: str,
        expected: dict[str, int],
        *,
        workload: Workload,
        start: float,
        log: Path,
    ) -> Progress:
        """Poll the slot and the topics' high watermarks until they hold ``expected`` messages."""
        progress = Progress()
        counter = Consumer(
            {
                "bootstrap.servers": self.args.bootstrap_servers,
                "group.id": f"{prefix}-watch",
                "topic.metadata.refresh.interval.ms": 500,
            }
        )
        next_count, counts = 0.0, {}
        try:
            while True:
                exited = _wait_exit(proc, 0)
                if exited is not None:
                    raise BenchError(f"the Connect worker exited {exited.code}:\n{_log_tail(log)}")
                now = time.perf_counter()
                self._sample_slot(proc, slot, workload, progress, now - start)
                if now >= next_count:
                    next_count = now + COUNT_INTERVAL_S
                    counts = _high_watermarks(counter, prefix, expected)
                    if counts == expected:
                        progress.seconds = time.perf_counter() - start
                        progress.sent_s = progress.sent_s or progress.seconds
                        return progress
                if now - start > self.args.timeout:
                    _kill(proc)
                    raise BenchError(
                        f"{slot}: Debezium's topics hold {counts} after {self.args.timeout:.0f} s, "
                        f"expected {expected}:\n{_log_tail(log)}"
                    )
                time.sleep(POLL_S)
        finally:
            counter.close()

    def _sample_slot(
        self, proc: subprocess.Popen[bytes], slot: str, workload: Workload, progress: Progress, elapsed: float
    ) -> None:
        row = self.admin.execute(
            "SELECT s.active_pid, r.sent_lsn::text FROM pg_replication_slots s "
            "LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = %s",
            [slot],
        ).fetchone()
        if row is None:
            raise BenchError(f"slot {slot} disappeared")
        active, sent = row
        if active is not None:
            if progress.startup_s is None:
                progress.startup_s, progress.startup_cpu_s = elapsed, _cpu_s(proc.pid)
            progress.walsender_cpu_s = _cpu_s(active) or progress.walsender_cpu_s
        if progress.sent_s is None and sent and parse_lsn(sent) >= workload.setup.end_lsn:
            progress.sent_s = elapsed

    @staticmethod
    def _stop_debezium(proc: subprocess.Popen[bytes], log: Path) -> None:
        """SIGTERM: Connect stops its connector and exits (143, by the JVM's signal handling, or 0)."""
        proc.send_signal(signal.SIGTERM)
        exited = _wait_exit(proc, 60)
        if exited is None:
            _kill(proc)
            raise BenchError(f"the Connect worker did not stop within 60 s of SIGTERM:\n{_log_tail(log)}")
        if exited.code not in (0, 143):
            raise BenchError(f"the Connect worker exited {exited.code} after SIGTERM:\n{_log_tail(log)}")


def _high_watermarks(consumer: Consumer, prefix: str, expected: dict[str, int]) -> dict[str, int]:
    """Messages in each expected topic (one partition each: the connector creates them so); 0 while absent.
    Fresh metadata first: a watermark query on a topic librdkafka last saw missing keeps failing until its
    metadata is refreshed."""
    topics = consumer.list_topics(timeout=10).topics
    counts = {}
    for suffix in expected:
        name = f"{prefix}.{suffix}"
        counts[suffix] = 0
        if name in topics and topics[name].error is None and 0 in topics[name].partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(name, 0), timeout=10)
            counts[suffix] = high - low
    return counts


@dataclass
class Pair:
    """One round of one variant on one workload: cdcd's result and Debezium's."""

    workload: Workload
    variant: str
    cdcd: Result
    debezium: Result
    debezium_startup_cpu_s: float


def _run_workload(bench: DebeziumBench, name: str, args: argparse.Namespace) -> list[Pair]:
    suffix = bench.database.removeprefix("bench_")
    plan = [
        (i, v, f"db_{suffix}_{name}_{v}_{i}_cdcd", f"db_{suffix}_{name}_{v}_{i}_dbz")
        for i in range(1, args.repeat + 1)
        for v in args.variants
    ]
    slots = [slot for _, _, cdcd, dbz in plan for slot in (cdcd, dbz)]
    print(f"{name}: {len(slots)} slots, generating ...", flush=True)
    workload = bench.generate(name, slots)
    print(f"{name}: generated in {workload.setup.insert_s:.1f} s", flush=True)
    pairs = []
    for round_no, variant, cdcd_slot, dbz_slot in plan:
        debezium, startup_cpu = bench.run_debezium(workload, variant, dbz_slot, round_no)
        bench.drop_slot(dbz_slot)
        print(f"{name} round {round_no}: debezium {variant} {debezium.run.seconds:.2f} s", flush=True)
        cdcd = bench.run_cdcd_kafka(workload, VARIANTS[variant][0], cdcd_slot, round_no)
        bench.drop_slot(cdcd_slot)
        print(f"{name} round {round_no}: cdcd {variant} {cdcd.run.seconds:.2f} s", flush=True)
        pairs.append(Pair(workload, variant, cdcd, debezium, startup_cpu))
    return pairs


def _count_text(result: Result) -> str:
    total = sum((result.messages or {}).values())
    return f"{total:,}" + ("" if result.messages == result.expected else " WRONG")


def _report_runs(pairs: list[Pair]) -> None:
    title = (
        f"{'workload':<8} {'consumer':<15} {'round':>5} {'seconds':>8} {'rows/s':>9} {'startup':>7} "
        f"{'sent':>6} {'CPU s':>6} {'of it startup':>13} {'wsnd CPU':>8} {'Kafka CPU':>9} {'peak RSS':>8} "
        f"{'messages':>10}"
    )
    print(title)
    print("-" * len(title))
    for pair in pairs:
        rows = pair.workload.setup.rows
        for result, startup_cpu in ((pair.debezium, pair.debezium_startup_cpu_s), (pair.cdcd, None)):
            run = result.run
            label = ("debezium " if result is pair.debezium else "cdcd ") + pair.variant
            print(
                f"{pair.workload.name:<8} {label:<15} {run.round:>5} {run.seconds:>8.2f} {rows / run.seconds:>9,.0f} "
                f"{_fmt(run.startup_s):>7} {_fmt(run.sent_s):>6} {run.cpu_s:>6.2f} {_fmt(startup_cpu):>13} "
                f"{_fmt(run.walsender_cpu_s):>8} {_fmt(result.broker_cpu_s):>9} {_mib(run.peak_rss_kib):>8} "
                f"{_count_text(result):>10}"
            )
        for result in (pair.debezium, pair.cdcd):
            if result.messages != result.expected:
                print(
                    f"  {result.run.consumer} round {result.run.round}: Kafka holds {result.messages}, "
                    f"expected {result.expected}"
                )


def _streaming_s(run: Run) -> float:
    """Seconds after the slot became active: the run without its start-up."""
    return run.seconds - (run.startup_s or 0.0)


def _report_summary(pairs: list[Pair]) -> None:
    print()
    print(
        "rows/s: best round; ratio = cdcd rows/s / Debezium rows/s, from launch and excluding start-up "
        "(launch until the slot was active); CPU and RSS: the largest of the rounds"
    )
    head = (
        f"{'workload':<8} {'variant':<7} {'cdcd rows/s':>11} {'dbz rows/s':>10} {'ratio':>6} "
        f"{'excl. startup':>13} {'cdcd CPU s':>10} {'dbz CPU s':>9} {'cdcd RSS':>9} {'dbz RSS':>9}"
    )
    print(head)
    print("-" * len(head))
    seen: dict[tuple[str, str], list[Pair]] = {}
    for pair in pairs:
        seen.setdefault((pair.workload.name, pair.variant), []).append(pair)
    for (workload, variant), group in seen.items():
        rows = group[0].workload.setup.rows
        cdcd = min(p.cdcd.run.seconds for p in group)
        dbz = min(p.debezium.run.seconds for p in group)
        cdcd_stream = min(_streaming_s(p.cdcd.run) for p in group)
        dbz_stream = min(_streaming_s(p.debezium.run) for p in group)
        print(
            f"{workload:<8} {variant:<7} {rows / cdcd:>11,.0f} {rows / dbz:>10,.0f} {dbz / cdcd:>6.2f} "
            f"{dbz_stream / cdcd_stream:>13.2f} {max(p.cdcd.run.cpu_s for p in group):>10.2f} "
            f"{max(p.debezium.run.cpu_s for p in group):>9.2f} "
            f"{_mib(max(p.cdcd.run.peak_rss_kib for p in group)):>9} "
            f"{_mib(max(p.debezium.run.peak_rss_kib for p in group)):>9}"
        )
    if any(len(g) > 1 for g in seen.values()):
        for (workload, variant), group in seen.items():
            ratios = [p.debezium.run.seconds / p.cdcd.run.seconds for p in group]
            print(
                f"  {workload} {variant}: ratio per round {', '.join(f'{r:.2f}' for r in ratios)} "
                f"(median {statistics.median(ratios):.2f})"
            )


def _print_header(bench: DebeziumBench, args: argparse.Namespace) -> None:
    try:
        bench.kafka.list_topics(timeout=10)
    except KafkaException as exc:
        raise BenchError(f"Kafka at {args.bootstrap_servers} does not answer: {exc}") from None
    versions = subprocess.run([str(STACK), "status"], capture_output=True, text=True, check=False).stdout
    dbz = next((line for line in versions.splitlines() if line.startswith("debezium")), "debezium: ?")
    print(f"server: {bench.admin.execute('SELECT version()').fetchone()}")
    print(f"Kafka: {args.bootstrap_servers} (broker pid {bench.broker_pid or 'not found'}); registry: {args.registry}")
    print(f"stack: {' '.join(dbz.split()[3:]) or dbz} (a worker of its own per run, heap -Xmx2g)")
    print(
        f"cdcd: buffer.memory_limit {args.memory_limit}, status_interval_s {args.status_interval}; variants "
        f"{', '.join(args.variants)}; machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=None, help="rows in the large transaction (default 1000000)")
    parser.add_argument("--small-txns", type=int, default=None, help="one-row transactions (default 100000)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds, each on its own slots (default 1)")
    parser.add_argument("--quick", action="store_true", help="100000 rows, 10000 small transactions")
    parser.add_argument("--workloads", default="large,small", help="comma-separated: large, small (default both)")
    parser.add_argument("--variants", default="plain,tx", help="plain, tx, dbz (default plain,tx)")
    add_common_args(parser)
    parser.add_argument(
        "--bootstrap-servers", default=os.environ.get("CDCD_KAFKA__BOOTSTRAP_SERVERS", DEFAULT_BOOTSTRAP)
    )
    parser.add_argument(
        "--registry",
        default=os.environ.get("CDCD_SCHEMA_REGISTRY__URL", DEFAULT_REGISTRY),
        help="its Confluent API URL; Debezium's converter uses its /apis/registry/v2",
    )
    args = parser.parse_args(argv)
    sizes = (100_000, 10_000) if args.quick else (1_000_000, 100_000)
    args.rows = args.rows or sizes[0]
    args.small_txns = args.small_txns or sizes[1]
    args.txn_rows = 1
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not args.workloads or not set(args.workloads) <= set(WORKLOADS):
        parser.error(f"--workloads: choose from {', '.join(WORKLOADS)}")
    if not args.variants or not set(args.variants) <= set(VARIANTS):
        parser.error(f"--variants: choose from {', '.join(VARIANTS)}")
    if min(args.rows, args.small_txns, args.repeat) < 1:
        parser.error("--rows, --small-txns and --repeat must be >= 1")
    if args.work_mem:
        parser.error("--work-mem: Debezium's replication connection cannot set it; both use the server's")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        admin = _connect(args.dsn)
    except psycopg.OperationalError as exc:
        print(f"debezium: cannot connect to {_safe_dsn(args.dsn)}: {exc}", file=sys.stderr)
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="cdcd-bench-debezium-"))
    bench = DebeziumBench(args, admin, workdir)
    failed = False
    try:
        _print_header(bench, args)
        bench.create_database()
        pairs: list[Pair] = []
        for name in args.workloads:
            pairs += _run_workload(bench, name, args)
        print()
        _report_runs(pairs)
        _report_summary(pairs)
        failed = any(r.messages != r.expected for p in pairs for r in (p.cdcd, p.debezium))
        if failed:
            print("debezium: FAILED: a message count in Kafka is wrong (see above)", file=sys.stderr)
    except (BenchError, psycopg.Error, OSError, subprocess.CalledProcessError, KafkaException) as exc:
        print(f"debezium: FAILED: {exc}", file=sys.stderr)
        failed = True
    finally:
        with contextlib.suppress(Exception):
            print(f"load at the end: {os.getloadavg()[0]:.2f}")
        failed = finish(bench, admin, workdir, "debezium", failed=failed, keep=args.keep_workdir)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

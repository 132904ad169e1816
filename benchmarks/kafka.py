"""``cdcd run`` to Kafka, every message acknowledged, against ``pg_recvlogical`` draining the same WAL.

Two workloads, one after the other, in one scratch database (``bench_<random>``, table and publication as in
drain.py):

* ``large``: one transaction of ``--rows`` inserted rows (default 1,000,000);
* ``small``: ``--small-txns`` transactions (default 100,000) of ``--txn-rows`` inserted rows each (default 1),
  committed one by one by a PL/pgSQL procedure (COMMIT inside the loop); generating them is not timed.

For each workload every logical slot (pgoutput) is created first, then the workload runs, so all slots see
the same WAL; the end position is the end LSN of the workload's last commit record (pg_walinspect, PG 15+).
Then, one after the other (they would compete for the two cores otherwise), per round:

* ``pg_recvlogical --start --endpos <end> -f /dev/null`` with the same pgoutput options as cdcd (as drain.py);
  timed from launch until it exits;
* ``cdcd run --config F`` with ``sink.kind: kafka``, a topic prefix of its own, ``create_slot: false``,
  one run per ``--variants`` entry (default ``tx,notx``): ``kafka.transaction_topic`` true (``tx``) or false
  (``notx``); timed from launch until the slot's confirmed_flush_lsn reaches the end LSN. cdcd confirms a
  transaction only once Kafka acknowledged every message of it (acks=all, idempotent producer), so that is
  "every message acknowledged". Then the messages in Kafka are counted (the sum of high - low watermarks of
  the topics under the run's prefix: the table topic must hold one per published row, the transaction topic two
  per transaction with a published row; exit 1 if not), cdcd gets SIGTERM (it must exit 0) and its topics and
  registry subjects are deleted.

``txeo`` and ``notxeo`` (not run by default) are ``tx`` and ``notx`` with ``kafka.delivery: exactly_once``:
Kafka transactions, the progress topic written in each; their messages are counted by a read_committed
consumer (commit markers take offsets too).

``txdbz`` and ``notxdbz`` (not run by default) are ``tx`` and ``notx`` with ``kafka.envelope: debezium``:
Debezium's types and layouts (the envelope written in Python around the compiled row writers).

``txl20`` and ``txeoc50`` (not run by default) are ``tx`` with the producer's former ``linger.ms`` 20 and
``txeo`` with the former ``kafka.exactly_once.commit_interval_ms`` 50: what the latency tuning costs in throughput.

``txpy`` and ``notxpy`` (not run by default) are ``tx`` and ``notx`` with ``CDCD_IMPL=python``: the
Python reference alone, without the compiled row stage (cdcd._native), for a same-invocation comparison.

``mask`` (not run by default) is ``tx`` with a hash mask on the bench table's text column ``v`` (``columns:
{tables: {public.bench: {mask: {v: hash}}}}``, its salt in an environment variable): the cost of masking, in
the compiled row stage; its ratio to ``tx`` is in the summary with the filter variants' (target >= 0.9).

Row-filter variants (not run by default), each the ``tx`` configuration plus a 3-clause row filter on the
bench table in cdcd's config (``source.publications: [{name: bench_pub, tables: [{name: public.bench, where:
...}], publish: [insert]}]``; ``publish: [insert]`` because a publication that publishes UPDATE or DELETE may
filter only on replica identity columns). ``source.manage_publications`` stays off, so the server's
publication keeps no WHERE, the server sends every row and cdcd evaluates the filter on each (the path every
server version takes):

* ``filter``: ``id >= 0 AND v IS NOT NULL AND n < 2000000000`` passes every row: the pure cost of evaluation;
* ``filter50``: ``id >= 0 AND v IS NOT NULL AND n < 500`` (n = id % 1000) passes half the rows; with one-row
  transactions half the transactions drop out whole (no BEGIN/END for them, as in Debezium).

Their expected message counts are PostgreSQL's own (``SELECT count(*), count(DISTINCT xmin) FROM bench WHERE
<filter>`` after the workload), and cdcd's "stopped" log line must count the rest as filtered, none
unevaluated (else exit 1). Their rows/s are the workload's rows, published or not, per second; the summary
adds the ratio filter variant rows/s / tx rows/s per workload (best round, and of the medians).

Reported: seconds, rows/s, the ratio cdcd rows/s / pg_recvlogical rows/s (target >= 0.8; and, beside it, the
same without either consumer's start-up: the streaming pace), cdcd's CPU per row, peak RSS (VmHWM
sampled from /proc every 20 ms while the consumer runs, and for cdcd just before SIGTERM: wait4's ru_maxrss
would include this script's own RSS, which Linux carries over fork and exec), the consumers' CPU (wait4), the
walsender's and the Kafka broker's CPU during the run (sampled from /proc; the broker is the local process
whose command line holds ``kafka.Kafka``).

Run from the repository root, with the local stack up (``deploy/local/stack up pg kafka registry``)::

    .venv/bin/python benchmarks/kafka.py             # 1,000,000 rows + 100,000 transactions, 2 rounds (~2.5 min)
    .venv/bin/python benchmarks/kafka.py --quick     # 100,000 rows + 10,000 transactions, 1 round (~15 s)
    .venv/bin/python benchmarks/kafka.py --repeat 3 --variants tx --workloads small
    .venv/bin/python benchmarks/kafka.py --variants tx,filter,filter50 --repeat 3   # row filter on vs off (~4 min)
    .venv/bin/python benchmarks/kafka.py --profile   # plus one cdcd run per workload under cProfile (+1.5 min)

It imports drain.py's helpers (``import drain``: benchmarks/ is on sys.path when run as a script).

Servers: ``--dsn`` (else ``CDCD_SOURCE__DSN``, else the stack's PostgreSQL 15), ``--bootstrap-servers`` (else
``CDCD_KAFKA__BOOTSTRAP_SERVERS``, else 127.0.0.1:19092), ``--registry`` (else ``CDCD_SCHEMA_REGISTRY__URL``,
else the stack's Apicurio). CDCD_* variables are removed from cdcd's environment. The database, the slots,
the topics and the registry subjects are removed at the end, also on failure. Exits 1 if a consumer fails,
a message count is wrong or cleanup fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from drain import (
    POLL_S,
    PUBLICATION,
    TABLE,
    Bench,
    BenchError,
    Run,
    Setup,
    _cdcd_command,
    _connect,
    _cpu_s,
    _find_pg_recvlogical,
    _fmt,
    _log_tail,
    _mib,
    _safe_dsn,
    _scalar,
    _vm_hwm_kib,
    add_common_args,
    finish,
)
from psycopg import sql

from cdcd.lsn import format_lsn, parse_lsn
from cdcd.source.protocol import protocol_version_for

DEFAULT_BOOTSTRAP = "127.0.0.1:19092"
DEFAULT_REGISTRY = "http://127.0.0.1:18081/apis/ccompat/v7"
WORKLOADS = ("large", "small")
# Row filters over the bench table (id int primary key, v text NOT NULL = md5(id), n int = id % 1000, ts): three
# clauses each, so every row evaluates all three. FILTER_ALL passes every row (the pure cost of evaluating it),
# FILTER_HALF the rows with n < 500 (half of them; whole one-row transactions drop out with their row).
FILTER_ALL = "id >= 0 AND v IS NOT NULL AND n < 2000000000"
FILTER_HALF = "id >= 0 AND v IS NOT NULL AND n < 500"


@dataclass(frozen=True)
class Variant:
    transaction_topic: bool  # kafka.transaction_topic
    where: str | None = None  # row filter on the bench table, in a publication of cdcd's config (publish: insert)
    impl: str | None = None  # CDCD_IMPL of the run (None: cdcd's default, the compiled row stage when built)
    delivery: str = "at_least_once"  # kafka.delivery
    envelope: str = "native"  # kafka.envelope
    kafka: tuple[tuple[str, Any], ...] = ()  # more kafka settings (the former defaults: the tuning's cost)
    mask: str | None = None  # a bench column masked by hash (columns: section; the salt in MASK_SALT_ENV)


VARIANTS = {
    "tx": Variant(True),
    "notx": Variant(False),
    "txeo": Variant(True, delivery="exactly_once"),
    "notxeo": Variant(False, delivery="exactly_once"),
    "txdbz": Variant(True, envelope="debezium"),
    "notxdbz": Variant(False, envelope="debezium"),
    "txl20": Variant(True, kafka=(("producer", {"linger.ms": 20}),)),
    "txeoc50": Variant(True, delivery="exactly_once", kafka=(("exactly_once", {"commit_interval_ms": 50}),)),
    "txpy": Variant(True, impl="python"),
    "notxpy": Variant(False, impl="python"),
    "filter": Variant(True, FILTER_ALL),
    "filter50": Variant(True, FILTER_HALF),
    "mask": Variant(True, mask="v"),
}
MASK_SALT_ENV = "BENCH_MASK_SALT"
TARGET_RATIO = 0.8
SMALL_PROCEDURE = f"""
CREATE PROCEDURE bench_small(txns int, per_txn int, INOUT last_start pg_lsn DEFAULT NULL) LANGUAGE plpgsql AS $$
BEGIN
    FOR t IN 0 .. txns - 1 LOOP
        IF t = txns - 1 THEN
            last_start := pg_current_wal_insert_lsn();
        END IF;
        INSERT INTO {TABLE}
            SELECT g, md5(g::text), g % 1000, timestamptz '2024-05-03 12:00+00' + g * interval '1 second'
            FROM generate_series(t * per_txn + 1, (t + 1) * per_txn) g;
        COMMIT;
    END LOOP;
END $$
"""


@dataclass
class Workload:
    name: str
    txns: int
    setup: Setup  # rows, end LSN, WAL size, generation time
    # filter variant -> (rows, transactions) matching its filter: PostgreSQL's count over the generated rows
    matched: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass
class Result:
    workload: str
    label: str  # pg_recvlogical, cdcd tx, cdcd notx
    run: Run
    broker_cpu_s: float | None = None
    messages: dict[str, int] | None = None  # topic suffix -> messages in Kafka
    expected: dict[str, int] | None = None


def _find_broker_pid() -> int | None:
    """The local Kafka broker's pid (a JVM running kafka.Kafka), for its CPU time; None if not on this host."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if b"kafka.Kafka" in (entry / "cmdline").read_bytes().split(b"\0"):
                return int(entry.name)
    return None


def _set_filter(cmd: list[str], where: str) -> None:
    """Put the row filter into the config that ``cmd`` names: the bench publication lists the table with ``where``
    and publishes inserts only (a filter on non-key columns is refused for a publication that publishes UPDATE or
    DELETE). manage_publications stays off: the server's publication (no WHERE) is not touched, so the server
    sends every row and cdcd evaluates the filter on each."""
    path = Path(cmd[cmd.index("--config") + 1])
    config = yaml.safe_load(path.read_text())
    config["source"]["publications"] = [
        {"name": PUBLICATION, "tables": [{"name": f"public.{TABLE}", "where": where}], "publish": ["insert"]}
    ]
    path.write_text(yaml.safe_dump(config))


def _columns(mask: str | None) -> dict[str, Any]:
    """The ``columns:`` section of a mask variant: a hash of one bench column."""
    if mask is None:
        return {}
    table = {f"public.{TABLE}": {"mask": {mask: "hash"}}}
    return {"columns": {"tables": table, "hash_salt_env": MASK_SALT_ENV}}


def _check_filter_log(log: Path, expected_filtered: int) -> None:
    """From cdcd's JSON log: the filter was active, and its "stopped" line counts ``expected_filtered`` dropped
    changes and none unevaluated."""
    events = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                events.append(event)
    if not any(e.get("event") == "row filters active" for e in events):
        raise BenchError(f"cdcd did not log 'row filters active':\n{_log_tail(log)}")
    stopped = [e for e in events if e.get("event") == "stopped"]
    if not stopped:
        raise BenchError(f"cdcd logged no 'stopped' line:\n{_log_tail(log)}")
    filtered, unevaluated = stopped[-1].get("filtered"), stopped[-1].get("unevaluated")
    if filtered != expected_filtered or unevaluated != 0:
        raise BenchError(
            f"cdcd's row filter dropped {filtered} changes (expected {expected_filtered}), "
            f"{unevaluated} unevaluated (expected 0)"
        )


class _HwmSampler(threading.Thread):
    """VmHWM of a child, read from /proc every POLL_S until it exits. wait4's ru_maxrss cannot be used for a
    small child: Linux carries the parent's peak RSS over the fork and exec (this script's ~70 MiB)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        super().__init__(daemon=True)
        self.proc = proc
        self.peak_kib = 0

    def run(self) -> None:
        while self.proc.returncode is None:
            try:
                self.peak_kib = max(self.peak_kib, _vm_hwm_kib(self.proc.pid))
            except (OSError, ValueError):
                return
            time.sleep(POLL_S)


class KafkaBench(Bench):
    def __init__(self, args: argparse.Namespace, admin: psycopg.Connection[Any], workdir: Path) -> None:
        super().__init__(args, admin, workdir)
        self.kafka = AdminClient({"bootstrap.servers": args.bootstrap_servers})
        self.registry = SchemaRegistryClient({"url": args.registry})
        self.prefixes: list[str] = []  # topic prefixes of cdcd runs whose topics may still exist
        self.broker_pid = _find_broker_pid()
        self.proto = 0
        self.streaming = False
        self.walinspect = False
        self.samplers: dict[int, _HwmSampler] = {}

    def _launch(self, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = super()._launch(cmd, log, env)
        self.samplers[proc.pid] = sampler = _HwmSampler(proc)
        sampler.start()
        return proc

    def peak_rss_kib(self, pid: int) -> int:
        """The sampled VmHWM of a child that has exited."""
        sampler = self.samplers.pop(pid)
        sampler.join(timeout=5)
        return sampler.peak_kib

    # -- setup ------------------------------------------------------------------------------

    def create_database(self) -> None:
        with self.create_scratch() as conn:
            conn.execute(SMALL_PROCEDURE)
            self.walinspect = self._walinspect(conn)
            self.proto = protocol_version_for(conn.info.server_version)
            self.streaming = conn.info.server_version >= 140000

    def generate(self, workload: str, slots: list[str]) -> Workload:
        """Create the slots, then run the workload; the end position is its last commit's end LSN."""
        args = self.args
        with _connect(self.scratch_dsn) as conn:
            conn.execute(f"TRUNCATE {TABLE}")  # before the slots: not decoded
            for slot in slots:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
                self.slots.append(slot)
            wal_before = parse_lsn(str(_scalar(conn, "SELECT pg_current_wal_insert_lsn()")))
            start = time.perf_counter()
            if workload == "large":
                txns, rows = 1, args.rows
                conn.execute("SET synchronous_commit = on")
                with conn.transaction():
                    conn.execute(
                        f"INSERT INTO {TABLE} SELECT g, md5(g::text), g %% 1000, "
                        "timestamptz '2024-05-03 12:00+00' + g * interval '1 second' FROM generate_series(1, %s) g",
                        [rows],
                    )
                    last_start = str(_scalar(conn, "SELECT pg_current_wal_insert_lsn()"))
            else:
                txns, rows = args.small_txns, args.small_txns * args.txn_rows
                conn.execute("SET synchronous_commit = off")  # one WAL flush per commit would dominate
                call = sql.SQL("CALL bench_small({}, {})").format(sql.Literal(txns), sql.Literal(args.txn_rows))
                last_start = str(_scalar(conn, call.as_string(conn)))
            generate_s = time.perf_counter() - start
            last_xid = int(_scalar(conn, f"SELECT xmin::text::bigint FROM {TABLE} ORDER BY id DESC LIMIT 1"))
            after = str(_scalar(conn, "SELECT pg_current_wal_insert_lsn()"))
            end_lsn, source = parse_lsn(after), "pg_current_wal_insert_lsn() after the last COMMIT (upper bound)"
            # Walsenders send (and pg_walinspect reads) only flushed WAL; with synchronous_commit off the WAL
            # writer flushes it shortly.
            deadline = time.monotonic() + 30
            while parse_lsn(str(_scalar(conn, "SELECT pg_current_wal_flush_lsn()"))) < end_lsn:
                if time.monotonic() > deadline:
                    raise BenchError(f"WAL not flushed to {format_lsn(end_lsn)} within 30 s")
                time.sleep(POLL_S)
            if self.walinspect:
                row = conn.execute(
                    "SELECT end_lsn FROM pg_get_wal_records_info(%s, %s) WHERE resource_manager = 'Transaction' "
                    "AND record_type LIKE 'COMMIT%%' AND xid::text::bigint = %s",
                    [last_start, after, last_xid],
                ).fetchone()
                if row is not None:
                    end_lsn, source = parse_lsn(str(row[0])), "last commit record's end (pg_walinspect)"
            matched = {}
            for name in args.variants:
                where = VARIANTS[name].where
                if where is not None:  # the table holds exactly this workload's rows (truncated before it)
                    found = conn.execute(
                        f"SELECT count(*), count(DISTINCT xmin::text) FROM {TABLE} WHERE {where}"
                    ).fetchone()
                    assert found is not None
                    matched[name] = (int(found[0]), int(found[1]))
        setup = Setup(
            self.consumer_dsn, self.proto, self.streaming, end_lsn, rows, end_lsn - wal_before, generate_s, source
        )
        return Workload(workload, txns, setup, matched)

    # -- consumers --------------------------------------------------------------------------

    def run_recv(self, workload: Workload, slot: str, round_no: int) -> Result:
        run = self.run_pg_recvlogical(workload.setup, slot, round_no)
        run.peak_rss_kib = self.peak_rss_kib(self.procs[-1].pid)  # not ru_maxrss: see _HwmSampler
        return Result(workload.name, "pg_recvlogical", run)

    def run_cdcd_kafka(
        self, workload: Workload, variant: str, slot: str, round_no: int, profile: Path | None = None
    ) -> Result:
        setup, args = workload.setup, self.args
        prefix = f"cdcdbench-{self.database.removeprefix('bench_')}-{workload.name}-{variant}-{round_no}"
        self.prefixes.append(prefix)
        transaction_topic, where = VARIANTS[variant].transaction_topic, VARIANTS[variant].where
        cmd = self.cdcd_command(
            setup,
            slot,
            ["run"],
            profile,
            sink={"kind": "kafka"},
            kafka={
                "bootstrap_servers": args.bootstrap_servers,
                "topic_prefix": prefix,
                "transaction_topic": transaction_topic,
                "delivery": VARIANTS[variant].delivery,
                "envelope": VARIANTS[variant].envelope,
                **dict(VARIANTS[variant].kafka),
            },
            schema_registry={"url": args.registry},
            metrics={"listen": "127.0.0.1:0"},
            **_columns(VARIANTS[variant].mask),
        )
        if where is not None:
            _set_filter(cmd, where)
        if VARIANTS[variant].delivery == "exactly_once":
            self.create_progress_topic(prefix)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CDCD_")}
        impl = VARIANTS[variant].impl
        if impl is not None:
            env["CDCD_IMPL"] = impl
        env[MASK_SALT_ENV] = "bench-salt"
        log = self.workdir / f"{slot}.log"
        broker_before = _cpu_s(self.broker_pid) if self.broker_pid else None
        start = time.perf_counter()
        proc = self._launch(cmd, log, env)
        watch = self._watch(proc, slot, setup, start, log)
        broker_after = _cpu_s(self.broker_pid) if self.broker_pid else None
        if watch.exited is not None:
            raise BenchError(f"cdcd exited {watch.exited.code} before reaching the end LSN:\n{_log_tail(log)}")
        hwm = _vm_hwm_kib(proc.pid)
        # before SIGTERM: what Kafka held when the end LSN was confirmed
        messages = self.count_messages(prefix, committed=VARIANTS[variant].delivery == "exactly_once")
        exited = self.stop_cdcd(proc, log)
        self.delete_topics(prefix)
        label = f"cdcd {variant}" + (" (cProfile)" if profile is not None else "")
        run = Run(
            label,
            round_no,
            slot,
            watch.seconds,
            watch.startup_s,
            watch.sent_s,
            exited.cpu_s,
            watch.walsender_cpu_s,
            max(hwm, self.peak_rss_kib(proc.pid)),
            self._slot_stats(slot),
            profiled=profile is not None,
        )
        rows, txns = workload.matched[variant] if where is not None else (setup.rows, workload.txns)
        expected = {"public.bench": rows} | ({"transaction": 2 * txns} if transaction_topic else {})
        if where is not None:
            _check_filter_log(log, setup.rows - rows)
        broker_cpu = None if broker_before is None or broker_after is None else broker_after - broker_before
        return Result(workload.name, f"cdcd {variant}", run, broker_cpu, messages, expected)

    # -- Kafka ------------------------------------------------------------------------------

    def _topics(self, prefix: str) -> dict[str, list[int]]:
        metadata = self.kafka.list_topics(timeout=30)
        return {
            name: list(topic.partitions) for name, topic in metadata.topics.items() if name.startswith(f"{prefix}.")
        }

    def create_progress_topic(self, prefix: str) -> None:
        """The slot exists before cdcd starts: exactly-once wants its (empty) progress topic made for it too."""
        topic = NewTopic(f"__cdcd-progress-{prefix}", num_partitions=1, config={"cleanup.policy": "compact"})
        try:
            self.kafka.create_topics([topic], operation_timeout=30)[topic.topic].result(timeout=60)
        except KafkaException as exc:
            raise BenchError(f"cannot create {topic.topic}: {exc}") from None

    def count_messages(self, prefix: str, committed: bool = False) -> dict[str, int]:
        """Messages per topic under ``prefix`` (the prefix and its dot removed): sum of high - low watermarks, or,
        with ``committed`` (Kafka transactions: their commit markers take offsets too), the messages a
        read_committed consumer reads to the end of each partition."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.args.bootstrap_servers,
                "group.id": f"{prefix}-count",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
            }
        )
        counts: Counter[str] = Counter()
        try:
            for topic, partitions in self._topics(prefix).items():
                name = topic.removeprefix(f"{prefix}.")
                for partition in partitions:
                    if committed:
                        counts[name] += _count_committed(consumer, TopicPartition(topic, partition))
                    else:
                        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
                        counts[name] += high - low
        finally:
            consumer.close()
        return dict(counts)

    def delete_topics(self, prefix: str) -> None:
        """Delete the topics and the registry subjects under ``prefix`` (and its exactly-once progress topic)."""
        progress = f"__cdcd-progress-{prefix}"
        topics = list(self._topics(prefix)) + [progress] * (progress in self.kafka.list_topics(timeout=30).topics)
        if topics:
            for topic, future in self.kafka.delete_topics(topics, operation_timeout=30).items():
                try:
                    future.result(timeout=60)
                except KafkaException as exc:
                    raise BenchError(f"cannot delete topic {topic}: {exc}") from None
        try:
            subjects = [s for s in self.registry.get_subjects() if s.startswith(f"{prefix}.")]
            for subject in subjects:
                self.registry.delete_subject(subject)
                with contextlib.suppress(Exception):  # some registries need the soft delete first, some refuse it
                    self.registry.delete_subject(subject, permanent=True)
        except Exception as exc:  # the client raises several error types; the subjects are small, warn only
            print(f"kafka: warning: registry subjects under {prefix} not deleted: {exc}", file=sys.stderr)
        self.prefixes.remove(prefix)

    # -- cleanup ----------------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        problems = super().cleanup()
        for prefix in list(self.prefixes):
            try:
                self.delete_topics(prefix)
            except (BenchError, KafkaException) as exc:
                problems.append(f"cannot delete the topics under {prefix}: {exc}")
        return problems


def _count_committed(consumer: Consumer, partition: TopicPartition) -> int:
    """Messages a read_committed consumer reads from the start to the end of ``partition``."""
    partition.offset = OFFSET_BEGINNING
    consumer.assign([partition])
    count = 0
    while True:
        messages = consumer.consume(10_000, timeout=30)
        if not messages:
            raise BenchError(f"cannot count {partition.topic}: no end of partition within 30 s")
        for message in messages:
            error = message.error()
            if error is None:
                count += 1
            elif error.code() == KafkaError._PARTITION_EOF:
                return count
            else:
                raise BenchError(f"cannot count {partition.topic}: {error.str()}")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=None, help="rows in the large transaction (default 1000000)")
    parser.add_argument("--small-txns", type=int, default=None, help="small transactions (default 100000)")
    parser.add_argument("--txn-rows", type=int, default=1, help="rows per small transaction (default 1)")
    parser.add_argument(
        "--repeat", type=int, default=None, help="rounds per workload, each on its own slots (default 2; --quick 1)"
    )
    parser.add_argument("--quick", action="store_true", help="100000 rows, 10000 small transactions, 1 round")
    parser.add_argument(
        "--workloads", default="large,small", help="comma-separated: large, small (default large,small)"
    )
    parser.add_argument(
        "--variants",
        default="tx,notx",
        help="cdcd runs per round: tx (kafka.transaction_topic true), notx (false), filter (tx plus a 3-clause "
        "row filter that passes every row), filter50 (tx plus a 3-clause filter passing half the rows), mask (tx "
        "plus a hash mask on one text column); "
        "default tx,notx",
    )
    add_common_args(parser)
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("CDCD_KAFKA__BOOTSTRAP_SERVERS", DEFAULT_BOOTSTRAP),
        help=f"Kafka (default: $CDCD_KAFKA__BOOTSTRAP_SERVERS, else {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument(
        "--registry",
        default=os.environ.get("CDCD_SCHEMA_REGISTRY__URL", DEFAULT_REGISTRY),
        help="schema registry URL (default: $CDCD_SCHEMA_REGISTRY__URL, else the stack's)",
    )
    parser.add_argument(
        "--profile",
        nargs="?",
        const="/tmp/cdcd-kafka",
        default=None,
        metavar="PREFIX",
        help="also run cdcd (tx) once per workload under cProfile; stats in PREFIX-<workload>.prof "
        "(default PREFIX /tmp/cdcd-kafka)",
    )
    args = parser.parse_args(argv)
    quick = {"rows": 100_000, "small_txns": 10_000, "repeat": 1}
    full = {"rows": 1_000_000, "small_txns": 100_000, "repeat": 2}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not args.workloads or not set(args.workloads) <= set(WORKLOADS):
        parser.error(f"--workloads: choose from {', '.join(WORKLOADS)}")
    if not args.variants or not set(args.variants) <= set(VARIANTS):
        parser.error(f"--variants: choose from {', '.join(VARIANTS)}")
    if min(args.rows, args.small_txns, args.txn_rows, args.repeat) < 1:
        parser.error("--rows, --small-txns, --txn-rows and --repeat must be >= 1")
    return args


def _describe(workload: Workload, args: argparse.Namespace) -> str:
    setup = workload.setup
    what = (
        f"one transaction of {setup.rows:,} rows"
        if workload.name == "large"
        else f"{workload.txns:,} transactions of {args.txn_rows} row{'s' * (args.txn_rows > 1)} ({setup.rows:,} rows)"
    )
    return (
        f"workload {workload.name}: {what}, {setup.wal_bytes / 2**20:.0f} MiB of WAL, generated in "
        f"{setup.insert_s:.1f} s; end LSN {format_lsn(setup.end_lsn)} ({setup.end_lsn_source})"
    )


def _count_text(result: Result) -> str:
    if result.messages is None:
        return ""
    total = sum(result.messages.values())
    return f"{total:,}" + ("" if result.messages == result.expected else " WRONG")


def _report_workload(workload: Workload, results: list[Result], args: argparse.Namespace) -> None:
    setup = workload.setup
    print()
    print(_describe(workload, args))
    title = (
        f"{'consumer':<22} {'round':>5} {'seconds':>8} {'rows/s':>9} {'startup':>7} {'sent':>6} {'CPU s':>6} "
        f"{'wsnd CPU':>8} {'Kafka CPU':>9} {'peak RSS':>8} {'messages':>10}"
    )
    print(title)
    print("-" * len(title))
    for result in results:
        run = result.run
        broker = "-" if result.label == "pg_recvlogical" else _fmt(result.broker_cpu_s)
        print(
            f"{run.consumer:<22} {run.round:>5} {run.seconds:>8.2f} {setup.rows / run.seconds:>9,.0f} "
            f"{_fmt(run.startup_s):>7} {_fmt(run.sent_s):>6} {run.cpu_s:>6.2f} {_fmt(run.walsender_cpu_s):>8} "
            f"{broker:>9} {_mib(run.peak_rss_kib):>8} {_count_text(result):>10}"
        )
    for result in results:
        if result.messages is not None and result.messages != result.expected:
            print(
                f"  {result.run.consumer} round {result.run.round}: Kafka holds {result.messages}, "
                f"expected {result.expected}"
            )


def _width(variants: list[str]) -> int:
    """The summary's variant column: 5 wide (tx, notx), wider for the filter variants."""
    return max(5, *(len(v) for v in variants))


def _summary(workload: Workload, results: list[Result], variants: list[str]) -> list[str]:
    """One line per cdcd variant: best rows/s of both, the ratio (best and median), peak RSS of both."""
    rows, width = workload.setup.rows, _width(variants)
    timed = [r for r in results if not r.run.profiled]
    recv = [r.run for r in timed if r.label == "pg_recvlogical"]
    if not recv:
        return []
    recv_best, recv_median = min(r.seconds for r in recv), statistics.median(r.seconds for r in recv)
    recv_rss = max(r.peak_rss_kib for r in recv)
    lines = []
    for variant in variants:
        mine = [r.run for r in timed if r.label == f"cdcd {variant}"]
        if not mine:
            continue
        fastest = min(mine, key=lambda r: r.seconds)
        best, median = fastest.seconds, statistics.median(r.seconds for r in mine)
        ratio = recv_best / best
        verdict = "met" if ratio >= TARGET_RATIO else "NOT met"
        lines.append(
            f"{workload.name:<6} {variant:<{width}} {rows / best:>11,.0f} {rows / recv_best:>15,.0f} {ratio:>6.2f} "
            f"{recv_median / median:>7.2f} {_streaming_ratio(fastest, min(recv, key=lambda r: r.seconds)):>9} "
            f"{fastest.cpu_s / rows * 1e6:>10.1f} {_mib(max(r.peak_rss_kib for r in mine)):>9} {_mib(recv_rss):>9}  "
            f"{verdict}"
        )
    return lines


def _streaming_ratio(cdcd: Run, recv: Run) -> str:
    """The ratio without either consumer's start-up (launch until its slot was active): the streaming pace."""
    if cdcd.startup_s is None or recv.startup_s is None:
        return "-"
    return f"{(recv.seconds - recv.startup_s) / (cdcd.seconds - cdcd.startup_s):.2f}"


def _filter_summary(workload: Workload, results: list[Result], variants: list[str]) -> list[str]:
    """One line per filter variant: its best rows/s (rows of the WAL, filtered or not, per second) against tx's,
    the ratio filter / tx (best and of the medians), and the rows it published."""
    rows = workload.setup.rows
    timed = [r for r in results if not r.run.profiled]

    def seconds(variant: str) -> list[float]:
        return [r.run.seconds for r in timed if r.label == f"cdcd {variant}"]

    tx = seconds("tx")
    lines = []
    for variant in variants:
        mine = seconds(variant)
        if (VARIANTS[variant].where is None and VARIANTS[variant].mask is None) or not mine or not tx:
            continue
        published = workload.matched[variant][0] if VARIANTS[variant].where is not None else rows
        lines.append(
            f"{workload.name:<6} {variant:<8} {rows / min(tx):>9,.0f} {rows / min(mine):>14,.0f} "
            f"{min(tx) / min(mine):>6.3f} {statistics.median(tx) / statistics.median(mine):>7.3f} "
            f"{published:>11,} ({100 * published / rows:.0f}%)"
        )
    return lines


def _print_profile(path: Path, workload: str) -> None:
    print(f"\ncdcd run ({workload}) under cProfile: top 20 functions by tottime ({path})")
    stats = pstats.Stats(str(path), stream=sys.stdout)
    stats.strip_dirs().sort_stats("tottime").print_stats(20)
    print(f"cdcd run ({workload}) under cProfile: cdcd's functions by cumulative time")
    stats = pstats.Stats(str(path), stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(r"cdcd/(?!cli|__main__)", 25)


def _print_header(bench: KafkaBench, args: argparse.Namespace) -> None:
    try:
        brokers = bench.kafka.list_topics(timeout=10).brokers
    except KafkaException as exc:
        raise BenchError(f"Kafka at {args.bootstrap_servers} does not answer: {exc}") from None
    major = bench.admin.info.server_version // 10000
    args.pg_recvlogical = _find_pg_recvlogical(args.pg_recvlogical, major)
    recv_version = subprocess.run([args.pg_recvlogical, "--version"], capture_output=True, text=True, check=True)
    work_mem = str(_scalar(bench.admin, "SHOW logical_decoding_work_mem"))
    print(f"server: {_scalar(bench.admin, 'SELECT version()')}")
    print(
        f"pg_recvlogical: {args.pg_recvlogical} ({recv_version.stdout.strip()}); cdcd: {' '.join(_cdcd_command())} run"
    )
    print(
        f"Kafka: {args.bootstrap_servers} ({len(brokers)} broker(s); broker pid "
        f"{bench.broker_pid or 'not found: no Kafka CPU'}); registry: {args.registry}"
    )
    print(
        "logical_decoding_work_mem: "
        + (f"{args.work_mem} (set in both DSNs)" if args.work_mem else f"{work_mem} (server default)")
        + f"; cdcd: buffer.memory_limit {args.memory_limit}, status_interval_s {args.status_interval}, "
        f"variants {', '.join(args.variants)}; machine: {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.2f}"
    )


def _run_workload(bench: KafkaBench, name: str, args: argparse.Namespace) -> tuple[Workload, list[Result], Path | None]:
    """Slots, the workload, then per round pg_recvlogical and each cdcd variant; plus the profiled run."""
    suffix = bench.database.removeprefix("bench_")
    rounds = [
        (f"bk_{suffix}_{name}_recv_{i}", [(v, f"bk_{suffix}_{name}_{v}_{i}") for v in args.variants])
        for i in range(1, args.repeat + 1)
    ]
    profile_slot = f"bk_{suffix}_{name}_prof" if args.profile else None
    slots = [s for recv, cdcd in rounds for s in [recv] + [slot for _, slot in cdcd]]
    slots += [profile_slot] if profile_slot else []
    print(f"{name}: {len(slots)} slots, generating ...", flush=True)
    workload = bench.generate(name, slots)
    print(f"{name}: generated in {workload.setup.insert_s:.1f} s", flush=True)
    results: list[Result] = []
    for round_no, (recv_slot, cdcd_slots) in enumerate(rounds, start=1):
        results.append(bench.run_recv(workload, recv_slot, round_no))
        bench.drop_slot(recv_slot)
        print(f"{name} round {round_no}: pg_recvlogical {results[-1].run.seconds:.2f} s", flush=True)
        for variant, slot in cdcd_slots:
            results.append(bench.run_cdcd_kafka(workload, variant, slot, round_no))
            bench.drop_slot(slot)
            print(f"{name} round {round_no}: cdcd {variant} {results[-1].run.seconds:.2f} s", flush=True)
    profile = None
    if args.profile and profile_slot:
        profile = Path(f"{args.profile}-{name}.prof")
        print(f"{name}: profiled cdcd run ...", flush=True)
        results.append(bench.run_cdcd_kafka(workload, args.variants[0], profile_slot, 0, profile=profile))
        bench.drop_slot(profile_slot)
    return workload, results, profile


def _print_summary(summary: list[str], filter_summary: list[str], variants: list[str]) -> None:
    print()
    print(
        "rows/s: best round; ratio = cdcd rows/s / pg_recvlogical rows/s (best, and of the medians); "
        "seconds: launch until pg_recvlogical exited at --endpos / cdcd's slot confirmed the end LSN "
        "(all messages acknowledged by Kafka)"
    )
    print(
        "startup: until the slot is active; sent: until the walsender's sent_lsn reached the end; CPU s: the "
        "consumer's; wsnd / Kafka CPU: the walsender's and the broker's during the run (sampled, approximate); "
        "messages: in Kafka under the run's topic prefix when the end was confirmed"
    )
    print()
    print(
        "streaming: the best rounds' ratio without either's start-up; CPU µs/row: cdcd's CPU time (all its threads) "
        "per row, best round"
    )
    head = (
        f"{'workload':<6} {'cdcd':<{_width(variants)}} {'cdcd rows/s':>11} {'pg_recv rows/s':>15} {'ratio':>6} "
        f"{'(median)':>7} {'streaming':>9} {'CPU µs/row':>10} {'cdcd RSS':>9} {'recv RSS':>9}  target >= {TARGET_RATIO}"
    )
    print(head)
    print("-" * len(head))
    for line in summary:
        print(line)
    if not filter_summary:
        return
    print()
    print(
        "row filters (evaluated by cdcd; the server's publication has none, so it sends every row) and column "
        "masks: rows/s = the workload's rows (published or dropped) per second, best round; ratio = variant "
        "rows/s / tx rows/s (best, and of the medians)"
    )
    for name in dict.fromkeys(v for v in variants if VARIANTS[v].where is not None):
        print(f"  {name}: WHERE {VARIANTS[name].where}  (publish: insert)")
    for name in dict.fromkeys(v for v in variants if VARIANTS[v].mask is not None):
        print(f"  {name}: columns: a hash mask on {TABLE}.{VARIANTS[name].mask}  (no filter; target ratio >= 0.9)")
    head = (
        f"{'workload':<6} {'variant':<8} {'tx rows/s':>9} {'variant rows/s':>14} {'ratio':>6} {'(median)':>7} "
        f"{'published':>11}"
    )
    print(head)
    print("-" * len(head))
    for line in filter_summary:
        print(line)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        admin = _connect(args.dsn)
    except psycopg.OperationalError as exc:
        print(f"kafka: cannot connect to {_safe_dsn(args.dsn)}: {exc}", file=sys.stderr)
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="cdcd-bench-kafka-"))
    bench = KafkaBench(args, admin, workdir)
    failed = False
    summary: list[str] = []
    filter_summary: list[str] = []
    profiles: list[tuple[Path, str]] = []
    try:
        _print_header(bench, args)
        print(f"creating database {bench.database} ...", flush=True)
        bench.create_database()
        for name in args.workloads:
            workload, results, profile = _run_workload(bench, name, args)
            _report_workload(workload, results, args)
            summary += _summary(workload, results, args.variants)
            filter_summary += _filter_summary(workload, results, args.variants)
            profiles += [(profile, name)] if profile else []
            failed = failed or any(r.messages is not None and r.messages != r.expected for r in results)
        _print_summary(summary, filter_summary, args.variants)
        for path, name in profiles:
            _print_profile(path, name)
        if failed:
            print("kafka: FAILED: a message count in Kafka is wrong (see above)", file=sys.stderr)
    except (BenchError, psycopg.Error, OSError, subprocess.CalledProcessError, KafkaException) as exc:
        print(f"kafka: FAILED: {exc}", file=sys.stderr)
        failed = True
    finally:
        failed = finish(bench, admin, workdir, "kafka", failed=failed, keep=args.keep_workdir)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

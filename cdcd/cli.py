"""Command line: ``cdcd run|check|tail --config FILE``, ``cdcd snapshot --table T [--where EXPR]``.

``run`` is the daemon: it sends changes where ``sink.kind`` in the config says (it has no default). ``tail``
prints them as JSON lines (to stdout or ``--output``) whatever the sink. ``check`` validates the config and the
source database. ``snapshot`` writes a request into the WAL that the daemon reading the slot turns into an
incremental snapshot (refused under ``snapshot.read_only``, which writes nothing to the source: the signal topic
asks for snapshots).
``check --offline`` validates the config alone, for CI: no secret file read, nothing contacted.
``status`` asks a running daemon (its metrics port) how it is doing and prints a summary, or ``--json``.

Exit codes: 0 success, 1 a runtime failure (source problem, malformed stream), 2 bad configuration.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path
from typing import Any, BinaryIO

import structlog

from cdcd import __version__, stopping
from cdcd.assembly import AssemblyError
from cdcd.avro.schema import SchemaError
from cdcd.columns import ColumnRuleError
from cdcd.config import ConfigError, Settings, load_settings
from cdcd.filters import FilterFailure
from cdcd.logging import configure
from cdcd.lsn import format_lsn
from cdcd.metrics import Metrics
from cdcd.notify import Notifier
from cdcd.pgoutput import DecodeError
from cdcd.replication.loop import ReplicationLoop
from cdcd.rowstage import IMPL, STAGE
from cdcd.secrets import redacted_output
from cdcd.shaping import EventShaper, table_subjects
from cdcd.sink import Sink, SinkFailure
from cdcd.snapshot.runner import SnapshotError
from cdcd.snapshot.signals import SignalSource
from cdcd.snapshot.state import StateError, state_dir_problem
from cdcd.source.walsender import SourceDisconnected, SourceError, Timeouts

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdcd", description="PostgreSQL logical replication to Kafka")
    # and which row stage runs: the compiled one (cdcd._native) or the Python reference (CDCD_IMPL=python)
    parser.add_argument("--version", action="version", version=f"cdcd {__version__} (row stage: {IMPL})")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("run", "stream changes to the configured sink"),
        ("check", "validate config and the source database"),
        ("tail", "print changes as JSON lines"),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--config", "-c", type=Path, help="YAML config file (env CDCD_* overrides it)")
        if name == "tail":
            sub.add_argument("--output", "-o", default="-", help="file to append to (default: stdout)")
        if name == "check":
            sub.add_argument(
                "--offline", action="store_true", help="validate the config alone: no secret read, nothing contacted"
            )
    sub = commands.add_parser("snapshot", help="ask the running daemon for an incremental snapshot of a table")
    sub.add_argument("--config", "-c", type=Path, help="YAML config file (env CDCD_* overrides it)")
    sub.add_argument("--table", "-t", required=True, help="schema.table, a table cdcd captures")
    sub.add_argument("--where", "-w", help="only rows matching this condition (ANDed with the row filters)")
    sub = commands.add_parser("status", help="ask the running daemon how it is doing (its metrics port)")
    where = sub.add_mutually_exclusive_group()
    where.add_argument("--config", "-c", type=Path, help="the daemon's config: its metrics.listen is asked")
    where.add_argument("--url", "-u", help="the daemon's metrics endpoint, e.g. http://127.0.0.1:9187")
    sub.add_argument("--json", action="store_true", help="print the daemon's /status document as JSON")
    sub.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer (default 5)")
    return parser


def main(argv: list[str] | None = None) -> int:
    with redacted_output():  # a secret is masked in whatever is printed: reports, log lines, tracebacks
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "status":
        return _status(args.config, args.url, args.json, args.timeout)
    offline = args.command == "check" and args.offline
    try:
        settings = load_settings(args.config, read_secrets=not offline)
        kind = settings.sink.run_kind() if args.command == "run" else None
    except ConfigError as exc:
        print(f"cdcd: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if offline:
        return _check_offline(settings)
    configure(settings.log)
    structlog.contextvars.bind_contextvars(slot=settings.source.slot)  # on every line of this process
    if args.command == "check":
        return _check(settings)
    if args.command == "snapshot":
        return _request_snapshot(settings, args.table, args.where)
    if args.command == "tail":
        return _stream(settings, args.output, serve_metrics=False)
    return _stream(settings, settings.sink.path if kind == "jsonl" else None, serve_metrics=True)


def _check(settings: Settings) -> int:
    from cdcd.source.checks import check_source  # noqa: PLC0415 - loaded only when used
    from cdcd.source.standby import Writes  # noqa: PLC0415

    findings = check_source(settings.source, Writes.of(settings))
    problems = findings.config_errors + findings.problems
    state_problem = state_dir_problem(settings.snapshot.state_dir)
    if state_problem is not None:
        problems.append(state_problem)
    if settings.sink.kind == "kafka":
        from cdcd.sink.checks import check_kafka  # noqa: PLC0415 - loaded only when used: a 0.2 s import

        problems += check_kafka(settings.kafka, settings.schema_registry)
        if not problems:  # both ends answer: would the registry take the tables' schemas as they are now?
            try:
                problems += _schema_compatibility(settings)
            except ColumnRuleError as exc:  # the column rules do not fit a table as it is now
                print(f"cdcd check: {exc}", file=sys.stderr)
                return EXIT_CONFIG
    for warning in [*findings.warnings, *_config_warnings(settings)]:
        print(f"cdcd check: warning: {warning}", file=sys.stderr)
    if problems:
        print(f"cdcd check: {len(problems)} problem(s):", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return EXIT_CONFIG if findings.config_errors else EXIT_FAILURE
    kind = settings.sink.kind
    ready = f"configuration, source database and {kind} sink" if kind else "configuration and source database"
    print(f"cdcd check: {ready} are ready")
    return EXIT_OK


def _check_offline(settings: Settings) -> int:
    """The configuration parsed and validated (load_settings did it): no secret was read, nothing contacted."""
    for warning in _config_warnings(settings):
        print(f"cdcd check: warning: {warning}", file=sys.stderr)
    print("cdcd check: configuration is valid (offline: secrets not read, source and sink not contacted)")
    return EXIT_OK


def _config_warnings(settings: Settings) -> list[str]:
    """What the configuration lacks for `cdcd run`, which other commands do without."""
    try:
        settings.sink.run_kind()
    except ConfigError as exc:
        return [str(exc)]
    return []


def _schema_compatibility(settings: Settings) -> list[str]:
    """Ask the registry whether each captured table's current schemas fit its subjects (each refusal named by
    table and column); subjects that do not exist yet are reported as new."""
    from cdcd.sink.checks import check_compatibility  # noqa: PLC0415 - loaded only when used

    try:
        candidates = _current_schemas(settings)
    except (SourceError, SourceDisconnected, SchemaError, LookupError) as exc:
        return [f"cannot build the tables' schemas: {exc}"]
    found = check_compatibility(settings.schema_registry, candidates)
    for subject in found.new:
        print(f"cdcd check: {subject} is new: its first schema version will be registered", file=sys.stderr)
    return found.refused + found.problems


def _current_schemas(settings: Settings) -> list[tuple[str, str, dict[str, Any]]]:
    """(table, subject, schema) of every captured table as it is in the catalog now: what cdcd would register."""
    from cdcd.snapshot.reader import SnapshotReader  # noqa: PLC0415 - loaded only when used

    source, kafka = settings.source, settings.kafka
    publications = source.publication_names
    reader = SnapshotReader(
        source.dsn.get_secret_value(),
        source.read_password(),
        source.slot,
        Timeouts.of(source),
        STAGE.copy_row_reader(),
        publications=publications,
    )
    columns = settings.columns.rules()
    try:
        candidates = []
        for name in reader.captured_tables(publications):
            table = reader.describe(name)
            types = {t.type_oid: t for t in table.types}
            debezium = kafka.envelope == "debezium"
            subjects = table_subjects(table.relation, kafka.topic_prefix, types, debezium=debezium, columns=columns)
            for subject, schema in subjects:
                candidates.append((name, subject, schema))
        return candidates
    finally:
        reader.close()


def _request_snapshot(settings: Settings, table: str, where: str | None) -> int:
    from cdcd.snapshot.reader import SnapshotRequestError, request_snapshot  # noqa: PLC0415

    if settings.snapshot.read_only:
        print(f"cdcd snapshot: {_read_only_refusal(settings, table, where)}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        key = settings.snapshot.request_key(create=False)
        if key is None:
            print("cdcd snapshot: snapshot.requests is off: ask on the signal topic", file=sys.stderr)
            return EXIT_CONFIG
        request_id = request_snapshot(settings.source, table, where, key)
    except (SnapshotRequestError, ConfigError) as exc:
        print(f"cdcd snapshot: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (SourceError, SourceDisconnected) as exc:
        print(f"cdcd snapshot: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(
        f"cdcd snapshot: queued {table} (request {request_id}); the daemon on slot {settings.source.slot}"
        " picks it up from the replication stream"
    )
    return EXIT_OK


def _status(config: Path | None, url: str | None, as_json: bool, timeout: float) -> int:
    from cdcd.status import render, status_url  # noqa: PLC0415
    from cdcd.status_client import StatusUnavailable, fetch_status  # noqa: PLC0415

    if url is None:
        try:
            url = status_url(load_settings(config, read_secrets=False).metrics.address)
        except (ConfigError, ValueError) as exc:
            print(f"cdcd status: {exc}", file=sys.stderr)
            return EXIT_CONFIG
    try:
        status = fetch_status(url, timeout)
    except StatusUnavailable as exc:
        print(f"cdcd status: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(json.dumps(status, indent=1) if as_json else render(status), end="\n" if as_json else "")
    return EXIT_OK


def _tune_gc() -> None:
    """Buffered changes are acyclic (tuples, strings, slotted objects), often millions of them: the cyclic
    collector's passes over them cost about a third of assembly time (benchmarks/core.py --no-gc). Freeze
    what start-up allocated and run the young generations far less often."""
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND


def _sink(settings: Settings, output: str | None) -> tuple[Sink, EventShaper | None, BinaryIO | None]:
    """JSON lines to ``output`` (``-``: stdout), or Kafka when ``output`` is None (with the shaper it is given)."""
    if output is None:
        return *_kafka_sink(settings), None
    from cdcd.sink.jsonl import JsonLinesSink  # noqa: PLC0415 - loaded only when used

    # the captured rows: readable by the owner only, as the state file is
    out: BinaryIO = sys.stdout.buffer if output == "-" else os.fdopen(os.open(output, _APPEND, 0o600), "ab")
    sink = JsonLinesSink(out, settings.sink.fsync, settings.columns.rules())
    return sink, None, None if out is sys.stdout.buffer else out


def _kafka_sink(settings: Settings) -> tuple[Sink, EventShaper]:
    """The Kafka sink put together: its transport, the shaper's registry (schema ids, topics), the shaper, and
    the delivery strategy ``kafka.delivery`` names. The shaper goes to the loop too (the compiled lane)."""
    # loaded only when used: a 0.2 s import
    from cdcd.sink.delivery import AtLeastOnceDelivery, Delivery  # noqa: PLC0415
    from cdcd.sink.kafka import KafkaSink  # noqa: PLC0415
    from cdcd.sink.registry import KafkaRegistry  # noqa: PLC0415
    from cdcd.sink.transactional import ExactlyOnceDelivery  # noqa: PLC0415
    from cdcd.sink.transport import KafkaTransport  # noqa: PLC0415

    kafka = settings.kafka
    transport = KafkaTransport(kafka)
    topics = KafkaRegistry(kafka, settings.schema_registry, transport)
    shaper = EventShaper(
        kafka.topic_prefix,
        topics,
        transaction_topic=kafka.transaction_topic,
        tombstones_on_delete=kafka.tombstones_on_delete,
        debezium=kafka.envelope == "debezium",
        columns=settings.columns.rules(),
    )
    exactly_once = kafka.delivery == "exactly_once"
    delivery: Delivery = (
        ExactlyOnceDelivery(kafka, transport, topics) if exactly_once else AtLeastOnceDelivery(kafka, transport)
    )
    return KafkaSink(kafka, shaper, transport, topics, delivery), shaper


def _signals(settings: Settings) -> SignalSource | None:
    """The Kafka signal topic's reader, when ``signals.kafka.topic`` is set."""
    topic = settings.signals.kafka.topic
    if topic is None:
        return None
    from cdcd.sink.signal_topic import SignalTopic  # noqa: PLC0415 - loaded only when used

    kafka = settings.kafka
    return SignalTopic(kafka.client_config(), topic, f"cdcd-signals-{kafka.topic_prefix}", kafka.create_topics)


def _serve_metrics(settings: Settings, loop: ReplicationLoop, sink: Sink) -> Metrics | None:
    """Serve /metrics, /healthz and /readyz when metrics.listen is set; raises OSError if it cannot bind."""
    address = settings.metrics.address
    if address is None:
        return None
    metrics = Metrics(loop.state, sink, settings.metrics.health_timeout_s)
    loop.ledger.on_done = metrics.observe_done
    port = metrics.serve(*address)
    structlog.get_logger("cdcd").info(
        "serving metrics", address=address[0], port=port, paths=["/metrics", "/healthz", "/readyz"]
    )
    return metrics


def _read_only_refusal(settings: Settings, table: str, where: str | None) -> str:
    """Why `cdcd snapshot` does not write its request under ``snapshot.read_only``, and the way that works."""
    data: dict[str, Any] = {"data-collections": [table], "type": "incremental"}
    if where is not None:
        data["additional-conditions"] = [{"data-collection": table, "filter": where}]
    signal = json.dumps({"type": "execute-snapshot", "data": data})
    topic = settings.signals.kafka.topic
    where_to = f"the signal topic {topic}" if topic else "the signal topic (set signals.kafka.topic first)"
    return (
        "snapshot.read_only is on: cdcd writes nothing to the source, and this command would write its request into"
        f" the source's WAL. Send an execute-snapshot record to {where_to}, keyed {settings.kafka.topic_prefix!r}"
        f" (kafka.topic_prefix), valued {signal}"
    )


def _stream(settings: Settings, output: str | None, serve_metrics: bool) -> int:
    sink, shaper, opened = _sink(settings, output)
    notifier = Notifier.from_environment()  # systemd Type=notify: READY, WATCHDOG, STOPPING
    stopping.catch()  # also when called without cdcd.entry (in-process, tests)
    stopping.on_stop(lambda: notifier.stopping("flushing the sink, then a final status update"))
    signals = _signals(settings)
    loop = ReplicationLoop(settings, sink, stopping.STOP, notifier, signals=signals, shaper=shaper)
    log = structlog.get_logger("cdcd")
    try:
        metrics = _serve_metrics(settings, loop, sink) if serve_metrics else None
    except OSError as exc:
        log.error("cannot serve metrics", listen=settings.metrics.listen, error=exc.strerror or str(exc))
        return EXIT_CONFIG
    _tune_gc()
    try:
        loop.run()
    except (ConfigError, ColumnRuleError) as exc:
        log.error("configuration does not fit the source database", error=str(exc))
        return EXIT_CONFIG
    except FilterFailure as exc:
        log.error("row filter failed; stopping", error=str(exc), flushed_lsn=format_lsn(loop.ledger.flushed_lsn))
        return EXIT_FAILURE
    except (DecodeError, AssemblyError) as exc:
        log.error(
            "cannot decode the replication stream", error=str(exc), flushed_lsn=format_lsn(loop.ledger.flushed_lsn)
        )
        return EXIT_FAILURE
    except (SourceError, SourceDisconnected) as exc:
        log.error("source failed", error=str(exc), flushed_lsn=format_lsn(loop.ledger.flushed_lsn))
        return EXIT_FAILURE
    except SinkFailure as exc:
        log.error("sink failed; stopping", error=str(exc), flushed_lsn=format_lsn(loop.ledger.flushed_lsn))
        return EXIT_FAILURE
    except (StateError, SnapshotError) as exc:
        log.error("snapshot cannot go on; stopping", error=str(exc), flushed_lsn=format_lsn(loop.ledger.flushed_lsn))
        return EXIT_FAILURE
    finally:
        if metrics is not None:
            metrics.close()
        sink.close()
        if signals is not None:
            signals.close()
        if opened is not None:
            opened.close()
    stats, filters = loop.stats, loop.filter_stats
    log.info(
        "stopped",
        flushed_lsn=format_lsn(loop.ledger.flushed_lsn),
        transactions=stats.transactions,
        laned=stats.laned,
        changes=stats.changes,
        reconnects=stats.reconnects,
        filtered=filters.filtered.total(),
        updates_transformed=filters.transformed.total(),
        unevaluated=filters.unevaluated.total(),
    )
    return EXIT_OK

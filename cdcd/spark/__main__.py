"""``python -m cdcd.spark``: the mirror (and changelog) job. Also runs under spark-submit:
``spark-submit --packages ... $(python -c 'import cdcd.spark.__main__ as m; print(m.__file__)') ...``."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from cdcd.spark.job import Options, session, start
from cdcd.spark.schema import UNAVAILABLE


class UsageError(ValueError):
    """A command line that cannot work (a missing server, a malformed pair): exit 2, as argparse's own errors."""


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"{what} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m cdcd.spark", description=__doc__)
    p.add_argument("--bootstrap-servers", default=env("CDCD_KAFKA__BOOTSTRAP_SERVERS"), help="Kafka brokers")
    p.add_argument("--topic-prefix", required=True, help="cdcd's kafka.topic_prefix")
    p.add_argument("--registry-url", default=env("CDCD_SCHEMA_REGISTRY__URL"), help="Confluent-compatible registry")
    p.add_argument("--registry-user", help="basic auth user (password from $CDCD_SPARK_REGISTRY_PASSWORD)")
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (any Hadoop file system URI)")
    p.add_argument("--mirror", help="root of the mirror tables: <mirror>/<schema>/<table> (Delta, a path), "
                   "<catalog>.<mirror>.<schema>.<table> (Iceberg, a namespace)")  # fmt: skip
    p.add_argument("--changelog", help="root of the append-only changelog tables, as --mirror")
    p.add_argument("--format", choices=["delta", "iceberg"], default="delta", help="of the mirror and changelog")
    p.add_argument("--changelog-format", choices=["delta", "parquet"], default="delta",
                   help="with --format delta: the changelog's")  # fmt: skip
    p.add_argument("--catalog", default="cdcd", help="with --format iceberg: the Spark catalog of the tables")
    p.add_argument("--warehouse", help="with --format iceberg: a Hadoop catalog on this path (or a REST catalog's "
                   "warehouse, with --catalog-uri); neither: the catalog is configured with --conf")  # fmt: skip
    p.add_argument("--catalog-uri", help="with --format iceberg: a REST catalog's URI")
    p.add_argument("--envelope", choices=["auto", "native", "debezium"], default="auto",
                   help="each topic's own (auto), only cdcd's native or only Debezium's")  # fmt: skip
    p.add_argument("--unavailable-value-placeholder", default=UNAVAILABLE,
                   help="Debezium's unavailable.value.placeholder (its unchanged TOAST values)")  # fmt: skip
    p.add_argument("--master", help="Spark master; default local[2], or spark-submit's when run by it")
    p.add_argument("--jars-dir", help="directory of the Kafka/Avro/Delta jars (default $CDCD_SPARK_JARS)")
    p.add_argument("--trigger-interval", default="5 seconds", help="micro-batch interval")
    p.add_argument("--available-now", action="store_true", help="process what is in Kafka now, then exit")
    p.add_argument("--max-offsets-per-trigger", type=int, help="cap on Kafka messages per micro-batch")
    p.add_argument("--starting-offsets", default="earliest", help="where a new checkpoint starts (earliest|latest)")
    p.add_argument("--key", action="append", default=[], metavar="SCHEMA.TABLE=COL[,COL]",
                   help="key columns of a table whose topic has no key (no primary key)")  # fmt: skip
    p.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                   help="Kafka source option, e.g. kafka.security.protocol=SSL")  # fmt: skip
    p.add_argument("--table-threads", type=int, default=4,
                   help="tables of a micro-batch written at once (1: one after the other)")  # fmt: skip
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="Spark configuration")
    return p


def options(args: argparse.Namespace) -> Options:
    missing = [n for n in ("bootstrap_servers", "registry_url") if not getattr(args, n)]
    if missing:
        raise UsageError(f"missing --{missing[0].replace('_', '-')}")
    if args.format != "iceberg" and (args.warehouse or args.catalog_uri):
        raise UsageError("--warehouse and --catalog-uri are for --format iceberg")
    password = os.environ.get("CDCD_SPARK_REGISTRY_PASSWORD", "")
    return Options(
        bootstrap_servers=args.bootstrap_servers,
        topic_prefix=args.topic_prefix,
        registry_url=args.registry_url,
        registry_auth=(args.registry_user, password) if args.registry_user else None,
        checkpoint=args.checkpoint,
        mirror=args.mirror,
        changelog=args.changelog,
        changelog_format=args.changelog_format,
        trigger_interval=args.trigger_interval,
        available_now=args.available_now,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        starting_offsets=args.starting_offsets,
        kafka_options=_pairs(args.kafka_option, "--kafka-option"),
        keys={k: tuple(v.split(",")) for k, v in _pairs(args.key, "--key").items()},
        table_threads=args.table_threads,
        format=args.format,
        catalog=args.catalog,
        warehouse=args.warehouse,
        catalog_uri=args.catalog_uri,
        envelope=args.envelope,
        unavailable_placeholder=args.unavailable_value_placeholder,
    )


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    try:
        opts, conf = options(args), _pairs(args.conf, "--conf")
    except UsageError as exc:
        cli.error(str(exc))  # exits 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one line per call between Python and the JVM otherwise
    # spark-submit starts the JVM and says so in the environment; then it, not us, picks master and jars.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    master = args.master or (None if submitted else "local[2]")
    spark = session(master, args.jars_dir, conf, iceberg=opts.format == "iceberg" or None)
    spark.sparkContext.setLogLevel("WARN")
    query = start(spark, opts)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m cdcd.spark` argument handling (no Spark session is started)."""

from __future__ import annotations

import pytest

from cdcd.spark.__main__ import UsageError, main, options, parser


def test_options_from_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDCD_KAFKA__BOOTSTRAP_SERVERS", "k:9092")
    monkeypatch.setenv("CDCD_SCHEMA_REGISTRY__URL", "http://r:8081")
    monkeypatch.setenv("CDCD_SPARK_REGISTRY_PASSWORD", "pw")
    args = parser().parse_args(
        ["--topic-prefix", "p", "--checkpoint", "/c", "--mirror", "/m", "--key", "public.audit=id,at",
         "--kafka-option", "kafka.security.protocol=SSL", "--registry-user", "u", "--available-now"]
    )  # fmt: skip
    opts = options(args)
    assert (opts.bootstrap_servers, opts.registry_url, opts.registry_auth) == ("k:9092", "http://r:8081", ("u", "pw"))
    assert opts.keys == {"public.audit": ("id", "at")}
    assert opts.kafka_options == {"kafka.security.protocol": "SSL"}
    assert opts.available_now
    assert opts.changelog is None
    assert opts.trigger_interval == "5 seconds"


def test_missing_servers_and_malformed_pairs_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDCD_KAFKA__BOOTSTRAP_SERVERS", raising=False)
    with pytest.raises(UsageError, match="missing --bootstrap-servers"):
        options(parser().parse_args(["--topic-prefix", "p", "--checkpoint", "/c", "--registry-url", "http://r"]))
    args = parser().parse_args(["--topic-prefix", "p", "--checkpoint", "/c", "--bootstrap-servers", "k",
                                "--registry-url", "http://r", "--key", "nokey"])  # fmt: skip
    with pytest.raises(UsageError, match="expected KEY=VALUE"):
        options(args)


def test_iceberg_and_envelope_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDCD_KAFKA__BOOTSTRAP_SERVERS", "k:9092")
    monkeypatch.setenv("CDCD_SCHEMA_REGISTRY__URL", "http://r:8081")
    args = parser().parse_args(
        ["--topic-prefix", "p", "--checkpoint", "/c", "--mirror", "mirror", "--format", "iceberg", "--catalog", "lake",
         "--warehouse", "/w", "--envelope", "debezium", "--unavailable-value-placeholder", "__gone"]
    )  # fmt: skip
    opts = options(args)
    assert (opts.format, opts.catalog, opts.warehouse, opts.catalog_uri) == ("iceberg", "lake", "/w", None)
    assert (opts.envelope, opts.unavailable_placeholder) == ("debezium", "__gone")
    assert type(opts.tables()).__name__ == "IcebergTables"
    defaults = options(parser().parse_args(["--topic-prefix", "p", "--checkpoint", "/c", "--mirror", "/m"]))
    assert (defaults.format, defaults.envelope, defaults.unavailable_placeholder) == (
        "delta",
        "auto",
        "__debezium_unavailable_value",
    )
    with pytest.raises(UsageError, match="for --format iceberg"):
        options(parser().parse_args(["--topic-prefix", "p", "--checkpoint", "/c", "--warehouse", "/w"]))
    with pytest.raises(SystemExit):
        parser().parse_args(["--topic-prefix", "p", "--checkpoint", "/c", "--envelope", "avro"])


def test_a_command_line_that_cannot_work_exits_2_naming_the_problem(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CDCD_KAFKA__BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("CDCD_SCHEMA_REGISTRY__URL", "http://r:8081")
    with pytest.raises(SystemExit) as exited:  # before any Spark session
        main(["--topic-prefix", "p", "--checkpoint", "/c", "--mirror", "/m"])
    assert exited.value.code == 2
    assert "missing --bootstrap-servers" in capsys.readouterr().err
    monkeypatch.setenv("CDCD_KAFKA__BOOTSTRAP_SERVERS", "k:9092")
    with pytest.raises(SystemExit) as exited:
        main(["--topic-prefix", "p", "--checkpoint", "/c", "--mirror", "/m", "--conf", "spark.x"])
    assert exited.value.code == 2

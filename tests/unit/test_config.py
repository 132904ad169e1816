"""Configuration: YAML, environment overrides, and errors that name the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcd.cli import main
from cdcd.config import ConfigError, load_settings, parse_size


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cdcd.yaml"
    path.write_text(text)
    return path


def test_yaml_with_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "source:\n  dsn: host=a\n  slot: from_file\nbuffer:\n  memory_limit: 16MiB\n")
    monkeypatch.setenv("CDCD_SOURCE__SLOT", "from_env")
    monkeypatch.setenv("CDCD_BUFFER__SPILL_DIR", str(tmp_path))
    settings = load_settings(path)
    assert settings.source.slot == "from_env"
    assert settings.source.dsn.get_secret_value() == "host=a"
    assert settings.buffer.memory_limit == 16 * 1024 * 1024
    assert settings.buffer.spill_dir == tmp_path
    assert [p.name for p in settings.source.publications] == ["cdcd"]


def test_env_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDCD_SOURCE__DSN", "host=b password=secret")
    settings = load_settings(None)
    assert settings.source.dsn.get_secret_value() == "host=b password=secret"
    assert "secret" not in repr(settings)


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("source: {}\n", ["source.dsn", "Field required"]),
        ("source: {dsn: 'host=x', slot: Bad-Name}\n", ["source.slot", "lower-case"]),
        ("source: {dsn: 'host=x', slott: a}\n", ["source.slott", "Extra inputs", "did you mean slot?"]),
        (
            "source: {dsn: 'host=x'}\nkafka: {heartbeat: {interval_ms: 5000}}\n",
            ["kafka.heartbeat.interval_ms", "did you mean interval_s?"],
        ),
        (
            "source: {dsn: 'host=x', publications: [{name: p, include_table: [a]}]}\n",
            ["source.publications.0.include_table", "did you mean include_tables?"],
        ),
        (
            "source: {dsn: 'host=x'}\ncolumns: {tables: {public.t: {exlude: [a]}}}\n",
            ["columns.tables.public.t.exlude", "did you mean exclude?", "env CDCD_COLUMNS__TABLES, as JSON"],
        ),
        (
            "source: {dsn: 'host=x'}\nkafka: {decimal.handling.mode: string}\n",
            [
                "Debezium's decimal.handling.mode; cdcd: none: kafka.envelope debezium writes what Debezium's default",
                "env CDCD_KAFKA, as JSON: decimal.handling.mode holds a dot",
            ],
        ),
        (
            "source: {dsn: 'host=x'}\nheartbeat_interval_ms: 100\n",
            ["Debezium's heartbeat.interval.ms; cdcd: kafka.heartbeat.interval_s (seconds)"],
        ),
        ("source: {dsn: 'host=x'}\nsignals: {source: a}\n", ["signals.source", "the keys here: kafka"]),
        ("source: {dsn: 'host=x', protocol_version: 7}\n", ["protocol_version"]),
        ("source: {dsn: 'host=x', publications: [{name: p, tables: [{name: nodot}]}]}\n", ["schema.table"]),
        (
            "source: {dsn: 'host=x', publications: [{name: p, all_tables: true, tables: [{name: a.b}]}]}\n",
            ["exclusive"],
        ),
        ("source: {dsn: 'host=x', publications: [{name: p}, {name: p}]}\n", ["duplicate publication"]),
        ("source: {dsn: 'host=x'}\nbuffer: {memory_limit: lots}\n", ["buffer.memory_limit", "not a size"]),
        ("- just\n- a list\n", ["mapping at the top level"]),
        ("source: [unclosed\n", ["not valid YAML"]),
        (
            "source: {dsn: 'host=x'}\nkafka: {heartbeat: {action_query: 'UPDATE hb SET at = now()'}}\n",
            ["kafka.heartbeat", "set interval_s too"],
        ),
        ("source: {dsn: 'host=x'}\nkafka: {heartbeat: {interval_s: -1}}\n", ["kafka.heartbeat.interval_s"]),
        ("source: {dsn: 'host=x'}\nkafka: {heartbeat: {interval_s: 1, topic: 'a b'}}\n", ["heartbeat topic"]),
    ],
)
def test_bad_config_is_named(tmp_path: Path, text: str, fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text))
    for fragment in fragments:
        assert fragment in str(info.value)


def test_several_problems_reported_together(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, "source: {dsn: 'host=x', slot: BAD, streaming: maybe}\n"))
    assert "2 problems" in str(info.value)
    assert "source.slot" in str(info.value)
    assert "source.streaming" in str(info.value)


def test_cli_exits_2_on_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", str(write(tmp_path, "source: {dsn: 'host=x', nope: 1}\n"))]) == 2
    assert "source.nope" in capsys.readouterr().err
    assert main(["tail", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read config file" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "value"), [(5, 5), ("64MiB", 64 << 20), ("512k", 512 << 10), ("1 GB", 1 << 30)])
def test_parse_size(text: object, value: int) -> None:
    assert parse_size(text) == value


def test_kafka_connection_settings_reach_every_client_and_secrets_are_masked(tmp_path: Path) -> None:
    from cdcd.secrets import redact  # noqa: PLC0415

    path = tmp_path / "c.yaml"
    path.write_text(
        "source: {dsn: 'host=db'}\n"
        "kafka:\n  bootstrap_servers: b:9093\n  producer: {security.protocol: SASL_SSL, sasl.mechanism: PLAIN,"
        " sasl.username: cdcd, sasl.password: k-secret, ssl.ca.location: /ca.pem, linger.ms: 5}\n"
        "schema_registry: {url: 'https://r', client: {basic.auth.user.info: 'cdcd:r-secret'}}\n"
    )
    settings = load_settings(path)
    assert settings.kafka.client_config() == {
        "bootstrap.servers": "b:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "cdcd",
        "sasl.password": "k-secret",
        "ssl.ca.location": "/ca.pem",
    }
    assert settings.schema_registry.client_config() == {
        "url": "https://r",
        "basic.auth.user.info": "cdcd:r-secret",
        "timeout": 10.0,
        "max.retries": 0,
    }
    assert "secret" not in redact("failed with k-secret and r-secret")


def test_heartbeat_topic_defaults_to_debeziums(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, "source: {dsn: 'host=x'}\nkafka: {topic_prefix: shop}\n"))
    assert settings.kafka.heartbeat.interval_s == 0  # off unless asked for
    assert settings.kafka.heartbeat_topic == "__debezium-heartbeat.shop"

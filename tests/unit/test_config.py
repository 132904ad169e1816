"""Configuration: YAML, environment overrides, and errors that name the problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdcd import secrets
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
        (
            "source: {dsn: 'host=x', message.prefix.include.list: audit}\n",
            ["Debezium's message.prefix.include.list; cdcd: source.message_prefixes.include"],
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


# -- secrets: read after parsing, by every command but `cdcd check --offline` and `cdcd status` -----------------

SECRETS = (
    "source: {dsn: 'host=/nonexistent port=1', password_file: /nonexistent/pg.password}\n"
    "columns: {hash_salt_env: CDCD_TEST_SALT, tables: {crm.people: {mask: {email: hash}}}}\n"
    "kafka: {producer: {security.protocol: SSL, ssl.key.location: /nonexistent/key.pem}}\n"
)


def test_secrets_are_read_after_parsing_each_named_with_its_key(tmp_path: Path) -> None:
    path = write(tmp_path, SECRETS)
    settings = load_settings(path, read_secrets=False)  # parses, reads no secret
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(info.value) == (
        "the configuration's secrets cannot be read (2 problems):\n"
        "  - cannot read source.password_file /nonexistent/pg.password: No such file or directory (file key"
        " source.password_file or env CDCD_SOURCE__PASSWORD_FILE)\n"
        "  - columns.hash_salt_env names CDCD_TEST_SALT, which is not set"
    )
    with pytest.raises(ConfigError, match=r"columns\.hash_salt_env names CDCD_TEST_SALT, which is not set"):
        settings.columns.rules()  # a secret is read where it is used, if it was not read before


def test_an_empty_secret_file_is_named(tmp_path: Path) -> None:
    empty = tmp_path / "pg.password"
    empty.write_text("\n")
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, f"source: {{dsn: 'host=x', password_file: {empty}}}\n"))
    assert f"source.password_file {empty} is empty (file key source.password_file or env" in str(info.value)


def test_check_offline_reads_no_secret_and_contacts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Online, this configuration fails (its secrets are missing, its source away); offline it is valid."""
    monkeypatch.setattr(secrets, "_secrets", set())  # other tests registered "secret" as one: masked in output
    read: list[Path] = []
    read_text = Path.read_text

    def reading(self: Path, *args: Any, **kwargs: Any) -> str:
        read.append(self)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", reading)
    path = write(tmp_path, SECRETS + "sink: {kind: kafka}\nschema_registry: {url: 'http://127.0.0.1:1'}\n")
    assert main(["check", "--offline", "--config", str(path)]) == 0
    printed = capsys.readouterr()
    assert (
        printed.out == "cdcd check: configuration is valid (offline: secrets not read, source and sink not contacted)\n"
    )
    assert printed.err == ""
    assert read == [path]
    assert main(["check", "--config", str(path)]) == 2
    assert "the configuration's secrets cannot be read (2 problems)" in capsys.readouterr().err


def test_check_offline_reports_configuration_errors_and_warns_of_a_missing_sink(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(tmp_path, "source: {dsn: 'host=x', slott: a}\n")
    assert main(["check", "--offline", "--config", str(bad)]) == 2
    assert "source.slott: Extra inputs are not permitted: did you mean slot?" in capsys.readouterr().err
    no_sink = write(tmp_path, "source: {dsn: 'host=x'}\n")
    assert main(["check", "--offline", "--config", str(no_sink)]) == 0
    printed = capsys.readouterr()
    assert printed.out.startswith("cdcd check: configuration is valid")
    assert printed.err.startswith(
        "cdcd check: warning: sink.kind is not set (file key sink.kind or env CDCD_SINK__KIND)"
    )


def test_cdcd_status_reads_no_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It needs metrics.listen only: asked where nothing answers, it fails to reach the daemon (exit 1), not 2."""
    path = write(tmp_path, SECRETS + "metrics: {listen: '127.0.0.1:1'}\n")
    assert main(["status", "--config", str(path), "--timeout", "2"]) == 1
    assert "secrets" not in capsys.readouterr().err

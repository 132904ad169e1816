"""`cdcd --version`: the version and the row stage that runs (tests/packaging checks it on the installed wheel);
`cdcd snapshot` under snapshot.read_only; `cdcd run` needs sink.kind, the other commands do not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdcd import __version__
from cdcd.cli import main
from cdcd.config import load_settings

# Read at collection, as cdcd.rowstage reads it at import: the unit tests' fixture clears CDCD_* before each test.
REQUESTED = os.environ.get("CDCD_IMPL", "").strip().lower() or "native"


def test_version_names_the_row_stage(capsys: pytest.CaptureFixture[str]) -> None:
    """`make test` runs the unit tests with CDCD_IMPL=native and =python: each must be the one reported."""
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"cdcd {__version__} (row stage: {REQUESTED})\n"


@pytest.mark.parametrize(
    ("signals", "told"),
    [
        ("signals: {kafka: {topic: ops-signal}}\n", "to the signal topic ops-signal, keyed 'shop'"),
        ("", "(set signals.kafka.topic first)"),
    ],
)
def test_cdcd_snapshot_refuses_under_read_only_and_tells_the_signal_to_send(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, signals: str, told: str
) -> None:
    """Nothing is written to the source (the DSN names no server: it is never connected to)."""
    monkeypatch.setattr("cdcd.cli.configure", lambda settings: None)  # the logs of later tests stay where they are
    config = tmp_path / "cdcd.yaml"
    config.write_text(
        "source: {dsn: 'host=/nonexistent port=1'}\nkafka: {topic_prefix: shop}\nsnapshot: {read_only: true}\n"
        + signals
    )
    assert main(["snapshot", "--config", str(config), "--table", "public.t", "--where", "id > 1"]) == 2
    error = capsys.readouterr().err
    assert "snapshot.read_only is on" in error
    assert told in error
    signal = json.loads(error[error.index("valued ") + len("valued ") :])
    assert signal == {
        "type": "execute-snapshot",
        "data": {
            "data-collections": ["public.t"],
            "type": "incremental",
            "additional-conditions": [{"data-collection": "public.t", "filter": "id > 1"}],
        },
    }


NO_SINK = "source: {dsn: 'host=/nonexistent port=1'}\n"


def test_cdcd_run_refuses_a_configuration_without_a_sink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A forgotten sink must not stream into a terminal and confirm positions: exit 2 before any connection."""
    config = tmp_path / "cdcd.yaml"
    config.write_text(NO_SINK)
    assert main(["run", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        "cdcd: sink.kind is not set (file key sink.kind or env CDCD_SINK__KIND): `cdcd run` needs to know where"
        " changes go: kafka, or jsonl (JSON lines appended to sink.path, - for stdout); `cdcd tail` prints them"
        " without it\n"
    )


def test_the_notification_topic_still_names_the_kafka_sink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "cdcd.yaml"
    config.write_text(NO_SINK + "notifications: {kafka: {topic: cdcd.notifications}}\n")
    assert main(["run", "--config", str(config)]) == 2
    assert "notifications.kafka.topic is written by the Kafka sink: set sink.kind to kafka" in capsys.readouterr().err


def test_the_sink_kind_from_the_environment_is_enough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "cdcd.yaml"
    config.write_text(NO_SINK)
    monkeypatch.setenv("CDCD_SINK__KIND", "jsonl")
    assert load_settings(config).sink.run_kind() == "jsonl"


def test_cdcd_tail_needs_no_sink(tmp_path: Path) -> None:
    """`cdcd tail` prints JSON lines by design: it goes on to the source (here, none answers: exit 1)."""
    config = tmp_path / "cdcd.yaml"
    config.write_text(
        "source: {dsn: 'host=/nonexistent port=1', reconnect: {initial_backoff_s: 0.01, max_attempts: 1}}\n"
        f"snapshot: {{state_dir: {tmp_path / 'state'}}}\nbuffer: {{spill_dir: {tmp_path / 'spill'}}}\n"
        "metrics: {listen: ''}\nlog: {format: json}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCD_")}
    tail = subprocess.run(
        [sys.executable, "-m", "cdcd", "tail", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert tail.returncode == 1, tail.stderr
    assert "source failed" in tail.stderr
    assert "sink.kind" not in tail.stderr

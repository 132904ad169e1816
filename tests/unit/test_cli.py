"""`cdcd --version`: the version and the row stage that runs (tests/packaging checks it on the installed wheel);
`cdcd snapshot` under snapshot.read_only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cdcd import __version__
from cdcd.cli import main

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

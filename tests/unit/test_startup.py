"""What `cdcd run` imports before its loop starts: the modules it needs only once streaming (or never) stay out.

Start-up time itself is measured by benchmarks/startup.py; this guards the structure that makes it short.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cdcd.source import walsender

# Imported only when used: the Kafka sink's module and its clients (the sink is built after the configuration is
# read), fastavro (transaction metadata encoding), the checks of `cdcd check`, the JSON-lines sink; rich never.
LATER = ("rich", "confluent_kafka", "fastavro", "httpx", "cdcd.sink.kafka", "cdcd.source.checks", "cdcd.sink.jsonl")
# The Kafka sink's module is loaded before the slot is active, its registry client (HTTP, TLS) as streaming starts.
REGISTRY = ("confluent_kafka.schema_registry", "httpx", "fastavro")

_PROBE = """
import json, sys
from cdcd.entry import block_unused
block_unused()
import cdcd.cli
{more}
print(json.dumps(sorted(name for name, module in sys.modules.items() if module is not None)))
"""


def _imported_by_cli(more: str = "") -> set[str]:
    probe = _PROBE.format(more=more)
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    return set(json.loads(found.stdout))


def test_the_cli_imports_no_module_it_needs_only_later() -> None:
    imported = _imported_by_cli()
    assert "cdcd.replication.loop" in imported  # the probe imported what `cdcd run` imports
    assert sorted(imported & set(LATER)) == []


def test_the_kafka_sinks_load_no_registry_client() -> None:
    imported = _imported_by_cli(
        "import cdcd.sink.kafka, cdcd.sink.transactional, cdcd.sink.registry, cdcd.sink.transport"
    )
    assert "confluent_kafka" in imported
    assert sorted(imported & set(REGISTRY)) == []


def test_structlog_renders_without_rich_once_blocked() -> None:
    probe = (
        "from cdcd.entry import block_unused; block_unused(); import structlog.dev as d; "
        "print(d.default_exception_formatter.__name__)"
    )
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert found.stdout.strip() == "plain_traceback"


class _Conn:
    closed = 0

    def close(self) -> None:
        _Conn.closed += 1


def test_a_connection_made_meanwhile_is_handed_over_or_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(walsender, "connect", lambda *args, **kwargs: _Conn())
    made = walsender._Connecting("dsn", None)
    assert isinstance(made.result(), _Conn)
    walsender._Connecting("dsn", None).discard()  # the catalog connection failed: this one is not wanted
    assert _Conn.closed == 1


def test_a_connection_that_failed_meanwhile_raises_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: object, **kwargs: object) -> None:
        raise walsender.SourceDisconnected("cannot connect to PostgreSQL: refused")

    monkeypatch.setattr(walsender, "connect", refused)
    with pytest.raises(walsender.SourceDisconnected, match="refused"):
        walsender._Connecting("dsn", None).result()
    walsender._Connecting("dsn", None).discard()  # nothing to close, nothing raised

"""The stack's Prometheus scrapes a real `cdcd run`: what the workload committed comes back through the HTTP query
API, the dashboard's queries evaluate on the real series, and no alert is pending on a healthy daemon."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ROOT, STACK, Database, stack_env
from tests.integration.kafka_harness import Run
from tests.integration.workload import SCHEMA

pytestmark = pytest.mark.integration

DASHBOARD = ROOT / "deploy" / "grafana" / "cdcd-dashboard.json"


@dataclass
class Prometheus:
    url: str
    targets: Path  # file_sd directory of job "cdcd"

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{expr}: HTTP {exc.code} {exc.read().decode()}") from exc
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]  # type: ignore[no-any-return]

    def value(self, expr: str) -> float | None:
        """The single sample of an instant query (None when empty)."""
        result = self.query(expr)
        assert len(result) <= 1, (expr, result)
        return float(result[0]["value"][1]) if result else None

    def wait(self, what: str, condition: Callable[[], bool], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"Prometheus never showed {what}"
            time.sleep(0.25)


@pytest.fixture(scope="session")
def prometheus() -> Prometheus:
    subprocess.run([str(STACK), "up", "prometheus"], check=True, env=os.environ.copy())
    env = stack_env("15")
    return Prometheus(env["STACK_PROMETHEUS_URL"], Path(env["STACK_PROMETHEUS_TARGETS"]))


@pytest.fixture
def scraped(prometheus: Prometheus, run: Run, db: Database) -> Iterator[tuple[Prometheus, str]]:
    """`cdcd run` started on the workload schema and registered as a target; yields its instance label."""
    db.execute(SCHEMA)
    db.execute("INSERT INTO audit VALUES (0, 'before the slot', 0)")  # one initial-snapshot row (op r)
    run.start()
    instance = run.metrics_url().removeprefix("http://")
    target = prometheus.targets / f"{db.name}.json"
    tmp = target.with_suffix(".tmp")  # written aside and renamed: file_sd never reads half a file
    tmp.write_text(json.dumps([{"targets": [instance], "labels": {"test": db.name}}]))
    tmp.rename(target)
    try:
        prometheus.wait(
            f"up{{instance={instance!r}}} == 1",
            lambda: prometheus.value(f'up{{job="cdcd", instance="{instance}"}}') == 1,
        )
        yield prometheus, instance
    finally:
        target.unlink(missing_ok=True)


def test_prometheus_sees_the_workload(scraped: tuple[Prometheus, str], run: Run, db: Database) -> None:
    prom, instance = scraped
    sel = f'job="cdcd", instance="{instance}"'

    def events(op: str) -> float | None:
        return prom.value(f'cdcd_events_total{{{sel}, table="public.items", op="{op}"}}')

    # two steps with a scrape in between, so the counter has a rate to show
    db.execute("INSERT INTO items SELECT g, 'v' || g, g FROM generate_series(1, 100) g")
    prom.wait("the first 100 inserts", lambda: events("c") == 100)
    db.execute("INSERT INTO items SELECT g, 'v' || g, g FROM generate_series(101, 500) g")
    db.execute("UPDATE items SET n = -n WHERE id <= 10")
    db.execute("DELETE FROM items WHERE id > 495")
    db.execute("INSERT INTO audit VALUES (1, 'a', 1), (2, 'b', 2)")
    run.sync()
    prom.wait("every event", lambda: (events("c"), events("u"), events("d")) == (500, 10, 5))
    assert prom.value(f'cdcd_events_total{{{sel}, table="public.audit", op="c"}}') == 2
    assert prom.value(f'cdcd_events_total{{{sel}, table="public.audit", op="r"}}') == 1
    assert prom.value(f"cdcd_snapshot_tables_pending{{{sel}}}") == 0
    assert prom.value(f'sum(cdcd_events_total{{{sel}, op=~"c|u|d"}})') == 517
    assert (prom.value(f'rate(cdcd_events_total{{{sel}, table="public.items", op="c"}}[1m])') or 0) > 0
    # plain, or streamed on PostgreSQL 16+ (the harness makes every transaction stream there)
    assert (prom.value(f'sum(cdcd_transactions_total{{{sel}, outcome="commit"}})') or 0) >= 5

    # everything is acknowledged: the oldest unacknowledged change has no age, and the byte lag is what the
    # daemon's own positions say (same scrape), small since the sync
    prom.wait("lag seconds back to 0", lambda: prom.value(f"cdcd_replication_lag_seconds{{{sel}}}") == 0)
    lag = prom.value(f"cdcd_replication_lag_bytes{{{sel}}}")
    assert lag is not None
    assert 0 <= lag < 16 << 20
    assert (
        prom.value(f"cdcd_replication_lag_bytes{{{sel}}} - (cdcd_received_lsn{{{sel}}} - cdcd_flushed_lsn{{{sel}}})")
        == 0
    )
    prom.wait("slot retained WAL", lambda: (prom.value(f"cdcd_slot_retained_wal_bytes{{{sel}}}") or 0) > 0)
    assert prom.value(f'cdcd_connected{{{sel}, target="postgresql"}}') == 1
    assert prom.value(f'cdcd_connected{{{sel}, target="sink"}}') == 1
    assert prom.value(f"cdcd_delivery_errors_total{{{sel}}}") == 0
    assert (prom.value(f"cdcd_commit_to_ack_seconds_count{{{sel}}}") or 0) >= 5

    # the dashboard's queries, with its variables filled in, run on these series
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in [p for row in dashboard["panels"] for p in [row, *row.get("panels", [])]]:
        for target in panel.get("targets", []):
            expr = re.sub(r"\$__rate_interval", "1m", target["expr"])
            expr = expr.replace("$job", "cdcd").replace("$instance", instance)
            result = prom.query(expr)
            if "cdcd_filtered_events_total" not in expr:  # no row filter in this run: no series
                assert result, (panel["title"], expr)

    # a healthy daemon: no alert of the rule file pending or firing for it
    assert prom.query(f'ALERTS{{instance="{instance}"}}') == []
    assert run.stop() == 0

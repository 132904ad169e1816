"""deploy/grafana/cdcd-dashboard.json is a well-formed dashboard whose queries use only metrics cdcd exposes."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cdcd.metrics import Metrics, State
from cdcd.snapshot.meter import SnapshotMeters

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "cdcd-dashboard.json"

# PromQL words that are neither functions (followed by "(") nor metric names
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}


class _Sink:
    def __init__(self) -> None:
        self.events = Counter({("public.items", "c"): 1})
        self.delivery_errors = 0

    def in_flight(self) -> int:
        return 0

    def ready(self) -> bool:
        return True


def exposed_names() -> set[str]:
    """Sample names cdcd's metrics endpoint serves, with every labelled family populated."""
    meters = SnapshotMeters()
    meters.start("public.items", "initial", "a1", estimated=10, rows=0, now=0.0)
    state = State(
        slot_retained_wal_bytes=1,
        transactions={("plain", "commit"): 1},
        filtered={"public.items": 1},
        snapshot_meters=meters,
    )
    metrics = Metrics(state, _Sink(), health_timeout_s=5)
    metrics.observe_done(0)
    text = generate_latest(metrics.registry).decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers left once strings, label matchers, ranges,
    grouping clauses, function calls, keywords and numbers are taken out."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    words = re.findall(r"(?<![\w$.])([A-Za-z_:][\w:]*)\b(?!\s*\()", expr)
    return {w for w in words if w not in _KEYWORDS}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows hold theirs
    return out


def test_metric_names_parser() -> None:
    expr = 'histogram_quantile(0.95, sum by (le) (rate(x_bucket{job="$job", a=~"b|c"}[$__rate_interval]))) / on (i) y'
    assert metric_names(expr) == {"x_bucket", "y"}


def test_dashboard_queries_use_only_exposed_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exposed = exposed_names()
    used: set[str] = set()
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names, (panel["title"], target["expr"])
            assert names <= exposed, (panel["title"], names - exposed)
            assert 'job="$job", instance=~"$instance"' in target["expr"], target["expr"]
            used |= names
    # the brief's panels: throughput, filtered, transactions, lags, slot WAL, latency, buffers, in flight,
    # delivery errors, connected state, snapshot progress
    assert {
        "cdcd_events_total",
        "cdcd_filtered_events_total",
        "cdcd_transactions_total",
        "cdcd_replication_lag_bytes",
        "cdcd_replication_lag_seconds",
        "cdcd_slot_retained_wal_bytes",
        "cdcd_commit_to_ack_seconds_bucket",
        "cdcd_buffer_bytes",
        "cdcd_in_flight_messages",
        "cdcd_delivery_errors_total",
        "cdcd_connected",
        "cdcd_snapshot_rows",
        "cdcd_snapshot_rows_estimated",
        "cdcd_snapshot_tables",
        "cdcd_snapshot_tables_done",
    } <= used


def test_dashboard_structure() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    assert {"job", "instance"} <= set(variables)
    for name in ("job", "instance"):  # label_values(<selector>, label): the selector's metric must exist too
        selector = re.fullmatch(r"label_values\((.*), \w+\)", variables[name]["query"]["query"])
        assert selector, name
        assert metric_names(selector[1]) <= exposed_names(), name
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    quantiles = set()
    for panel in panels(dashboard):
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            for target in panel["targets"]:
                quantiles |= set(re.findall(r"histogram_quantile\((0\.\d+)", target["expr"]))
    assert quantiles == {"0.5", "0.95", "0.99"}

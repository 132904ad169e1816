"""deploy/prometheus/cdcd-rules.yaml is valid and its promtool unit tests pass (each alert fires on a synthetic
series, and not below its threshold). promtool comes from `deploy/local/stack promtool`, which installs it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "deploy" / "local" / "stack"
RULES = ROOT / "deploy" / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(STACK), "promtool", *args], check=False, cwd=RULES, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "args",
    [("check", "rules", "cdcd-rules.yaml"), ("test", "rules", "cdcd-rules.test.yaml")],
    ids=["check", "test"],
)
def test_promtool(args: tuple[str, ...]) -> None:
    result = promtool(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_unit_test_and_a_runbook() -> None:
    import yaml  # noqa: PLC0415

    rules = yaml.safe_load((RULES / "cdcd-rules.yaml").read_text())
    tests = yaml.safe_load((RULES / "cdcd-rules.test.yaml").read_text())
    alerts = {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule}
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert set(alerts) == fired
    anchors = {"#wal-growth", "#slot-lost", "#kafka-down", "#cdcd-down"}
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == "docs/operations.md", name
        assert f"#{anchor}" in anchors, name

"""`make demo`'s flow on a slow machine: cdcd starts seconds late, and the demo still waits until it streams
before its workload, so every kind of event it exists to show arrives (a cold first run once showed 2 events: the
slot was made after the workload had committed, and the initial snapshot caught only the end state)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.integration.conftest import ROOT, PgServer

pytestmark = pytest.mark.integration


def test_the_demo_waits_for_a_late_cdcd_and_shows_every_event(pg15: PgServer, kafka_env: dict[str, str]) -> None:
    demo = subprocess.run(
        [sys.executable, str(ROOT / "deploy/local/demo.py"), "--no-mirror", "--start-delay", "6"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith("CDCD_") or k == "CDCD_IMPL"},
    )
    out = demo.stdout
    assert demo.returncode == 0, f"{out[-3000:]}\n{demo.stderr[-3000:]}"
    assert "NOT AS EXPECTED" not in out
    for line in ("demo.shop.customers    c          3", "demo.shop.customers    u          1",
                 "demo.shop.customers    d          1", "demo.shop.orders       c          1500",
                 "demo.shop.orders       t          1", "demo.message           m          1"):  # fmt: skip
        assert line in out, out[-3000:]
    assert "rows from a rolled-back savepoint: 0, from an aborted transaction: 0" in out

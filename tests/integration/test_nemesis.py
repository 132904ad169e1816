"""The nemesis (``tests/integration/nemesis.py``): a seeded schedule of faults on cdcd's links and process while a
mixed workload runs, in both delivery modes; the checker reads the topics back.

`make test` runs a fixed seed for ``NEMESIS_SECONDS`` (default 75) of faults per mode; `make soak SEED=…
MINUTES=…` runs the same for longer (docs/reliability.md records those runs). The report is printed (`-s`) and
written to ``NEMESIS_REPORT`` when that is set.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import STACK, PgServer, scratch_database, stack_env
from tests.integration.nemesis import Nemesis, lines

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("NEMESIS_SEED", "20261126"))
SECONDS = float(os.environ.get("NEMESIS_SECONDS", "75"))
BIG_ROWS = int(os.environ.get("NEMESIS_BIG_ROWS", "20000"))


@pytest.fixture(scope="module")
def toxiproxy_env(kafka_env: dict[str, str]) -> dict[str, str]:
    """Kafka, the registry and Toxiproxy up; the stack's environment (with the proxies' API address)."""
    subprocess.run([str(STACK), "up", "toxiproxy"], check=True, env=os.environ.copy())
    return {**kafka_env, **stack_env("15")}


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_faults_lose_nothing_and_hang_nothing(
    pg15: PgServer, toxiproxy_env: dict[str, str], tmp_path: Path, delivery: str
) -> None:
    with scratch_database(pg15) as db:
        nemesis = Nemesis(db, toxiproxy_env, tmp_path, delivery=delivery, seed=SEED, seconds=SECONDS, big_rows=BIG_ROWS)
        try:
            report = nemesis.run()
        finally:
            nemesis.close()
    summary = report.summary()
    print(f"\nnemesis {delivery} seed {SEED} {SECONDS:g} s:", *lines(report), sep="\n  ")
    if "NEMESIS_REPORT" in os.environ:
        with Path(os.environ["NEMESIS_REPORT"]).open("a") as out:
            out.write(json.dumps({"delivery": delivery, "seed": SEED, "seconds": SECONDS, **summary}) + "\n")
    assert report.events > 0
    assert summary["lost"] == 0, report.detail
    assert summary["phantom"] == 0, report.detail
    assert summary["out_of_order"] == 0, report.detail
    assert report.unrequested_exits == [], report.unrequested_exits
    assert all(report.tables_equal.values()), report.detail
    assert set(report.tables_equal) == {"acct", "snap"}
    if delivery == "exactly_once":
        assert summary["duplicated"] == 0, report.detail
    assert sum(report.faults.values()) >= SECONDS / 8  # the schedule did run
    assert summary["max_recovery_s"] <= 60, report.recoveries_s

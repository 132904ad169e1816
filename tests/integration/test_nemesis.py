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
import time
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo

from tests.http import get
from tests.integration import faults
from tests.integration.conftest import STACK, PgServer, scratch_database, stack_env
from tests.integration.kafka_harness import Run
from tests.integration.nemesis import Nemesis, lines

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("toxiproxy")]  # one worker: see conftest.py

SEED = int(os.environ.get("NEMESIS_SEED", "20261126"))
SECONDS = float(os.environ.get("NEMESIS_SECONDS", "75"))
BIG_ROWS = int(os.environ.get("NEMESIS_BIG_ROWS", "20000"))
STREAMED_EVERY_S = float(os.environ.get("NEMESIS_STREAMED_EVERY_S", "15"))


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
        nemesis = Nemesis(
            db,
            toxiproxy_env,
            tmp_path,
            delivery=delivery,
            seed=SEED,
            seconds=SECONDS,
            big_rows=BIG_ROWS,
            streamed_every_s=STREAMED_EVERY_S,
        )
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


def test_a_silent_partition_is_found_within_the_receive_timeout(
    pg15: PgServer, toxiproxy_env: dict[str, str], tmp_path: Path
) -> None:
    """Every byte between cdcd and PostgreSQL held, the connection left open (a partition, a host gone): cdcd gives
    the connection up after source.receive_timeout_s (TCP alone waits until the server's wal_sender_timeout, or
    ~15 min of retransmissions), reconnects once the partition heals, and loses nothing."""
    toxiproxy = faults.Toxiproxy(toxiproxy_env["STACK_TOXIPROXY_URL"])
    with scratch_database(pg15) as db, toxiproxy.temporary_proxy(f"partition-{db.name}", "127.0.0.1:5415") as proxy:
        db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION cdcd_pub FOR TABLE t")
        run = Run(db, toxiproxy_env, tmp_path)
        try:
            dsn = make_conninfo(db.dsn(db.server.streaming_options), port=proxy.port)
            run.start(source={"dsn": dsn, "receive_timeout_s": 4, "reconnect": {"max_backoff_s": 1}})
            url = run.metrics_url()
            db.execute("INSERT INTO t VALUES (1)")
            run.wait_confirmed()
            with (
                toxiproxy.fault(proxy.name, faults.timeout(0, "upstream")),
                toxiproxy.fault(proxy.name, faults.timeout(0, "downstream")),
            ):
                held = time.monotonic()
                while json.loads(get(f"{url}/status")[1])["state"] == "streaming":
                    assert time.monotonic() - held < 15, "cdcd still says streaming 15 s into a partition"
                    time.sleep(0.2)
                found = time.monotonic() - held
            db.execute("INSERT INTO t VALUES (2)")
            events = run.sync()
            assert [e.value["after"]["id"] for e in events if e.value and e.value.get("after")] == [1, 2]
            assert found <= 4 + 3, found
            assert run.stop() == 0
        finally:
            run.close()

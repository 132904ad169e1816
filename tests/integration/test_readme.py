"""The README's first configuration against the stack: its addresses are the stack's, `cdcd check` (offline, then
against the servers) passes, and a short `cdcd run` snapshots and streams the demo's two tables to Kafka and stops
with exit 0.

The test changes only what two runs on one stack cannot share, or what is the test's own: the database (one of the
test's, with the tables `make demo` creates, not `make demo`'s own), the slot and the topic prefix (names the whole
stack shares), the state and spill directories, and the metrics port."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.integration.conftest import ROOT, cdcd_env
from tests.integration.kafka_harness import Run
from tests.procs import spawn

pytestmark = pytest.mark.integration


def readme_configuration() -> dict[str, Any]:
    """The README's first YAML block, parsed."""
    match = re.search(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert match is not None, "the README has no yaml block"
    config = yaml.safe_load(match.group(1))
    assert isinstance(config, dict)
    return config


def demo_module() -> ModuleType:
    """deploy/local/demo.py (`make demo`), for its database's name and its tables."""
    spec = importlib.util.spec_from_file_location("cdcd_demo_script", ROOT / "deploy" / "local" / "demo.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cdcd(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "cdcd", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=cdcd_env(), timeout=90, check=False)


def wait_replicating(run: Run, timeout: float = 60) -> None:
    """Until the daemon's walsender streams (its initial snapshot taken): a row written now is a change, not a
    snapshot row."""
    query = (
        "SELECT r.state FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid"
        " WHERE s.slot_name = %s"
    )
    deadline = time.monotonic() + timeout
    while run.db.execute(query, [run.slot]) not in ([("streaming",)], [("catchup",)]):
        assert run.proc is not None
        assert run.proc.poll() is None, f"cdcd run exited {run.proc.returncode}:\n{run.log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"never streamed:\n{run.log.read_text()[-3000:]}"
        time.sleep(0.1)


def test_the_readme_first_configuration_runs_against_the_stack(run15: Run, tmp_path: Path) -> None:
    config = readme_configuration()
    demo = demo_module()

    # The README's addresses are the stack's, and its database is the one `make demo` leaves.
    assert config["kafka"]["bootstrap_servers"] == run15.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"]
    assert config["schema_registry"]["url"] == run15.env["CDCD_SCHEMA_REGISTRY__URL"]
    readme_dsn = conninfo_to_dict(config["source"]["dsn"])
    stack_dsn = conninfo_to_dict(run15.db.server.env["CDCD_SOURCE__DSN"])
    for key in ("host", "port", "user", "password"):
        assert readme_dsn[key] == stack_dsn[key], f"the README's DSN: {key}"
    assert readme_dsn["dbname"] == demo.DB
    assert config["sink"]["kind"] == "kafka"
    tables = [t["name"] for p in config["source"]["publications"] for t in p["tables"]]
    assert tables == ["shop.customers", "shop.orders"]

    # The test's own database, with make demo's tables, and a row in each before cdcd starts.
    demo.create_tables(run15.db.dsn())
    run15.db.execute("INSERT INTO shop.customers VALUES (1, 'Ada', 'London'), (2, 'Linus', 'Helsinki')")
    run15.db.execute("INSERT INTO shop.orders (customer, amount, note) VALUES (1, 9.50, 'first')")
    config["source"]["dsn"] = make_conninfo(config["source"]["dsn"], dbname=run15.db.name)
    config["source"]["slot"] = run15.slot
    config["kafka"]["topic_prefix"] = run15.prefix
    config["snapshot"]["state_dir"] = str(tmp_path / "state")
    config["buffer"]["spill_dir"] = str(tmp_path / "spill")
    config["metrics"]["listen"] = "127.0.0.1:0"
    path = tmp_path / "first.yaml"
    path.write_text(yaml.safe_dump(config))

    offline = cdcd("check", "--offline", "--config", str(path))
    assert offline.returncode == 0, offline.stdout + offline.stderr
    check = cdcd("check", "--config", str(path))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "ready" in check.stdout

    with run15.log.open("ab") as log:
        run15.proc = spawn(
            [sys.executable, "-m", "cdcd", "run", "--config", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=cdcd_env(),
        )
    wait_replicating(run15)
    run15.db.execute("INSERT INTO shop.customers VALUES (3, 'Grace', NULL)")
    run15.db.execute("UPDATE shop.orders SET amount = 10 WHERE id = 1")
    events = run15.sync()

    def seen(table: str) -> set[tuple[str, int]]:
        topic = f"{run15.prefix}.shop.{table}"
        return {(e.value["op"], e.key["id"]) for e in events if e.topic == topic and e.value and e.key}

    assert seen("customers") == {("r", 1), ("r", 2), ("c", 3)}
    assert seen("orders") == {("r", 1), ("u", 1)}
    assert run15.stop() == 0
    assert run15.logged("stopped")

"""`cdcd check` and start-up failures against a real server: every problem named, in one report."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import STACK, Database, Tail, cdcd_env, stack_env
from tests.procs import spawn

pytestmark = pytest.mark.integration


def run_cdcd(*args: str, config: Mapping[str, object], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "check.yaml"
    path.write_text(yaml.safe_dump({"metrics": {"listen": "127.0.0.1:0"}, **config}))
    env = cdcd_env()
    return subprocess.run(
        [sys.executable, "-m", "cdcd", *args, "--config", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_check_passes_on_a_ready_database(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t")
    config = {"source": {"dsn": db.dsn(), "slot": f"s_{db.name}", "publications": [{"name": "p"}]}}
    result = run_cdcd("check", config=config, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ready" in result.stdout


def test_check_reports_every_problem_at_once(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int); ALTER TABLE t REPLICA IDENTITY NOTHING")
    db.execute("CREATE ROLE lowly LOGIN PASSWORD 'pw'")
    try:
        config = {
            "source": {
                "dsn": db.dsn() + " user=lowly password=pw",
                "slot": f"s_{db.name}",
                "create_slot": False,
                "publications": [{"name": "missing_pub", "tables": [{"name": "public.t"}, {"name": "public.nope"}]}],
            }
        }
        result = run_cdcd("check", config=config, tmp_path=tmp_path)
    finally:
        db.execute("DROP ROLE lowly")
    assert result.returncode == 1
    problems = result.stderr
    assert "5 problem(s)" in problems
    for fragment in (
        "role 'lowly' lacks the REPLICATION attribute",
        "publication 'missing_pub' does not exist",
        "table public.t has REPLICA IDENTITY NOTHING",
        "table public.nope does not exist",
        f"slot 's_{db.name}' does not exist and create_slot is false",
    ):
        assert fragment in problems


def test_unreachable_server_is_named(tmp_path: Path) -> None:
    config = {"source": {"dsn": "host=127.0.0.1 port=1 dbname=x user=x connect_timeout=2"}}
    result = run_cdcd("check", config=config, tmp_path=tmp_path)
    assert result.returncode == 1
    assert "cannot connect to PostgreSQL" in result.stderr
    assert "port 1" in result.stderr


def test_tail_refuses_a_missing_publication(db: Database, tmp_path: Path) -> None:
    config = {"source": {"dsn": db.dsn(), "slot": f"s_{db.name}", "publications": [{"name": "nope"}]}}
    result = run_cdcd("tail", config=config, tmp_path=tmp_path)
    assert result.returncode == 1
    assert "publication(s) nope do not exist" in result.stderr


def test_an_active_slot_is_waited_for_then_given_up(db: Database, tail_factory: Callable[..., Tail]) -> None:
    """A slot held by another connection (after a lost connection, usually this process's own old walsender, which
    the server keeps until wal_sender_timeout) is retried with backoff: a second consumer takes over once the first
    goes, and one that waits past reconnect.slot_active_wait_s stops with the reason."""
    db.execute("CREATE TABLE items (id int PRIMARY KEY); CREATE PUBLICATION cdcd_pub FOR TABLE items")
    first = tail_factory().start()
    first.wait_streaming()
    waiting = tail_factory(slot=first.slot)
    waiting.output, waiting.log = waiting.output.with_name("waiting.jsonl"), waiting.log.with_name("waiting.log")
    waiting.start()
    deadline = time.monotonic() + 30
    while "is active" not in (waiting.log.read_text() if waiting.log.exists() else ""):  # it read its config
        assert time.monotonic() < deadline, "the second consumer never tried the slot"
        time.sleep(0.1)
    # the same slot: the same config file name, written anew
    impatient = tail_factory(slot=first.slot, reconnect={"initial_backoff_s": 0.2, "slot_active_wait_s": 2})
    impatient.output, impatient.log = impatient.output.with_name("gives-up.jsonl"), impatient.log.with_name("gu.log")
    impatient.start()
    assert impatient.proc is not None
    assert impatient.proc.wait(timeout=30) == 1
    assert "is active: another connection" in impatient.log.read_text()
    assert "slot_active_wait_s" in impatient.log.read_text()
    assert waiting.proc is not None
    assert waiting.proc.poll() is None  # still waiting
    assert first.stop() == 0
    waiting.wait_streaming()
    db.execute("INSERT INTO items VALUES (1)")
    assert [line["after"] for line in waiting.wait_for(lambda lines: len(lines) == 1)] == [{"id": "1"}]


def test_manage_publications_creates_them(db: Database, tail_factory: Callable[..., Tail]) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    tail = tail_factory(
        publication="made_by_cdcd",
        manage_publications=True,
        publications=[{"name": "made_by_cdcd", "tables": [{"name": "public.items"}]}],
    ).start()
    tail.wait_streaming()
    assert db.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = 'made_by_cdcd'") == [("items",)]
    db.execute("INSERT INTO items VALUES (1)")
    lines = tail.wait_for(lambda lines: len(lines) >= 1)
    assert lines[0]["after"] == {"id": "1"}


def test_run_streams_to_the_configured_sink_and_stops_on_sigterm(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE items")
    sink = tmp_path / "changes.jsonl"
    config = {
        "source": {"dsn": db.dsn(), "slot": f"s_{db.name}", "publications": [{"name": "p"}], "status_interval_s": 0.2},
        "sink": {"kind": "jsonl", "path": str(sink)},
        "buffer": {"spill_dir": str(tmp_path / "spill")},
        "snapshot": {"state_dir": str(tmp_path / "state")},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    env = cdcd_env()
    proc = spawn(
        [sys.executable, "-m", "cdcd", "run", "--config", str(path)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while not db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", [f"s_{db.name}"]):
            assert time.monotonic() < deadline, "cdcd run never started streaming"
            time.sleep(0.1)
        db.execute("INSERT INTO items SELECT generate_series(1, 5)")
        while len(sink.read_text().splitlines() if sink.exists() else []) < 5:
            assert time.monotonic() < deadline + 30, "changes never reached the sink"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert [json.loads(line)["after"] for line in sink.read_text().splitlines()] == [
        {"id": str(i)} for i in range(1, 6)
    ]


def test_check_covers_kafka_and_the_registry(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t")
    for component in ("kafka", "registry"):
        subprocess.run([str(STACK), "up", component], check=True)
    env = stack_env("15")
    source = {"dsn": db.dsn(), "slot": f"s_{db.name}", "publications": [{"name": "p"}]}
    good = {
        "source": source,
        "sink": {"kind": "kafka"},
        "kafka": {"bootstrap_servers": env["CDCD_KAFKA__BOOTSTRAP_SERVERS"]},
        "schema_registry": {"url": env["CDCD_SCHEMA_REGISTRY__URL"]},
    }
    result = run_cdcd("check", config=good, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "kafka sink are ready" in result.stdout
    bad = {**good, "kafka": {"bootstrap_servers": "127.0.0.1:1"}, "schema_registry": {"url": "http://127.0.0.1:2"}}
    result = run_cdcd("check", config=bad, tmp_path=tmp_path)
    assert result.returncode == 1
    assert "2 problem(s)" in result.stderr
    assert "cannot reach Kafka at 127.0.0.1:1" in result.stderr
    assert "schema registry at http://127.0.0.1:2 does not answer" in result.stderr


@pytest.mark.every_pg  # the catalogs and plans differ per major
def test_check_with_the_documented_least_privilege_role(db: Database, tmp_path: Path) -> None:
    """docs/operations.md's role (REPLICATION, USAGE on the schema, SELECT on the captured tables): `cdcd check`
    passes whatever plan the catalog queries get (catalog statistics, join methods); a privilege it lacks or a
    catalog it may not read is a named problem, never a traceback."""
    role = f"r_{db.name}"
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, big text); CREATE TABLE customers (id int PRIMARY KEY)")
    db.execute("CREATE TABLE secret (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE orders, customers")
    db.execute(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'pw'; GRANT CONNECT ON DATABASE {db.name} TO {role}")
    db.execute(f"GRANT USAGE ON SCHEMA public TO {role}; GRANT SELECT ON orders, customers TO {role}")
    source = {"slot": f"s_{db.name}", "publications": [{"name": "p"}]}
    try:
        plans = {
            "default plan": "",
            "no hash joins": "-c enable_hashjoin=off",
            "join order as written": "-c join_collapse_limit=1 -c from_collapse_limit=1",
        }
        for plan, options in plans.items():
            for analyzed in (False, True):
                if analyzed:
                    db.execute("ANALYZE pg_class, pg_namespace, pg_publication, pg_publication_rel, pg_attribute")
                dsn = db.dsn(options) + f" user={role} password=pw"
                result = run_cdcd("check", config={"source": {**source, "dsn": dsn}}, tmp_path=tmp_path)
                assert result.returncode == 0, f"{plan}, analyzed={analyzed}:\n{result.stderr}"
        db.execute("ALTER PUBLICATION p ADD TABLE secret")
        db.execute("REVOKE SELECT ON pg_catalog.pg_replication_slots FROM PUBLIC")  # this database's catalog only
        dsn = db.dsn("-c enable_hashjoin=off") + f" user={role} password=pw"
        result = run_cdcd("check", config={"source": {**source, "dsn": dsn}}, tmp_path=tmp_path)
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr
        assert "no SELECT privilege on published table public.secret" in result.stderr
        assert "cannot check the replication slot: permission denied for view pg_replication_slots" in result.stderr
    finally:
        db.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


@pytest.mark.every_pg
def test_check_reports_whether_the_slot_survives_a_failover(
    db: Database, tmp_path: Path, tail_factory: Callable[..., Tail]
) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t")
    slot = f"s_{db.name}"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])  # never a failover slot
    config = {"source": {"dsn": db.dsn(), "slot": slot, "publications": [{"name": "p"}]}}
    result = run_cdcd("check", config=config, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    version = db.server.version
    if version < 17:
        assert f"failover slots are not available before PostgreSQL 17 (server {version})" in result.stderr
        explicit = run_cdcd("check", config={"source": {**config["source"], "failover": True}}, tmp_path=tmp_path)
        assert explicit.returncode == 2
        assert "source.failover is true but the server is PostgreSQL" in explicit.stderr
    else:
        assert f"warning: slot '{slot}' was created without failover" in result.stderr
        assert "warning: synchronized_standby_slots is empty" in result.stderr  # the shared server has no standby
        tail = tail_factory(slot=slot, publication="p").start()  # cdcd makes the existing slot a failover slot
        tail.wait_streaming()
        assert db.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", [slot]) == [(True,)]

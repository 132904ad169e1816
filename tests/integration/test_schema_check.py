"""`cdcd check` asks the schema registry whether each captured table's current schema fits its subjects, so a
migration can be tried on a staging database before it reaches the stream."""

from __future__ import annotations

import subprocess
import sys

from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.integration.conftest import Database, cdcd_env
from tests.integration.kafka_harness import Run


def _check(run: Run) -> subprocess.CompletedProcess[str]:
    config = run.tmp_path / "run.yaml"  # the config `cdcd run` ran with
    command = [sys.executable, "-m", "cdcd", "check", "--config", str(config)]
    return subprocess.run(command, capture_output=True, text=True, env=cdcd_env(), timeout=60, check=False)


def test_check_names_a_column_change_the_registry_would_refuse(run: Run, db: Database) -> None:
    db.execute(
        "CREATE TABLE c (id int PRIMARY KEY, v int); INSERT INTO c VALUES (1, 1);"
        "CREATE TABLE fresh (id int PRIMARY KEY); CREATE PUBLICATION cdcd_pub FOR TABLE c, fresh"
    )
    run.start()
    run.sync()
    assert run.stop() == 0
    topic = f"{run.prefix}.public.c"
    registry = SchemaRegistryClient({"url": run.env["CDCD_SCHEMA_REGISTRY__URL"]})
    registry.set_compatibility(f"{topic}-value", "BACKWARD")

    ok = _check(run)
    assert ok.returncode == 0, ok.stderr
    assert f"{run.prefix}.public.fresh-value is new" in ok.stderr  # never streamed: its first version is fine

    db.execute("ALTER TABLE c ALTER COLUMN v TYPE text")
    refused = _check(run)
    assert refused.returncode == 1, refused.stderr
    assert f"table public.c: the schema registry would refuse its current schema under {topic}-value" in refused.stderr
    assert "column v changed type from int to string" in refused.stderr
    assert len(registry.get_versions(f"{topic}-value")) == 1  # asked, never registered

    db.execute("ALTER TABLE c ALTER COLUMN v TYPE int USING v::int; ALTER TABLE c ADD COLUMN note text")
    added = _check(run)
    assert added.returncode == 0, added.stderr  # a nullable column with a default: BACKWARD compatible

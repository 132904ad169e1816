"""Kafka over TLS with SASL (the stack's SASL_SSL listener, a CA it made): cdcd produces through it with
credentials that never reach its output; a wrong password or an unknown CA stops it with the cause named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import Database, cdcd_env
from tests.integration.kafka_harness import Run

pytestmark = pytest.mark.integration


def sasl_ssl(env: dict[str, str], password: str | None = None, ca: str | None = None) -> dict[str, Any]:
    return {
        "bootstrap_servers": env["STACK_KAFKA_SASL_SSL"],
        "producer": {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": env["STACK_KAFKA_SASL_USER"],
            "sasl.password": password or env["STACK_KAFKA_SASL_PASSWORD"],
            "ssl.ca.location": ca or env["STACK_KAFKA_CA"],
        },
    }


def other_ca(tmp_path: Path) -> str:
    path = tmp_path / "other-ca.pem"
    key = str(tmp_path / "other.key")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=other",
            "-keyout",
            key,
            "-out",
            str(path),
        ],
        check=True,
        capture_output=True,
    )
    return str(path)


def check(run: Run, kafka: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    config = yaml.safe_load((run.tmp_path / "run.yaml").read_text())
    config["kafka"].update(kafka)
    path = run.tmp_path / "check.yaml"
    path.write_text(yaml.safe_dump(config))
    env = cdcd_env()
    return subprocess.run(
        [sys.executable, "-m", "cdcd", "check", "--config", str(path)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )


def test_sasl_ssl_produces_and_the_password_stays_out_of_the_output(run: Run, db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION cdcd_pub FOR TABLE t")
    run.start(**sasl_ssl(run.env))
    db.execute("INSERT INTO t SELECT generate_series(1, 50)")
    events = run.sync()  # read back through the plaintext listener of the same broker
    assert sorted(e.value["after"]["id"] for e in events if e.topic.endswith(".public.t") and e.value) == list(
        range(1, 51)
    )
    assert run.stop() == 0
    assert run.env["STACK_KAFKA_SASL_PASSWORD"] not in run.log.read_text()
    assert check(run, sasl_ssl(run.env)).returncode == 0


def test_wrong_password_or_unknown_ca_is_named_and_nothing_is_confirmed(run: Run, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION cdcd_pub FOR TABLE t")
    run.start()  # the slot and topics exist; confirmed position before the failing runs
    run.sync()
    assert run.stop() == 0
    confirmed = db.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", [run.slot])
    db.execute("INSERT INTO t VALUES (1)")

    wrong = "not-the-password-4711"
    result = check(run, sasl_ssl(run.env, password=wrong))
    assert result.returncode == 1
    assert "SASL authentication error" in result.stderr
    assert wrong not in result.stderr + result.stdout
    result = check(run, sasl_ssl(run.env, ca=other_ca(tmp_path)))
    assert result.returncode == 1
    assert "certificate verify failed" in result.stderr

    run.start(**sasl_ssl(run.env, password=wrong))
    assert run.proc is not None
    assert run.proc.wait(timeout=60) == 1
    log = run.log.read_text()
    assert "Kafka client error" in log
    assert "SASL authentication error" in log
    assert wrong not in log
    after = db.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", [run.slot])
    assert after == confirmed  # the insert was not confirmed: the next good run sends it

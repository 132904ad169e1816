"""Secrets and TLS against the stack's PostgreSQL 15: a password never appears in anything cdcd prints, and
`sslmode=verify-full` works against a server certificate from a CA made here (and fails with another CA)."""

from __future__ import annotations

import http.server
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from cdcd.secrets import redact, register_secret
from tests.integration.conftest import Database, PgServer, scratch_database
from tests.integration.workload import SCHEMA
from tests.procs import spawn

pytestmark = pytest.mark.integration


@pytest.fixture
def db15(pg15: PgServer) -> Iterator[Database]:
    with scratch_database(pg15) as database:
        database.execute(SCHEMA)
        yield database


@dataclass
class Role:
    name: str
    password: str


@pytest.fixture
def role(db15: Database) -> Iterator[Role]:
    """A least-privilege role: LOGIN REPLICATION, SELECT on the captured tables, nothing else."""
    made = Role(f"r_{uuid.uuid4().hex[:8]}", f"S3cr3t-{uuid.uuid4().hex}")
    db15.execute(f"CREATE ROLE {made.name} LOGIN REPLICATION PASSWORD '{made.password}'")
    db15.execute(f"GRANT SELECT ON items, audit TO {made.name}")
    yield made
    with psycopg.connect(db15.server.dsn(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [made.name])
    db15.execute(f"DROP OWNED BY {made.name}")
    db15.execute(f"DROP ROLE {made.name}")


def _dsn(db: Database, user: str, password: str | None = None, extra: str = "") -> str:
    dsn = f"host=127.0.0.1 port={db.server.env['PGPORT']} dbname={db.name} user={user}"
    return dsn + (f" password={password}" if password is not None else "") + (f" {extra}" if extra else "")


def _config(db: Database, tmp_path: Path, **source: Any) -> dict[str, Any]:
    return {
        "source": {
            "slot": f"s_{db.name}",
            "publications": [{"name": "cdcd_pub"}],
            "status_interval_s": 0.3,
            "reconnect": {"initial_backoff_s": 0.1, "max_attempts": 1},
            **source,
        },
        "sink": {"kind": "jsonl", "path": str(tmp_path / "changes.jsonl"), "flush_timeout_s": 10},
        "buffer": {"spill_dir": str(tmp_path / "spill")},
        "snapshot": {"state_dir": str(tmp_path / "state")},
        "metrics": {"listen": "127.0.0.1:0"},
        "log": {"level": "debug", "format": "json"},
    }


def _env(**extra: str) -> dict[str, str]:
    """No CDCD_* or PG* from the test's environment: only what the test gives reaches libpq."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDCD_", "PG"))}
    return {**env, **extra}


def cdcd(
    command: str, config: dict[str, Any], tmp_path: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / f"{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "cdcd", command, "--config", str(path), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=_env(**env), timeout=90, check=False)


class Daemon:
    """`cdcd run` in the background, its stdout and stderr captured."""

    def __init__(self, db: Database, config: dict[str, Any], tmp_path: Path, command: str = "run") -> None:
        self.db, self.slot = db, config["source"]["slot"]
        tmp_path.mkdir(parents=True, exist_ok=True)
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump(config))
        self.stdout, self.stderr = tmp_path / "run.stdout", tmp_path / "run.stderr"
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            argv = [sys.executable, "-m", "cdcd", command, "--config", str(path)]
            self.proc = spawn(argv, stdout=out, stderr=err, env=_env())

    def output(self) -> str:
        return self.stdout.read_text() + self.stderr.read_text()

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:  # a failed assertion left it running
            self.proc.kill()
            self.proc.wait()

    def walsender_pid(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while True:
            rows = self.db.execute(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s AND active", [self.slot]
            )
            if rows:
                return int(rows[0][0])
            assert self.proc.poll() is None, f"cdcd run exited {self.proc.returncode}:\n{self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"never streamed:\n{self.output()[-3000:]}"
            time.sleep(0.1)

    def caught_up(self, timeout: float = 30) -> None:
        lsn = self.db.execute("SELECT pg_logical_emit_message(true, 'test', 'sync')")[0][0]
        query = "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s"
        deadline = time.monotonic() + timeout
        while not self.db.execute(query, [lsn, self.slot])[0][0]:
            assert time.monotonic() < deadline, f"cdcd never confirmed {lsn}:\n{self.output()[-3000:]}"
            time.sleep(0.1)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def _stream_some(db: Database, config: dict[str, Any], tmp_path: Path, rows: int = 50) -> tuple[str, int]:
    """Run the daemon, commit ``rows`` inserts, wait until confirmed, stop: (everything it printed, pid)."""
    with Daemon(db, config, tmp_path) as daemon:
        pid = daemon.walsender_pid()
        first = db.execute("SELECT coalesce(max(id), 0) + 1 FROM items")[0][0]
        with psycopg.connect(db.dsn(), autocommit=True) as conn:
            for i in range(first, first + rows):
                conn.execute("INSERT INTO items VALUES (%s, %s, %s)", [i, f"row-{i}", i])
        daemon.caught_up()
        assert daemon.stop() == 0, daemon.output()[-3000:]
    changes = Path(config["sink"]["path"]).read_text()
    assert f"row-{first + rows - 1}" in changes, "the rows did not reach the jsonl sink"
    return daemon.output(), pid


def test_password_never_printed(db15: Database, role: Role, tmp_path: Path) -> None:
    printed: dict[str, str] = {}  # what cdcd printed (stdout + stderr) per case; the jsonl file is data

    def check(case: str, expect: int, config: dict[str, Any], **env: str) -> str:
        result = cdcd("check", config, tmp_path, **env)
        printed[case] = result.stdout + result.stderr
        assert result.returncode == expect, f"{case}: exit {result.returncode}\n{printed[case]}"
        return printed[case]

    good = _dsn(db15, role.name, role.password)
    wrong = _dsn(db15, role.name, "Wr0ng-" + role.password)
    password_file = tmp_path / "pgpass"
    password_file.write_text(role.password + "\n")
    password_file.chmod(0o600)
    wrong_file = tmp_path / "wrong-pass"
    wrong_file.write_text("Wr0ng-" + role.password)

    check("check, password in the DSN", 0, _config(db15, tmp_path, dsn=good))
    no_password = _dsn(db15, role.name)
    check("check, password_file", 0, _config(db15, tmp_path, dsn=no_password, password_file=str(password_file)))
    out = check("check, wrong password", 1, _config(db15, tmp_path, dsn=wrong))
    assert "password authentication failed" in out
    out = check(
        "check, password_file overrides the DSN", 1, _config(db15, tmp_path, dsn=good, password_file=str(wrong_file))
    )
    assert "password authentication failed" in out
    out = check(
        "check, unreadable password_file",
        2,
        _config(db15, tmp_path, dsn=no_password, password_file=str(tmp_path / "missing")),
    )
    assert f"cannot read source.password_file {tmp_path / 'missing'}" in out
    # Malformed DSNs: libpq quotes the fragment it could not parse, which can be the password itself.
    for case, dsn in {
        "bad DSN, key without =": f"host=127.0.0.1 user={role.name} password{role.password}",
        "bad DSN, unterminated quote": f"host=127.0.0.1 password='{role.password}",
        "bad DSN, URI": f"postgresql://{role.name}:{role.password}@127.0.0.1:5415/{db15.name} x",
        "bad DSN, unknown option": f"{good} sslmod=require",
    }.items():
        out = check(case, 2, _config(db15, tmp_path, dsn=dsn))
        assert "not a valid connection string" in out
    # Config errors: pydantic may quote an input; a password put under the wrong key must not be echoed.
    check("config error, password as the slot", 2, _config(db15, tmp_path, dsn=good, slot=role.password.upper()))
    check("config error, unknown key", 2, _config(db15, tmp_path, dsn=good, password=role.password))
    check(
        "config error from the environment",
        2,
        _config(db15, tmp_path, dsn="x"),
        CDCD_SOURCE__DSN=good,
        CDCD_SOURCE__STATUS_INTERVAL_S=role.password,
    )

    printed["run, password in the DSN"], _ = _stream_some(db15, _config(db15, tmp_path, dsn=good), tmp_path)
    config = _config(db15, tmp_path, dsn=_dsn(db15, role.name), password_file=str(password_file), slot="s_pwfile")
    printed["run, password_file"], _ = _stream_some(db15, config, tmp_path)
    failed = cdcd("run", _config(db15, tmp_path, dsn=wrong), tmp_path)
    printed["run, wrong password"] = failed.stdout + failed.stderr
    assert failed.returncode == 1, printed["run, wrong password"]
    assert "password authentication failed" in printed["run, wrong password"]
    failed = cdcd("run", _config(db15, tmp_path, dsn=f"host=127.0.0.1 password{role.password}"), tmp_path)
    printed["run, bad DSN"] = failed.stdout + failed.stderr
    assert failed.returncode == 2
    assert "not a valid connection string" in printed["run, bad DSN"]

    assert '"level": "debug"' in printed["run, password in the DSN"], "debug lines were not logged"
    leaks = [case for case, text in printed.items() if role.password in text or role.password.upper() in text]
    assert not leaks, "the password was printed:\n" + "\n\n".join(f"{c}:\n{printed[c]}" for c in leaks)


def test_redact_masks_conninfo_urls_and_registered_secrets() -> None:
    register_secret("hunter2-registered")
    text = "password=abc host=x, password='a b\\' c' sasl.password: p4ss url=https://u:pw@h/x hunter2-registered"
    assert redact(text) == "password=*** host=x, password=*** sasl.password: *** url=https://u:***@h/x ***"


# -- every secret, every service state, every command ---------------------------------------------------------


class _Refusing(http.server.BaseHTTPRequestHandler):
    """A schema registry that refuses every credential (Apicurio in the stack runs without authentication)."""

    def do_GET(self) -> None:
        self._refuse()

    def do_POST(self) -> None:
        self._refuse()

    def _refuse(self) -> None:
        body = b'{"error_code": 401, "message": "Unauthorized"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def refusing_registry() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@dataclass
class Case:
    service: str  # whose credential the secret is: postgresql, kafka or registry
    where: str  # where the config holds it
    secret: str
    state: str  # the service is "answering", "refusing" the credential or "unreachable"
    config: dict[str, Any]


def _secret(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:12]}"


def _secret_cases(db: Database, role: Role, env: dict[str, str], registry_401: str, tmp_path: Path) -> list[Case]:
    """A config per (secret, state of the service it opens): the PostgreSQL password, the Kafka SASL password,
    registry basic auth in the URL and in schema_registry.client."""
    registry = env["CDCD_SCHEMA_REGISTRY__URL"].split("//", 1)[1]  # host:port/apis/ccompat/v7
    sasl_ssl = env["STACK_KAFKA_SASL_SSL"]

    def config(dsn: str, kafka: dict[str, Any] | None = None, reg: dict[str, Any] | None = None) -> dict[str, Any]:
        made = _config(db, tmp_path, dsn=dsn, slot=f"s_{uuid.uuid4().hex[:10]}")
        made["sink"] = {"kind": "kafka", "flush_timeout_s": 3}
        made["kafka"] = {
            "bootstrap_servers": env["CDCD_KAFKA__BOOTSTRAP_SERVERS"],
            "topic_prefix": f"sec_{db.name}",
            **(kafka or {}),
        }
        made["schema_registry"] = {"url": f"http://{registry}", **(reg or {})}
        return made

    def sasl(servers: str, password: str) -> dict[str, Any]:
        return {
            "bootstrap_servers": servers,
            "producer": {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "PLAIN",
                "sasl.username": env["STACK_KAFKA_SASL_USER"],
                "sasl.password": password,
                "ssl.ca.location": env["STACK_KAFKA_CA"],
            },
        }

    good = _dsn(db, role.name, role.password)
    pg_wrong, pg_unreachable = _secret("pg-wrong"), _secret("pg-away")
    kafka_wrong, kafka_unreachable = _secret("kafka-wrong"), _secret("kafka-away")
    stack_password = env["STACK_KAFKA_SASL_PASSWORD"]
    unreachable = f"host=127.0.0.1 port=1 user=x password={pg_unreachable}"
    cases = [
        Case("postgresql", "dsn", role.password, "answering", config(good)),
        Case("postgresql", "dsn", pg_wrong, "refusing", config(_dsn(db, role.name, pg_wrong))),
        Case("postgresql", "dsn", pg_unreachable, "unreachable", config(unreachable)),
        Case("kafka", "sasl", stack_password, "answering", config(good, sasl(sasl_ssl, stack_password))),
        Case("kafka", "sasl", kafka_wrong, "refusing", config(good, sasl(sasl_ssl, kafka_wrong))),
        Case("kafka", "sasl", kafka_unreachable, "unreachable", config(good, sasl("127.0.0.1:1", kafka_unreachable))),
    ]
    for where in ("url", "client"):
        for state, host in (
            ("answering", registry),
            ("refusing", f"{registry_401}/apis/ccompat/v7"),
            ("unreachable", "127.0.0.1:2/apis/ccompat/v7"),
        ):
            secret = _secret(f"reg-{where}-{state}")
            reg = (
                {"url": f"http://cdcd:{secret}@{host}"}
                if where == "url"
                else {"url": f"http://{host}", "client": {"basic.auth.user.info": f"cdcd:{secret}"}}
            )
            cases.append(Case("registry", where, secret, state, config(good, reg=reg)))
    return cases


_ROW_IDS = itertools.count(1_000_000)  # rows the daemons are given to stream (unique when cases run side by side)


def _run_briefly(
    db: Database, command: str, config: dict[str, Any], tmp_path: Path, seconds: float = 15
) -> tuple[int, bool, str]:
    """`cdcd run` or `tail` with one row committed while it runs: it streams it, or fails on (or waits for) the
    service it cannot use. Stopped with SIGTERM once the row is confirmed, or after ``seconds`` (and killed if it
    does not stop). Returns (exit code, confirmed, output)."""
    with Daemon(db, config, tmp_path, command) as daemon:
        deadline = time.monotonic() + seconds
        while daemon.proc.poll() is None and time.monotonic() < deadline:
            if db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", [daemon.slot]):
                break
            time.sleep(0.1)
        db.execute("INSERT INTO items VALUES (%s, 'x', 1)", [next(_ROW_IDS)])
        lsn = db.execute("SELECT pg_current_wal_lsn()")[0][0]
        query = "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s"
        confirmed = False
        while daemon.proc.poll() is None and time.monotonic() < deadline and not confirmed:
            time.sleep(0.2)
            confirmed = db.execute(query, [lsn, daemon.slot]) == [(True,)]
        if daemon.proc.poll() is None:
            daemon.proc.send_signal(signal.SIGTERM)
            try:
                daemon.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:  # a daemon that ignores SIGTERM fails the test below (no "stopped")
                daemon.proc.kill()
        return daemon.proc.wait(), confirmed, daemon.output()


def test_no_secret_in_any_output(
    db15: Database, role: Role, kafka_env: dict[str, str], refusing_registry: str, tmp_path: Path
) -> None:
    """check, run, tail and snapshot, each with every secret and its service answering, refusing the credentials
    and unreachable: the secret appears in nothing they print. The cases run side by side (each its own slot;
    most of a case is waiting for a service that never answers)."""
    cases = _secret_cases(db15, role, kafka_env, refusing_registry, tmp_path)
    with ThreadPoolExecutor(max_workers=4) as pool:
        outputs = list(pool.map(lambda i: _secret_case(db15, cases[i], tmp_path / f"case{i}"), range(len(cases))))
    printed = {name: text for output in outputs for name, text in output.items()}
    leaks = [name for name, text in printed.items() if any(case.secret in text for case in cases)]
    assert not leaks, "secrets printed:\n" + "\n\n".join(f"{name}:\n{printed[name]}" for name in leaks)


def _secret_case(db: Database, case: Case, tmp_path: Path) -> dict[str, str]:
    """What check, run, tail and snapshot print for one case, each checked to fail or succeed as it should."""
    tmp_path.mkdir()
    name = f"{case.service} ({case.where}) {case.state}"
    result = cdcd("check", case.config, tmp_path)
    printed = {f"check, {name}": result.stdout + result.stderr}
    assert result.returncode == (0 if case.state == "answering" else 1), f"check, {name}:\n{printed[f'check, {name}']}"
    # answering: until the row is confirmed; refusing: until it exits 1 by itself (a bound, not a pause: 8 s
    # was too short for a loaded machine once); away: long enough to log what it waits for, retries included
    seconds = {"answering": 15, "refusing": 40}.get(case.state, 8)
    code, confirmed, printed[f"run, {name}"] = _run_briefly(db, "run", case.config, tmp_path / "run", seconds)
    if case.state == "answering":
        assert code == 0, f"run, {name}: exit {code}\n{printed[f'run, {name}']}"
        assert confirmed, f"run, {name}: the row was not delivered\n{printed[f'run, {name}']}"
    elif case.state == "refusing":
        assert code == 1, f"run, {name}: exit {code}\n{printed[f'run, {name}']}"
    elif case.service == "registry":  # away: waited for, as Kafka is, until stopped
        assert code == 0, f"run, {name}: exit {code}\n{printed[f'run, {name}']}"
        assert "waiting for the schema registry" in printed[f"run, {name}"], printed[f"run, {name}"]
    source_ok = case.service != "postgresql" or case.state == "answering"
    if case.service in ("postgresql", "kafka"):  # tail and snapshot read the source only: one registry case
        source = {**case.config["source"], "slot": f"t_{uuid.uuid4().hex[:10]}", "temporary_slot": True}
        tail = {**case.config, "source": source}
        code, confirmed, printed[f"tail, {name}"] = _run_briefly(db, "tail", tail, tmp_path / "tail")
        assert confirmed == source_ok, f"tail, {name}\n{printed[f'tail, {name}']}"
    snapshot = cdcd("snapshot", case.config, tmp_path, "--table", "public.items")
    printed[f"snapshot, {name}"] = out = snapshot.stdout + snapshot.stderr
    assert (snapshot.returncode == 0) == source_ok, f"snapshot, {name}:\n{out}"
    return printed


# -- TLS ----------------------------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_ca(directory: Path, name: str) -> Path:
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        cwd=directory,
    )
    return directory / f"{name}.crt"


@dataclass
class Tls:
    ca: Path
    other_ca: Path


@pytest.fixture
def tls(pg15: PgServer, tmp_path: Path) -> Iterator[Tls]:
    """SSL on the stack's PostgreSQL 15 with a server certificate signed by a CA made here; always undone."""
    ca = _make_ca(tmp_path, "test-ca")
    other_ca = _make_ca(tmp_path, "other-ca")
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        cwd=tmp_path,
    )
    (tmp_path / "san.ext").write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "test-ca.crt",
        "-CAkey",
        "test-ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.crt",
        cwd=tmp_path,
    )
    # The server reads them as the postgres OS user: a directory it can enter, the key private to it.
    server_dir = Path(tempfile.mkdtemp(prefix="cdcd-tls-"))
    server_dir.chmod(0o755)
    shutil.copy(tmp_path / "server.crt", server_dir / "server.crt")
    shutil.copy(tmp_path / "server.key", server_dir / "server.key")
    (server_dir / "server.crt").chmod(0o644)
    (server_dir / "server.key").chmod(0o600)
    shutil.chown(server_dir / "server.key", "postgres", "postgres")
    with psycopg.connect(pg15.dsn(), autocommit=True) as admin:
        try:
            admin.execute(f"ALTER SYSTEM SET ssl_cert_file = '{server_dir / 'server.crt'}'")
            admin.execute(f"ALTER SYSTEM SET ssl_key_file = '{server_dir / 'server.key'}'")
            admin.execute("ALTER SYSTEM SET ssl = on")
            admin.execute("SELECT pg_reload_conf()")
            _wait_ssl(pg15, "on")
            yield Tls(ca, other_ca)
        finally:
            for setting in ("ssl", "ssl_cert_file", "ssl_key_file"):
                admin.execute(f"ALTER SYSTEM RESET {setting}")
            admin.execute("SELECT pg_reload_conf()")
            _wait_ssl(pg15, "off")
            shutil.rmtree(server_dir)


def _wait_ssl(pg: PgServer, state: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:  # a new backend sees the reloaded config
            current = conn.execute("SHOW ssl").fetchone()
        if current == (state,):
            return
        assert time.monotonic() < deadline, f"ssl stayed {current} after the reload (see the PostgreSQL 15 log)"
        time.sleep(0.2)


def test_tls_verify_full(db15: Database, role: Role, tls: Tls, tmp_path: Path) -> None:
    for host in ("127.0.0.1", "localhost"):  # the certificate names both
        dsn = _dsn(db15, role.name, role.password, f"sslmode=verify-full sslrootcert={tls.ca}").replace(
            "host=127.0.0.1", f"host={host}"
        )
        result = cdcd("check", _config(db15, tmp_path, dsn=dsn), tmp_path)
        assert result.returncode == 0, result.stderr
        with psycopg.connect(dsn) as conn:
            assert conn.pgconn.ssl_in_use
            row = conn.execute("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
            assert row is not None
            assert row[0] is True
            assert row[1].startswith("TLS"), row

    # The replication session itself is encrypted.
    dsn = _dsn(db15, role.name, role.password, f"sslmode=verify-full sslrootcert={tls.ca}")
    config = _config(db15, tmp_path, dsn=dsn)
    with Daemon(db15, config, tmp_path) as daemon:
        pid = daemon.walsender_pid()
        query = "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_replication r USING (pid) WHERE pid = %s"
        encrypted = db15.execute(query, [pid])
        assert encrypted == [(True,)], f"the walsender session is not encrypted: {encrypted}"
        db15.execute("INSERT INTO items VALUES (1, 'over-tls', 1)")
        daemon.caught_up()
        assert daemon.stop() == 0, daemon.output()[-3000:]
    assert "over-tls" in Path(config["sink"]["path"]).read_text()

    # Another CA: the server certificate does not verify, and the message says so.
    dsn = _dsn(db15, role.name, role.password, f"sslmode=verify-full sslrootcert={tls.other_ca}")
    result = cdcd("check", _config(db15, tmp_path, dsn=dsn), tmp_path)
    assert result.returncode == 1, result.stderr
    assert "cannot connect to PostgreSQL" in result.stderr
    assert "certificate verify failed" in result.stderr, result.stderr
    assert role.password not in result.stdout + result.stderr

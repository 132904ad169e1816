"""Integration harness: real PostgreSQL servers from deploy/local/stack, cdcd run as a real process.

``CDCD_TEST_PG_VERSIONS`` (default "15") lists the PostgreSQL majors the integration tests run on, and
``CDCD_TEST_PG_FULL`` (default: all of them) the majors that run the whole suite: on the others only tests
marked ``every_pg`` (what depends on the server version: protocol, streaming, filters, snapshots, the oracle,
check) run; the rest of the ``pg``-parametrized tests are deselected there.
Each test gets a database of its own, so slots and publications never leak between tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
import yaml

from tests.procs import spawn

if TYPE_CHECKING:
    from tests.integration.kafka_harness import Run

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "deploy" / "local" / "stack"


def cdcd_env() -> dict[str, str]:
    """The environment of a cdcd process the tests start: none of the caller's CDCD_* settings, except
    CDCD_IMPL, which says which implementation of the row stage the suite tests (`make test` runs both)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CDCD_") or k == "CDCD_IMPL"}


VERSIONS = os.environ.get("CDCD_TEST_PG_VERSIONS", "15").split()
FULL_VERSIONS = os.environ.get("CDCD_TEST_PG_FULL", " ".join(VERSIONS)).split()


# `make test` runs the suite on two pytest-xdist workers (--dist loadgroup). A module whose tests use a service no
# other test touches (toxiproxy's proxies, the pg-ha pair, one Spark session per worker) marks them with an
# xdist_group: they run on one worker, one after the other. The tests marked `alone` run with no other integration
# test: they stop Kafka (also marked `stops_kafka`: `make test` runs those beside the unit tests, which use no
# service), or count on the machine's sockets and time (the metrics port's 100 idle clients: after the others).


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "every_pg: runs on every major of CDCD_TEST_PG_VERSIONS, not only the full ones")
    config.addinivalue_line(
        "markers", "full_pg_only: runs on the majors of CDCD_TEST_PG_FULL only, even in a module marked every_pg"
    )
    config.addinivalue_line(
        "markers",
        "pg_before(major): runs on the majors of CDCD_TEST_PG_VERSIONS below ``major`` only (deselected on others)",
    )
    config.addinivalue_line("markers", "pg_since(major): runs on ``major`` and later only (deselected on others)")
    config.addinivalue_line("markers", "alone: runs with no other integration test in make test (it stops Kafka...)")
    config.addinivalue_line("markers", "stops_kafka: stops the stack's Kafka (make test runs it beside the unit tests)")
    config.addinivalue_line(
        "markers",
        "beyond_row_stage: what it checks is not done by the row stage (resuming after a kill): the Python row"
        " stage's pass of make test leaves it out",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect ``pg``-parametrized tests on majors outside CDCD_TEST_PG_FULL unless marked every_pg (and not
    full_pg_only), and those outside their pg_before(N) / pg_since(N) markers."""
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        version = callspec.params.get("pg") if callspec is not None else None
        partial = version is not None and str(version) not in FULL_VERSIONS
        every = item.get_closest_marker("every_pg") is not None and item.get_closest_marker("full_pg_only") is None
        (drop if (partial and not every) or not _in_range(item, version) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _in_range(item: pytest.Item, version: object) -> bool:
    """Whether ``item``'s ``pg`` parameter is within its pg_before and pg_since markers (no parameter: yes)."""
    if version is None:
        return True
    before, since = item.get_closest_marker("pg_before"), item.get_closest_marker("pg_since")
    major = int(str(version))
    return (before is None or major < int(before.args[0])) and (since is None or major >= int(since.args[0]))


@dataclass(frozen=True)
class PgServer:
    version: int
    env: dict[str, str]  # what `stack env` exports for this version

    def dsn(self, dbname: str | None = None, options: str = "") -> str:
        base = self.env["CDCD_SOURCE__DSN"]
        if dbname:
            base += f" dbname={dbname}"
        return base + (f" options='{options}'" if options else "")

    @property
    def bin_dir(self) -> Path:
        return Path(self.env["CDCD_PG_BIN"])

    @property
    def streaming_options(self) -> str:
        """Walsender settings that make small test transactions stream (per connection, no server restart)."""
        options = "-c logical_decoding_work_mem=64kB"
        if self.version >= 16:
            options += " -c debug_logical_replication_streaming=immediate"
        return options


def stack_env(version: str) -> dict[str, str]:
    script = f'eval "$(PG_VERSION={version} {STACK} env)" && env -0'
    out = subprocess.run(["bash", "-c", script], check=True, capture_output=True).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def start_pg(version: str) -> PgServer:
    subprocess.run([str(STACK), "up", "pg"], check=True, env={**os.environ, "PG_VERSION": version})
    return PgServer(int(version), stack_env(version))


@pytest.fixture(scope="session", params=VERSIONS, ids=lambda v: f"pg{v}")
def pg(request: pytest.FixtureRequest) -> PgServer:
    return start_pg(str(request.param))


def close_bounded(consumer: Any, timeout: float = 30) -> None:
    """``consumer.close()``, waited for at most ``timeout`` s: librdkafka's close can block for good leaving a
    group (confluent-kafka-python#1667; seen here after a test, holding the whole suite). A consumer that does not
    close in time is left to its daemon thread."""
    closing = threading.Thread(target=consumer.close, daemon=True)
    closing.start()
    closing.join(timeout)
    if closing.is_alive():
        print(f"kafka harness: a consumer did not close within {timeout:g} s; left behind", file=sys.stderr)


@pytest.fixture(scope="session")
def avroread() -> Path:
    """The Go reader, (re)built by the Makefile from tools/avroread."""
    subprocess.run(["make", "-s", "avroread"], cwd=ROOT, check=True)
    return ROOT / "build" / "avroread"


@pytest.fixture(scope="session")
def pg15() -> PgServer:
    """PostgreSQL 15 (Debian's), for tests that run on one version only."""
    return start_pg("15")


@pytest.fixture(scope="session")
def debezium_env() -> dict[str, str]:
    """Kafka, the registry and the Kafka Connect worker with Debezium up; the stack's environment."""
    subprocess.run([str(STACK), "up", "kafka", "registry", "debezium"], check=True, env=os.environ.copy())
    return stack_env("15")


def stack15(*args: str) -> None:
    """A stack command for PostgreSQL 15 (``debezium-connector`` connects to it)."""
    subprocess.run([str(STACK), *args], check=True, env={**os.environ, "PG_VERSION": "15"})


@pytest.fixture(scope="session")
def kafka_env() -> dict[str, str]:
    """Kafka and the schema registry up; the stack's environment (bootstrap servers, registry URL)."""
    for component in ("kafka", "registry"):
        subprocess.run([str(STACK), "up", component], check=True, env=os.environ.copy())
    return stack_env("15")


@pytest.fixture
def run(db: Database, kafka_env: dict[str, str], tmp_path: Path) -> Iterator[Run]:
    """A `cdcd run` to Kafka for this test's database (not started) with a consumer of its topics."""
    from tests.integration.kafka_harness import Run  # noqa: PLC0415 - it imports this module

    r = Run(db, kafka_env, tmp_path)
    yield r
    r.close()


@pytest.fixture
def run15(pg15: PgServer, kafka_env: dict[str, str], tmp_path: Path) -> Iterator[Run]:
    """Like ``run``, on PostgreSQL 15 only: for the large tests, which would add minutes per major."""
    yield from run_on(pg15, kafka_env, tmp_path)


def run_on(server: PgServer, kafka_env: dict[str, str], tmp_path: Path) -> Iterator[Run]:
    """A Run on a scratch database of ``server``, whatever CDCD_TEST_PG_VERSIONS says (fixtures of one major)."""
    from tests.integration.kafka_harness import Run  # noqa: PLC0415 - it imports this module

    with scratch_database(server) as database:
        r = Run(database, kafka_env, tmp_path)
        yield r
        r.close()


@dataclass
class Database:
    server: PgServer
    name: str

    def dsn(self, options: str = "") -> str:
        return self.server.dsn(self.name, options)

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn(), autocommit=True)

    def execute(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []


@pytest.fixture
def db(pg: PgServer) -> Iterator[Database]:
    with scratch_database(pg) as database:
        yield database


@contextlib.contextmanager
def scratch_database(pg: PgServer, encoding: str | None = None) -> Iterator[Database]:
    """A new database on ``pg`` (in ``encoding``, None: the server's default), dropped afterwards with its
    replication slots (their consumers terminated)."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    options = "" if encoding is None else f" TEMPLATE template0 ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C'"
    with psycopg.connect(pg.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}{options}")
    yield Database(pg, name)
    with psycopg.connect(pg.dsn(), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = %s AND active", [name]
        )
        for _ in range(50):
            slots = admin.execute("SELECT slot_name, active FROM pg_replication_slots WHERE database = %s", [name])
            rows = slots.fetchall()
            if not any(active for _, active in rows):
                break
            time.sleep(0.1)
        for slot, _ in rows:
            admin.execute("SELECT pg_drop_replication_slot(%s)", [slot])
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


class Tail:
    """A `cdcd tail` process writing JSON lines to a file."""

    def __init__(self, db: Database, slot: str, config: Path, output: Path, log: Path) -> None:
        self.db, self.slot = db, slot
        self.config, self.output, self.log = config, output, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, output: Path | None = None) -> Tail:
        if output is not None:
            self.output = output
        with self.log.open("ab") as log:
            self.proc = spawn(
                [sys.executable, "-m", "cdcd", "tail", "--config", str(self.config), "--output", str(self.output)],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=cdcd_env(),
            )
        return self

    def lines(self) -> list[dict[str, Any]]:
        if not self.output.exists():
            return []
        text = self.output.read_text()
        complete = text[: text.rfind("\n") + 1]  # a kill -9 may leave half a line
        return [json.loads(line) for line in complete.splitlines() if line]

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 60) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            lines = self.lines()
            if predicate(lines):
                return lines
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"cdcd tail exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out with {len(lines)} lines; log:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def _slot_active(self) -> bool:
        rows = self.db.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", [self.slot])
        return bool(rows and rows[0][0])

    def _replicating(self) -> bool:
        """The slot's walsender has entered START_REPLICATION. An active slot alone is not enough: the slot is
        active while it is being created, and its consistent point (so what the initial snapshot holds) is only
        fixed once the transactions then running have ended."""
        rows = self.db.execute(
            "SELECT r.state FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid"
            " WHERE s.slot_name = %s",
            [self.slot],
        )
        return bool(rows and rows[0][0] in ("catchup", "streaming"))

    def wait_streaming(self, timeout: float = 30) -> None:
        """Wait until the process streams from its slot (its initial snapshot, if any, is taken)."""
        self._wait(self._replicating, "never started streaming", timeout)

    def wait_slot_released(self, timeout: float = 30) -> None:
        self._wait(lambda: not self._slot_active(), "slot stayed active after its consumer stopped", timeout)

    def _wait(self, condition: Callable[[], bool], failure: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.slot}: {failure}; log:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def kill(self, sig: int = signal.SIGKILL) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        return self.kill(signal.SIGTERM)


@pytest.fixture
def tail_factory(db: Database, tmp_path: Path) -> Iterator[Callable[..., Tail]]:
    started: list[Tail] = []

    def make(slot: str = "", publication: str = "cdcd_pub", **source: Any) -> Tail:
        slot = slot or f"s_{db.name}"  # slot names are cluster-wide
        config = {
            "source": {
                "dsn": db.dsn(db.server.streaming_options),
                "slot": slot,
                "publications": [{"name": publication}],
                "status_interval_s": 0.5,
                "reconnect": {"initial_backoff_s": 0.2, "max_backoff_s": 1},
                **source,
            },
            "buffer": {"spill_dir": str(tmp_path / "spill"), "memory_limit": "256KiB"},
            "snapshot": {"state_dir": str(tmp_path / "state")},
            "log": {"level": "info", "format": "json"},
        }
        path = tmp_path / f"{slot}.yaml"
        path.write_text(yaml.safe_dump(config))
        tail = Tail(db, slot, path, tmp_path / f"{slot}.jsonl", tmp_path / f"{slot}.log")
        started.append(tail)
        return tail

    yield make
    for tail in started:
        tail.stop()

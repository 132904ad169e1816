"""The stack's Toxiproxy: its proxies carry PostgreSQL, registry and Kafka traffic, and each kind of fault acts on it.

Faults on PostgreSQL and the registry go to proxies of the test's own (``temporary_proxy``) in front of the same
servers: the stack's proxies are shared. The Kafka proxy is the stack's (the broker advertises its address), held
with ``exclusive`` while it is faulted.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.conftest import STACK, PgServer, close_bounded, stack_env
from tests.integration.faults import (
    Proxy,
    Toxiproxy,
    bandwidth,
    exclusive,
    latency,
    limit_data,
    reset_peer,
    slicer,
    timeout,
)

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("toxiproxy")]  # one worker: see conftest.py


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    subprocess.run([str(STACK), "up", "kafka", "registry", "toxiproxy"], check=True, env=os.environ.copy())
    return stack_env("15")


@pytest.fixture(scope="module")
def toxiproxy(env: dict[str, str]) -> Toxiproxy:
    return Toxiproxy(env["STACK_TOXIPROXY_URL"])


def private_name(kind: str) -> str:
    return f"test-{kind}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def pg_proxy(toxiproxy: Toxiproxy, pg15: PgServer) -> Iterator[tuple[Proxy, str]]:
    """A proxy of the test's own in front of PostgreSQL 15, and a DSN through it."""
    with toxiproxy.temporary_proxy(private_name("pg"), f"127.0.0.1:{pg15.env['PGPORT']}") as proxy:
        yield proxy, f"{pg15.dsn()} port={proxy.port} connect_timeout=5"


def elapsed(conn: psycopg.Connection[Any], sql: str) -> tuple[float, Any]:
    start = time.monotonic()
    row = conn.execute(sql).fetchone()
    return time.monotonic() - start, row


def test_the_stack_makes_its_proxies(toxiproxy: Toxiproxy, env: dict[str, str]) -> None:
    proxies = toxiproxy.proxies()
    assert {f"pg{m}" for m in range(14, 19)} | {"registry", "kafka"} <= set(proxies)
    for major in range(14, 19):
        assert (proxies[f"pg{major}"].listen, proxies[f"pg{major}"].upstream) == (
            f"127.0.0.1:{6400 + major}",
            f"127.0.0.1:{5400 + major}",
        )
    assert proxies["kafka"].listen == env["STACK_TOXIPROXY_KAFKA"]
    assert proxies["registry"].listen == "127.0.0.1:19081"
    assert env["STACK_TOXIPROXY_REGISTRY_URL"].startswith("http://127.0.0.1:19081/")


@pytest.mark.every_pg
def test_pg_proxy_carries_traffic(pg: PgServer, toxiproxy: Toxiproxy) -> None:
    proxy = toxiproxy.proxy(f"pg{pg.version}")
    assert proxy.upstream == f"127.0.0.1:{pg.env['PGPORT']}"
    assert pg.env["STACK_TOXIPROXY_PG"] == proxy.listen
    with psycopg.connect(pg.env["STACK_TOXIPROXY_PG_DSN"] + " connect_timeout=5", autocommit=True) as conn:
        row = conn.execute("select current_setting('server_version_num')::int / 10000").fetchone()
    assert row == (pg.version,)


def test_timeout_holds_a_query_until_removed(toxiproxy: Toxiproxy, pg_proxy: tuple[Proxy, str]) -> None:
    proxy, dsn = pg_proxy
    conn = psycopg.connect(dsn, autocommit=True)
    outcome: list[BaseException | object] = []

    def query() -> None:
        try:
            outcome.append(conn.execute("select 1").fetchone())
        except psycopg.OperationalError as e:
            outcome.append(e)

    toxic = toxiproxy.add(proxy.name, timeout())
    waiting = threading.Thread(target=query, daemon=True)
    waiting.start()
    waiting.join(1.0)
    assert waiting.is_alive(), f"the query ended under a blackhole: {outcome}"
    toxiproxy.remove(proxy.name, toxic.name)  # which closes the connections it held
    waiting.join(10)
    assert not waiting.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], psycopg.OperationalError)
    with psycopg.connect(dsn, autocommit=True) as again:
        assert again.execute("select 1").fetchone() == (1,)


def test_reset_peer_breaks_connections(toxiproxy: Toxiproxy, pg_proxy: tuple[Proxy, str]) -> None:
    proxy, dsn = pg_proxy
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
        with toxiproxy.fault(proxy.name, reset_peer()):
            with pytest.raises(psycopg.OperationalError, match="closed the connection"):
                conn.execute("select 1")
            with pytest.raises(psycopg.OperationalError, match="closed the connection"):
                psycopg.connect(dsn)
    assert toxiproxy.proxy(proxy.name).toxics == ()
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_down_refuses_connections_for_a_while(toxiproxy: Toxiproxy, pg_proxy: tuple[Proxy, str]) -> None:
    proxy, dsn = pg_proxy
    conn = psycopg.connect(dsn, autocommit=True)
    with toxiproxy.down(proxy.name, lasting=1.5):
        with pytest.raises(psycopg.OperationalError, match="closed the connection"):
            conn.execute("select 1")
        with pytest.raises(psycopg.OperationalError, match="Connection refused"):
            psycopg.connect(dsn)
        time.sleep(2)  # past `lasting`: enabled again inside the block
        with psycopg.connect(dsn, autocommit=True) as back:
            assert back.execute("select 1").fetchone() == (1,)
    assert toxiproxy.proxy(proxy.name).enabled


def test_latency_bandwidth_and_slicer_slow_results_down_intact(
    toxiproxy: Toxiproxy, pg_proxy: tuple[Proxy, str]
) -> None:
    proxy, dsn = pg_proxy
    cases = [
        (latency(400), "select 1", 0.4),
        (bandwidth(100), "select repeat('x', 50000)", 0.45),  # 50 kB at 100 KB/s
        (slicer(100, 50, delay_us=5000), "select repeat('y', 10000)", 0.3),  # ~100 pieces 5 ms apart
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for fault, sql, at_least in cases:
            plain, expected = elapsed(conn, sql)
            with toxiproxy.fault(proxy.name, fault):
                slowed, row = elapsed(conn, sql)
            assert row == expected
            assert slowed >= at_least > plain, (fault, plain, slowed)


def test_limit_data_closes_a_connection_past_its_bytes(toxiproxy: Toxiproxy, pg_proxy: tuple[Proxy, str]) -> None:
    proxy, dsn = pg_proxy
    with toxiproxy.fault(proxy.name, limit_data(20000)), psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select length(repeat('x', 1000))").fetchone() == (1000,)
        with pytest.raises(psycopg.OperationalError, match="closed the connection"):
            conn.execute("select repeat('x', 100000)").fetchone()


def http_get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read()


def test_registry_proxy(toxiproxy: Toxiproxy, env: dict[str, str]) -> None:
    status, body = http_get(env["STACK_TOXIPROXY_REGISTRY_URL"] + "/subjects")
    assert status == 200
    assert body.startswith(b"[")
    upstream = toxiproxy.proxy("registry").upstream
    with toxiproxy.temporary_proxy(private_name("registry"), upstream) as proxy:
        url = f"http://{proxy.listen}/apis/ccompat/v7/subjects"
        with toxiproxy.fault(proxy.name, latency(300)):
            start = time.monotonic()
            assert http_get(url)[0] == 200
            assert time.monotonic() - start >= 0.3
        with toxiproxy.down(proxy.name), pytest.raises(urllib.error.URLError, match="Connection refused"):
            http_get(url)
        assert http_get(url)[0] == 200


def test_kafka_proxy_carries_and_stalls_produce(toxiproxy: Toxiproxy, env: dict[str, str]) -> None:
    direct, proxied = env["CDCD_KAFKA__BOOTSTRAP_SERVERS"], env["STACK_TOXIPROXY_KAFKA"]
    topic = f"faults-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": direct})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(timeout=30)
    fast_reconnect = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200}
    try:
        with exclusive("kafka"):
            producer = Producer({"bootstrap.servers": proxied, "message.timeout.ms": 60000, **fast_reconnect})
            brokers = producer.list_topics(timeout=10).brokers.values()
            assert [f"{b.host}:{b.port}" for b in brokers] == [proxied]  # the broker sends clients back to the proxy
            producer.produce(topic, b"before")
            assert producer.flush(15) == 0
            with toxiproxy.down("kafka"):
                producer.produce(topic, b"while down")
                assert producer.flush(2) == 1  # not delivered: the proxy refuses connections
            assert producer.flush(15) == 0
            consumer = Consumer({"bootstrap.servers": proxied, "group.id": topic, **fast_reconnect})
            try:
                consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
                values = [consumer.poll(15) for _ in range(2)]
            finally:
                close_bounded(consumer)
        assert [m.value() if m is not None else None for m in values] == [b"before", b"while down"]
    finally:
        admin.delete_topics([topic])

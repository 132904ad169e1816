"""Deadlines on the schema registry, against a registry that accepts connections and never answers (a socket
that listens and is never read): a request ends at schema_registry.timeout_s and the registry is waited for as one
that is away (logged, asked again), the main loop passing between requests, where a stop request ends the wait."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import structlog
from confluent_kafka import KafkaError

from cdcd.config import KafkaSettings, SchemaRegistrySettings
from cdcd.sink import registry as sink_registry
from cdcd.sink.registry import KafkaRegistry

SCHEMA = {"type": "record", "name": "Value", "fields": [{"name": "id", "type": "int"}]}


class _Stop(Exception):
    """What the loop's keep-alive raises once a stop was asked for."""


class Loop:
    """The transport as the registry waits with it: each wait is a pass of the main loop (/healthz sees it);
    once ``stop`` is set, a wait ends the registration as a stop request does."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.waits = 0

    def wait(self, seconds: float) -> None:
        self.waits += 1
        if self.stop.is_set():
            raise _Stop
        time.sleep(seconds)

    def client_error(self, error: KafkaError) -> None: ...


@pytest.fixture
def silent_registry() -> Iterator[socket.socket]:
    """A registry that accepts connections and never answers: a listening socket nothing reads from."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.settimeout(20)  # generous: an attempt comes within the request timeout once the first timed out
        yield server


class Registering(threading.Thread):
    """A registration to a registry at ``server`` on a daemon thread: the test stays in charge if it never ends."""

    def __init__(self, server: socket.socket, timeout_s: float) -> None:
        super().__init__(daemon=True)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        settings = SchemaRegistrySettings(url=url, timeout_s=timeout_s, client={"max.retries": 0})
        self.loop = Loop()
        kafka = KafkaSettings(bootstrap_servers="127.0.0.1:9", producer={"log_level": 0})
        self.registry = KafkaRegistry(kafka, settings, self.loop)
        self.raised: type[BaseException] | None = None  # not the exception, whose frames hold this thread
        self.start()

    def run(self) -> None:
        try:
            self.registry.schema_id("t-value", SCHEMA)
        except BaseException as exc:
            self.raised = type(exc)

    def stopped(self) -> bool:
        """Ask for a stop: whether the registration ended by it (within a generous bound)."""
        self.loop.stop.set()
        self.join(timeout=20)
        if not self.is_alive():
            self.registry.close()
        return self.raised is _Stop


def test_a_registry_that_never_answers_is_waited_for_as_one_that_is_away(
    silent_registry: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request the registry accepts and never answers ends at schema_registry.timeout_s: logged as a registry
    away and asked again (a new connection), until a stop request ends the wait."""
    monkeypatch.setattr(sink_registry, "_REGISTRY_RETRY_PAUSE_S", 0.0)
    with structlog.testing.capture_logs() as logs:
        registering = Registering(silent_registry, timeout_s=0.5)
        first, _ = silent_registry.accept()
        second, _ = silent_registry.accept()  # asked again: the first request timed out
        assert registering.stopped()
    first.close()
    second.close()
    waits = [e for e in logs if e["event"] == "waiting for the schema registry"]
    assert waits, logs
    assert waits[0]["to"] == "register t-value"
    assert "timed out" in waits[0]["error"].lower()


def test_a_stop_request_ends_the_wait_for_a_registry_that_never_answers(silent_registry: socket.socket) -> None:
    """Between its requests the main loop passes (each wait a pass: /healthz stays well), and a stop request
    (SIGTERM) ends the registration."""
    registering = Registering(silent_registry, timeout_s=1)
    deadline = time.monotonic() + 30
    while registering.loop.waits < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert registering.loop.waits >= 2  # after each request that timed out
    assert registering.stopped()

"""The sd_notify client against real AF_UNIX datagram sockets (a path socket and an abstract one)."""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdcd.notify import Notifier


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _receive_all(sock: socket.socket) -> list[str]:
    messages: list[str] = []
    while True:
        try:
            messages.append(sock.recv(4096).decode())
        except BlockingIOError:
            return messages


@pytest.fixture
def path_socket() -> Iterator[tuple[str, socket.socket]]:
    # A short directory: AF_UNIX paths are limited to 108 bytes, and pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="cdcd-") as directory:
        path = str(Path(directory) / "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.setblocking(False)
        try:
            yield path, sock
        finally:
            sock.close()


@pytest.fixture
def abstract_socket() -> Iterator[tuple[str, socket.socket]]:
    name = f"cdcd-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.setblocking(False)
    try:
        yield "@" + name, sock
    finally:
        sock.close()


def test_path_socket_receives_every_message(path_socket: tuple[str, socket.socket]) -> None:
    path, sock = path_socket
    notifier = Notifier(path)
    assert notifier.enabled
    notifier.ready()
    notifier.ready("streaming from slot cdcd")
    notifier.status("lag 3 MiB")
    notifier.stopping()
    notifier.stopping("flushing Kafka")
    notifier.close()
    assert _receive_all(sock) == [
        "READY=1",
        "READY=1\nSTATUS=streaming from slot cdcd",
        "STATUS=lag 3 MiB",
        "STOPPING=1",
        "STOPPING=1\nSTATUS=flushing Kafka",
    ]


def test_abstract_socket(abstract_socket: tuple[str, socket.socket]) -> None:
    name, sock = abstract_socket
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": name})
    notifier.ready("up")
    notifier.stopping()
    assert _receive_all(sock) == ["READY=1\nSTATUS=up", "STOPPING=1"]


def test_watchdog_is_rate_limited_to_half_the_period(path_socket: tuple[str, socket.socket]) -> None:
    path, sock = path_socket
    clock = FakeClock()
    notifier = Notifier(path, watchdog_usec=10_000_000, clock=clock)  # WatchdogSec=10 -> ping every 5 s
    assert notifier.watchdog_interval == 5.0
    notifier.watchdog()  # the first call always pings
    for _ in range(1000):
        notifier.watchdog()
    clock.now += 4.9
    notifier.watchdog()
    assert _receive_all(sock) == ["WATCHDOG=1"]
    clock.now += 0.1  # 5 s after the first ping
    notifier.watchdog()
    notifier.watchdog()
    assert _receive_all(sock) == ["WATCHDOG=1"]
    clock.now += 7.0
    notifier.watchdog()
    clock.now += 4.0
    notifier.watchdog()
    assert _receive_all(sock) == ["WATCHDOG=1"]


def test_watchdog_from_environment(path_socket: tuple[str, socket.socket]) -> None:
    path, sock = path_socket
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "60000000"})
    assert notifier.watchdog_interval == 30.0
    notifier.watchdog()
    assert _receive_all(sock) == ["WATCHDOG=1"]


def test_watchdog_off_without_watchdog_usec(path_socket: tuple[str, socket.socket]) -> None:
    path, sock = path_socket
    other_pid = str(os.getpid() + 1)
    for env in (
        {"NOTIFY_SOCKET": path},
        {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "0"},
        {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "junk"},
        {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "60000000", "WATCHDOG_PID": other_pid},  # another process's
    ):
        notifier = Notifier.from_environment(env)
        assert notifier.watchdog_interval is None
        notifier.watchdog()
    assert _receive_all(sock) == []
    own = Notifier.from_environment(
        {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    )
    assert own.watchdog_interval == 1.0


def test_no_op_outside_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    notifier = Notifier.from_environment()
    assert not notifier.enabled
    assert notifier.watchdog_interval is None
    notifier.ready("x")
    notifier.status("x")
    notifier.watchdog()
    notifier.stopping()
    notifier.close()
    assert not Notifier("relative/path").enabled  # sd_notify accepts only absolute paths and @names
    assert not Notifier("").enabled


def test_send_errors_are_ignored(tmp_path: Path) -> None:
    notifier = Notifier(str(tmp_path / "nobody-listens"), watchdog_usec=1)
    notifier.ready("x")
    notifier.watchdog()
    notifier.stopping()
    too_long = Notifier("/" + "x" * 200)  # longer than sun_path
    too_long.ready()
    Notifier("@" + uuid.uuid4().hex).status("no listener on this abstract name")


def test_reads_the_environment(monkeypatch: pytest.MonkeyPatch, path_socket: tuple[str, socket.socket]) -> None:
    path, sock = path_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    Notifier.from_environment().ready()
    assert _receive_all(sock) == ["READY=1"]

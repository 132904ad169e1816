"""A tiny sd_notify(3) client: tells systemd (Type=notify, WatchdogSec=) how the daemon is doing.

Usage from the daemon::

    notifier = Notifier.from_environment()    # reads $NOTIFY_SOCKET and $WATCHDOG_USEC
    notifier.ready("streaming from slot cdcd")  # READY=1, once streaming has started
    while running:
        ...
        notifier.watchdog()                     # WATCHDOG=1, rate limited: cheap to call every pass
    notifier.stopping()                         # STOPPING=1, on SIGTERM/SIGINT before flushing

Outside systemd (no $NOTIFY_SOCKET) every method is a no-op. Send errors are ignored: a notification is
advisory, and the daemon must never fail because systemd is not listening.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping

__all__ = ["Notifier"]


class Notifier:
    """Sends sd_notify messages over an AF_UNIX datagram socket; a no-op without a socket address."""

    def __init__(
        self,
        socket_path: str | None = None,
        watchdog_usec: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """socket_path: $NOTIFY_SOCKET's value (a path, or @name for the abstract namespace); None disables.

        watchdog_usec: $WATCHDOG_USEC's value; None or 0 disables watchdog pings.
        """
        self._address: str | bytes | None = _address(socket_path)
        self._watchdog_interval: float | None = (
            watchdog_usec / 2_000_000 if self._address is not None and watchdog_usec and watchdog_usec > 0 else None
        )
        self._clock = clock
        self._last_watchdog: float | None = None
        self._sock: socket.socket | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """A notifier for $NOTIFY_SOCKET and $WATCHDOG_USEC (ignored when $WATCHDOG_PID names another process)."""
        env = os.environ if environ is None else environ
        watchdog_usec: int | None = None
        pid = env.get("WATCHDOG_PID", "")
        if not pid or pid == str(os.getpid()):
            try:
                watchdog_usec = int(env.get("WATCHDOG_USEC", ""))
            except ValueError:
                watchdog_usec = None
        return cls(env.get("NOTIFY_SOCKET") or None, watchdog_usec)

    @property
    def enabled(self) -> bool:
        """True when running under systemd with a notification socket."""
        return self._address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 messages (half of $WATCHDOG_USEC), or None when the watchdog is off."""
        return self._watchdog_interval

    def ready(self, status: str = "") -> None:
        """READY=1: startup is finished (send it once streaming has started). Also sends STATUS= if given."""
        self._send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def status(self, text: str) -> None:
        """STATUS=text: a one-line description shown by `systemctl status`."""
        self._send(f"STATUS={text}")

    def watchdog(self) -> None:
        """WATCHDOG=1, at most once per half watchdog period; returns at once otherwise."""
        if self._watchdog_interval is None:
            return
        now = self._clock()
        if self._last_watchdog is not None and now - self._last_watchdog < self._watchdog_interval:
            return
        self._last_watchdog = now
        self._send("WATCHDOG=1")

    def stopping(self, status: str = "") -> None:
        """STOPPING=1: a graceful shutdown has begun (send it on SIGTERM/SIGINT, before flushing)."""
        self._send("STOPPING=1" + (f"\nSTATUS={status}" if status else ""))

    def close(self) -> None:
        """Closes the socket; later messages open a new one."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _send(self, message: str) -> None:
        if self._address is None:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message.encode(), self._address)
        except OSError:
            pass


def _address(socket_path: str | None) -> str | bytes | None:
    if not socket_path:
        return None
    if socket_path.startswith("@"):
        return b"\0" + socket_path[1:].encode()  # abstract namespace
    if socket_path.startswith("/"):
        return socket_path
    return None  # sd_notify(3) accepts only absolute paths and @abstract names (vsock is not supported here)

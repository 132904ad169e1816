"""Stop requests (SIGTERM, SIGINT) of the streaming commands, caught from the process's first moment.

`cdcd run` imports for about half a second before its loop exists; a SIGTERM in that time (a restart loop, a pod
deleted as it starts) would otherwise end it by the signal's default action, exit -15 instead of 0. ``catch`` is
called before anything heavy is imported (``cdcd.entry``); the loop then waits on ``STOP``, set already if the
request came early, and what was registered with ``on_stop`` runs once.

SIGUSR1 writes every thread's stack to stderr (the log) and goes on: what a daemon that seems stuck is doing.
"""

from __future__ import annotations

import faulthandler
import signal
import threading
from collections.abc import Callable
from types import FrameType

STOP = threading.Event()
_callbacks: list[Callable[[], None]] = []
STREAMING_COMMANDS = frozenset({"run", "tail"})


def _requested(signum: int, frame: FrameType | None) -> None:
    STOP.set()
    for callback in list(_callbacks):
        callback()


def catch() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _requested)
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def on_stop(callback: Callable[[], None]) -> None:
    """Call ``callback`` at the next stop request (at once if one came already)."""
    _callbacks.append(callback)
    if STOP.is_set():
        callback()

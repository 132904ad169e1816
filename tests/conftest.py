"""Settings for every test run."""

from __future__ import annotations

import faulthandler
import os
import signal
from collections.abc import Iterator
from types import FrameType

import pytest

# A test (setup, call and teardown) still running after this long stops the whole run: every thread's stack is
# printed and the process exits with status 1. The slowest test takes ~3 minutes on CI; a hang (a Kafka client
# blocked in C, where no Python timeout reaches) must end the run with its stacks, not run into CI's time limit.
TEST_LIMIT_S = int(os.environ.get("TEST_LIMIT_S", "900"))  # `make soak` runs one test for MINUTES
# A process still there this long after its session ended (a thread that keeps it from exiting, an atexit hook
# blocked in C) stops the same way: an xdist worker that never exits holds the whole run until CI's time limit.
EXIT_LIMIT_S = int(os.environ.get("TEST_EXIT_LIMIT_S", "120"))
STDERR = pytest.StashKey[int]()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """A run stopped with SIGTERM (a CI timeout, ``kill``) ends as after Ctrl-C: the fixtures' teardowns run and
    stop the daemons the tests started, instead of leaving them streaming from the stack. Keeps a copy of the
    terminal's stderr for the watchdog."""
    signal.signal(signal.SIGTERM, _interrupt)
    config.stash[STDERR] = os.dup(2)  # the terminal's stderr: during a test, fd 2 is pytest's capture file


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Arms the watchdog for one test (faulthandler's C thread: it fires even while the main thread is blocked)."""
    faulthandler.dump_traceback_later(TEST_LIMIT_S, exit=True, file=item.config.stash[STDERR])
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Arms the watchdog for the process's exit (cancelled by the interpreter as it finishes)."""
    if STDERR in config.stash:
        faulthandler.dump_traceback_later(EXIT_LIMIT_S, exit=True, file=config.stash[STDERR])

"""Settings for every test run."""

from __future__ import annotations

import signal
from types import FrameType

import pytest


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """A run stopped with SIGTERM (a CI timeout, ``kill``) ends as after Ctrl-C: the fixtures' teardowns run and
    stop the daemons the tests started, instead of leaving them streaming from the stack."""
    del config
    signal.signal(signal.SIGTERM, _interrupt)

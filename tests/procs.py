"""Child processes of the test suite (``cdcd run``, ``cdcd tail``, Spark jobs) that die with it.

A pytest killed with SIGTERM or SIGKILL runs no fixture teardown and no atexit: without a guard, every ``cdcd
run`` it had started would go on holding its slot (and the next run's tests would find it active). Each child
asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``), set between fork and exec.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from typing import Any

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent(parent: int) -> None:
    if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # the parent died before the guard was set
        os.kill(os.getpid(), signal.SIGKILL)


def spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **kwargs)``, killed when this process dies however it dies. The guard is tied
    to the thread that starts the child (Linux sends the signal when that thread ends): call it from the test's
    own thread, not from a short-lived one."""
    parent = os.getpid()
    return subprocess.Popen(argv, preexec_fn=lambda: _die_with_parent(parent), **kwargs)  # noqa: PLW1509

"""Child processes of the test suite (``cdcd run``, ``cdcd tail``, Spark jobs) that die with it.

A pytest killed with SIGKILL (or anything else that skips fixture teardown) would leave every ``cdcd run`` it had
started holding its slot, and the next run's tests would find it active. Each child asks the kernel for SIGKILL
when its parent dies (``PR_SET_PDEATHSIG``, set between fork and exec). Linux sends that signal when the *thread*
that forked the child ends, so every child is forked by one thread that lives as long as the process: a test
that starts a daemon from a short-lived thread of its own does not kill it when that thread ends.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
_forker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forker")  # its one thread lives on, idle


def _die_with_parent(parent: int) -> None:
    if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # the parent died before the guard was set
        os.kill(os.getpid(), signal.SIGKILL)


def spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **kwargs)``, killed when this process dies however it dies."""
    parent = os.getpid()

    def start() -> subprocess.Popen[Any]:
        return subprocess.Popen(argv, preexec_fn=lambda: _die_with_parent(parent), **kwargs)  # noqa: PLW1509

    return _forker.submit(start).result()

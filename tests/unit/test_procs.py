"""The test suite's children die with it (``tests/procs.py``): a pytest killed with SIGTERM leaves no ``cdcd run``
behind holding its slot."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.procs import spawn

ROOT = Path(__file__).resolve().parents[2]

PARENT = """
import sys, time
from tests.procs import spawn
child = spawn([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie (exited, not yet reaped by init) counts as gone
        return stat.read().split(") ", 1)[1][0] != "Z"


def test_a_child_is_killed_when_the_test_process_is_terminated() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, cwd=ROOT, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGTERM)
    parent.wait(10)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the child outlived the process that started it"


def test_the_integration_harness_starts_processes_only_through_spawn() -> None:
    """Every child the integration tests start goes through ``tests.procs.spawn`` (no bare Popen call)."""
    bare = [
        f"{path.name}:{node.lineno}"
        for path in sorted((ROOT / "tests" / "integration").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and (getattr(node.func, "attr", None) == "Popen" or getattr(node.func, "id", None) == "Popen")
    ]
    assert bare == []


def test_a_child_started_from_a_short_lived_thread_outlives_that_thread() -> None:
    """Linux sends the parent-death signal when the forking thread ends: spawn forks from a thread of its own."""
    started: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(
        target=lambda: started.append(spawn([sys.executable, "-c", "import time; time.sleep(30)"]))
    )
    thread.start()
    thread.join()
    time.sleep(0.5)
    try:
        assert started[0].poll() is None, "the child died with the thread that started it"
    finally:
        started[0].kill()
        started[0].wait()

"""`cdcd run` and `cdcd tail` catch a stop request from their first moment (``cdcd.entry``, ``cdcd.stopping``): a
SIGTERM while cdcd still imports ends it with exit 0 once its loop sees the request, not by the signal's default
action (exit -15). Found by the nemesis: a SIGTERM right after a restart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# cdcd.cli replaced by a module that, while "importing", is sent SIGTERM: it must still be running afterwards,
# with the request recorded for the loop.
CHILD = """
import os, signal, sys, types
sys.argv = ["cdcd", COMMAND]
fake = types.ModuleType("cdcd.cli")
def main():
    from cdcd import stopping
    os.kill(os.getpid(), signal.SIGTERM)
    print("stop requested" if stopping.STOP.wait(5) else "not requested")
    return 0
fake.main = main
sys.modules["cdcd.cli"] = fake
from cdcd.entry import main as entry
raise SystemExit(entry())
"""


@pytest.mark.parametrize("command", ["run", "tail"])
def test_a_stop_while_cdcd_starts_is_caught_for_its_loop(command: str) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD.replace("COMMAND", repr(command))],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert (child.returncode, child.stdout.strip()) == (0, "stop requested"), child.stderr


def test_other_commands_keep_the_default_handlers() -> None:
    """`cdcd check` and the others stop on Ctrl-C or SIGTERM at once, as any command does."""
    child = subprocess.run(
        [sys.executable, "-c", CHILD.replace("COMMAND", "'check'")],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert child.returncode == -15


def test_sigusr1_writes_every_threads_stack_and_goes_on() -> None:
    """What a daemon that seems stuck is doing: SIGUSR1 writes each thread's stack to stderr (the log)."""
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal, threading\n"
            "from cdcd import stopping\n"
            "stopping.catch()\n"
            "ready = threading.Event()\n"
            "def waiting_in_a_helper(): ready.set(); threading.Event().wait(5)\n"
            "threading.Thread(target=waiting_in_a_helper, daemon=True).start()\n"
            "ready.wait()\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\n"
            "print('went on')\n",
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert (child.returncode, child.stdout.strip()) == (0, "went on"), child.stderr
    assert "waiting_in_a_helper" in child.stderr
    assert "Current thread" in child.stderr

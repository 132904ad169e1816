"""`cdcd --version`: the version and the row stage that runs (tests/packaging checks it on the installed wheel)."""

from __future__ import annotations

import os

import pytest

from cdcd import __version__
from cdcd.cli import main

# Read at collection, as cdcd.rowstage reads it at import: the unit tests' fixture clears CDCD_* before each test.
REQUESTED = os.environ.get("CDCD_IMPL", "").strip().lower() or "native"


def test_version_names_the_row_stage(capsys: pytest.CaptureFixture[str]) -> None:
    """`make test` runs the unit tests with CDCD_IMPL=native and =python: each must be the one reported."""
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"cdcd {__version__} (row stage: {REQUESTED})\n"

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _no_cdcd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests see only the configuration they set, not the local stack's exported CDCD_* variables."""
    for name in list(os.environ):
        if name.startswith("CDCD_"):
            monkeypatch.delenv(name)

"""The row stage: which implementation of the per-row operations runs, the compiled one (``cdcd._native``, Rust)
or the Python specification, chosen here once for the process, like psycopg's ``PSYCOPG_IMPL``.

``CDCD_IMPL=native`` requires the compiled module, ``CDCD_IMPL=python`` never loads it, unset takes the compiled
module when it was built. The Python modules are the specification: the compiled functions implement the plain
forms of their inputs and hand everything else (unusual text forms, malformed bytes, errors) back to them, so
both give the same results and raise the same typed errors. The operations are ``RowStage`` (``stage.py``);
``STAGE`` is the chosen one, handed to the decoder, the encoders, the shaper, the snapshot reader and the lane
where the pipeline is wired. Nothing outside this package imports ``cdcd._native``.
"""

from __future__ import annotations

import os
from typing import Final

from cdcd.rowstage.python import PythonStage
from cdcd.rowstage.stage import ChangeReader, CompiledRows, CopyRowReader, Implementation, Lane, RowStage

__all__ = [
    "IMPL",
    "PYTHON",
    "STAGE",
    "VARIABLE",
    "ChangeReader",
    "CompiledRows",
    "CopyRowReader",
    "ImplementationError",
    "Lane",
    "RowStage",
    "load",
]

VARIABLE: Final = "CDCD_IMPL"
PYTHON: Final[RowStage] = PythonStage()


class ImplementationError(ImportError):
    """CDCD_IMPL asks for something that cannot be had."""


def load(requested: str) -> RowStage:
    """The row stage ``requested`` (``native``, ``python`` or empty: the compiled one when built)."""
    if requested == "python":
        return PYTHON
    if requested not in ("", "native"):
        raise ImplementationError(f"{VARIABLE}={requested!r} is not an implementation: use native or python")
    try:
        from cdcd.rowstage.compiled import NativeStage  # noqa: PLC0415 - the optional compiled module
    except ImportError as exc:
        if requested == "native":
            raise ImplementationError(
                f"{VARIABLE}=native, but the compiled module cdcd._native is not built ({exc}): run `make venv`"
                f" (it needs cargo), or set {VARIABLE}=python"
            ) from exc
        return PYTHON
    return NativeStage()


STAGE: Final = load(os.environ.get(VARIABLE, "").strip().lower())
IMPL: Final[Implementation] = STAGE.name

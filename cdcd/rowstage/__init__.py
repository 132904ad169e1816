"""Which implementation of the per-row stage runs: the compiled one (``cdcd._native``, Rust) or Python's.

Chosen once, at import, like psycopg's ``PSYCOPG_IMPL``: ``CDCD_IMPL=native`` requires the compiled module,
``CDCD_IMPL=python`` never loads it, unset takes the compiled module when it was built. The Python modules
are the specification: the compiled functions implement the plain forms of their inputs and hand everything
else (unusual text forms, malformed bytes, errors) back to them, so both give the same results and raise
the same typed errors.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Final, Literal

VARIABLE: Final = "CDCD_IMPL"


class ImplementationError(ImportError):
    """CDCD_IMPL asks for something that cannot be had."""


def _load(requested: str) -> ModuleType | None:
    if requested == "python":
        return None
    if requested not in ("", "native"):
        raise ImplementationError(f"{VARIABLE}={requested!r} is not an implementation: use native or python")
    try:
        from cdcd import _native  # type: ignore[attr-defined]  # noqa: PLC0415 - optional compiled module
    except ImportError as exc:
        if requested == "native":
            raise ImplementationError(
                f"{VARIABLE}=native, but the compiled module cdcd._native is not built ({exc}): run `make venv`"
                f" (it needs cargo), or set {VARIABLE}=python"
            ) from exc
        return None
    module: ModuleType = _native
    return module


native: Final = _load(os.environ.get(VARIABLE, "").strip().lower())
IMPL: Final[Literal["native", "python"]] = "python" if native is None else "native"

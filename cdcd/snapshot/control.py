"""cdcd's own logical decoding messages, written to the WAL and read back from the stream. Pure.

* ``cdcd.watermark``: the low and high watermarks around an incremental snapshot chunk
  (``{"slot", "id", "mark": "low" | "high"}``);
* ``cdcd.snapshot``: a request for an incremental snapshot (``{"slot", "table", "where", "id"}``), written by
  ``cdcd snapshot``.

They are never published, whatever ``source.messages`` says.
"""

from __future__ import annotations

import json
from typing import Any

WATERMARK_PREFIX = "cdcd.watermark"
REQUEST_PREFIX = "cdcd.snapshot"


def encode(content: dict[str, Any]) -> str:
    return json.dumps(content)


def decode(content: bytes) -> dict[str, Any] | None:
    """The content of a control message; None when it is not a JSON object (never written by cdcd)."""
    try:
        value = json.loads(content)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None

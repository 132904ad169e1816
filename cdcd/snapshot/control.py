"""cdcd's own logical decoding messages, written to the WAL and read back from the stream. Pure.

* ``cdcd.watermark``: the low and high watermarks around an incremental snapshot chunk
  (``{"slot", "id", "mark": "low" | "high"}``);
* ``cdcd.snapshot``: a request for an incremental snapshot (``{"slot", "table", "where", "id", "hmac"}``), written
  by ``cdcd snapshot``.

They are never published, whatever ``source.messages`` and ``source.message_prefixes`` say (the replication core
recognises them before the user's filter). Any database role can write a message with either prefix, so their
content is read with bounds (``cdcd.snapshot.untrusted``), and a request is acted on only when its ``hmac`` is the
HMAC-SHA256, under the request key (``snapshot.request_key_file`` / ``_env``), of the rest of it
(``signed``/``verify``): a role that does not hold the key cannot ask for a snapshot.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from cdcd.snapshot.untrusted import Rejected, json_object

WATERMARK_PREFIX = "cdcd.watermark"
REQUEST_PREFIX = "cdcd.snapshot"
_MAC = "hmac"


def encode(content: dict[str, Any]) -> str:
    return json.dumps(content)


def decode(content: bytes) -> dict[str, Any] | Rejected:
    """The content of a control message, or why it is none cdcd reads."""
    return json_object(content, "content")


def signed(content: dict[str, Any], key: bytes) -> dict[str, Any]:
    """``content`` with its ``hmac`` under ``key``."""
    return {**content, _MAC: _mac(content, key)}


def verify(content: dict[str, Any], key: bytes) -> dict[str, Any] | Rejected:
    """``content`` without its ``hmac`` when that is right under ``key``, or why not."""
    mac = content.get(_MAC)
    if not isinstance(mac, str):
        return Rejected("unsigned", "the request is not signed")
    body = {k: v for k, v in content.items() if k != _MAC}
    if not hmac.compare_digest(mac, _mac(body, key)):
        return Rejected("bad_signature", "the request's signature is not made with this cdcd's request key")
    return body


def _mac(content: dict[str, Any], key: bytes) -> str:
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hmac.new(key, canonical.encode("ascii"), hashlib.sha256).hexdigest()

"""Confluent wire format and the schema registry, without Spark.

A message value or key is ``0x00`` (the magic byte), the writer schema's id as a 4-byte big-endian integer,
then the Avro binary body. Open-source Spark's ``from_avro`` knows no registry, so the job strips these five
bytes and looks the writer schema up by id (``GET /schemas/ids/{id}``, the Confluent API that cdcd's registry
speaks), once per id.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Final

MAGIC: Final = 0
HEADER_SIZE: Final = 5


class WireFormatError(ValueError):
    """A message that is not in the Confluent wire format."""


def schema_id(header: bytes | bytearray | None) -> int | None:
    """The writer schema id in the first five bytes of a key or value; None for a null key or value."""
    if header is None:
        return None
    if len(header) < HEADER_SIZE:
        raise WireFormatError(f"message of {len(header)} bytes is shorter than the 5-byte wire-format header")
    if header[0] != MAGIC:
        raise WireFormatError(f"magic byte is {header[0]}, not 0: not the Confluent wire format")
    return int.from_bytes(header[1:HEADER_SIZE], "big")


def header(id_: int) -> bytes:
    """The five header bytes of a key or value written with schema ``id_``."""
    return bytes([MAGIC]) + id_.to_bytes(4, "big")


def topic_pattern(prefix: str) -> str:
    """The Kafka ``subscribePattern`` for the table topics under ``prefix``: ``<prefix>.<schema>.<table>``.

    cdcd's own ``<prefix>.message`` and ``<prefix>.transaction`` topics have one dot-separated part fewer, so
    the pattern (two parts after the prefix) leaves them out.
    """
    return re.escape(prefix) + r"\.[^.]+\.[^.]+"


def table_of(topic: str, prefix: str) -> tuple[str, str] | None:
    """(schema, table) of a table topic, None for anything else."""
    if not topic.startswith(prefix + "."):
        return None
    parts = topic[len(prefix) + 1 :].split(".")
    if len(parts) != 2:  # cdcd's <prefix>.message and <prefix>.transaction have one part
        return None
    return parts[0], parts[1]


class Registry:
    """Writer schemas by id from a Confluent-compatible registry; ids are immutable, so each is fetched once."""

    def __init__(self, url: str, auth: tuple[str, str] | None = None, timeout: float = 30) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        if auth is not None:
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._cache: dict[int, str] = {}
        self._lock = threading.Lock()

    def schema(self, id_: int) -> str:
        """The schema with this id, as the registry's JSON text."""
        with self._lock:
            cached = self._cache.get(id_)
        if cached is not None:
            return cached
        text = str(self._get(f"/schemas/ids/{id_}")["schema"])
        with self._lock:
            self._cache[id_] = text
        return text

    def parsed(self, id_: int) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.schema(id_))
        return parsed

    def _get(self, path: str) -> dict[str, Any]:
        request = urllib.request.Request(self.url + path, headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise LookupError(f"schema registry {self.url}{path}: HTTP {exc.code} {exc.reason}") from None
        return body

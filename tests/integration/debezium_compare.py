"""Reading two connectors' topics the same way and comparing them field by field: cdcd's and Debezium's, captured
from the same WAL. Used by ``test_debezium_envelope.py``.

Messages are read raw and decoded with fastavro against the writer schema the registry's Confluent API returns
for each message's schema id (logical types not applied), so a difference in representation (a string where the
other sends a long) shows as one, as does one in the schemas themselves (record names, field order, logical
types, Debezium's ``connect.name`` semantic types)."""

from __future__ import annotations

import io
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import fastavro
from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.integration.kafka_harness import read_partitions

PREFIX = "<prefix>"  # what either side's topic prefix becomes in names and values


@dataclass(frozen=True)
class Decoded:
    """An Avro payload: its value and its writer schema, as the registry has it (parsed JSON)."""

    value: Any
    schema: Any


@dataclass(frozen=True)
class Message:
    key: Decoded | None
    value: Decoded | None  # None: a tombstone
    headers: dict[str, Any]  # Avro headers decoded, others as text


class Registry:
    """Writer schemas by id, from the registry's Confluent API."""

    def __init__(self, url: str) -> None:
        self.client = SchemaRegistryClient({"url": url})
        self._schemas: dict[int, tuple[Any, Any]] = {}

    def decode(self, raw: bytes) -> Decoded:
        assert raw[0] == 0, f"not the Confluent wire format: magic byte {raw[0]}"
        schema_id = int.from_bytes(raw[1:5], "big")
        if schema_id not in self._schemas:
            text = self.client.get_schema(schema_id).schema_str
            assert text is not None
            parsed = json.loads(text)
            self._schemas[schema_id] = (parsed, fastavro.parse_schema(_plain(parsed)))
        parsed, compiled = self._schemas[schema_id]
        return Decoded(fastavro.schemaless_reader(io.BytesIO(raw[5:]), compiled, None), parsed)

    def header(self, raw: bytes | None) -> Any:
        if raw is None:
            return None
        if len(raw) > 5 and raw[0] == 0:  # the Confluent wire format (text never starts with NUL)
            return self.decode(raw).value
        return raw.decode(errors="replace")


def _plain(schema: Any) -> Any:
    """The schema without logical types: values are compared as written (decimal bytes, timestamp longs), and
    the logical types in the schema comparison."""
    if isinstance(schema, list):
        return [_plain(s) for s in schema]
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if k != "logicalType"}
    return schema


def subjects(registry_url: str, prefix: str, topics: dict[str, list[Message]]) -> set[str]:
    """The registry subjects (TopicNameStrategy: ``<topic>-key``, ``<topic>-value``) of a side's topics that
    the registry has, the prefix replaced. Looked up as artifacts of Apicurio's own API (Debezium's converter
    registers through it, so its subjects are not listed by the Confluent API)."""
    base = registry_url.replace("/apis/ccompat/v7", "/apis/registry/v2")
    found = set()
    for topic, messages in topics.items():
        for part in ("key", "value"):
            if not any(getattr(m, part) is not None for m in messages):
                continue
            subject = f"{prefix}.{topic}-{part}"
            url = f"{base}/groups/default/artifacts/{urllib.parse.quote(subject)}/meta"
            try:
                with urllib.request.urlopen(url, timeout=10):
                    found.add(subject.replace(prefix, PREFIX))
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
    return found


def read_topics(bootstrap: str, registry: Registry, prefix: str, timeout: float = 60) -> dict[str, list[Message]]:
    """Every message of the topics ``<prefix>.*``, from their start to their current end, by topic name with the
    prefix cut off (one partition each: the order is the topic's)."""
    out: dict[str, list[Message]] = defaultdict(list)
    for message in read_partitions(bootstrap, prefix, "read_committed", timeout):
        raw_key, raw_value = message.key(), message.value()
        pairs: list[tuple[str, bytes | None]] = message.headers() or []  # type: ignore[assignment]
        out[str(message.topic())[len(prefix) + 1 :]].append(
            Message(
                None if raw_key is None else registry.decode(raw_key),
                None if raw_value is None else registry.decode(raw_value),
                {name: registry.header(raw) for name, raw in pairs},
            )
        )
    return dict(out)


# -- comparing -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """One difference at a path (``<topic> value.after.ts``), with an example of each side's value."""

    path: str
    cdcd: Any
    debezium: Any

    def __str__(self) -> str:
        return f"{self.path}: cdcd {_show(self.cdcd)} | debezium {_show(self.debezium)}"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


MISSING = "<missing>"


def diff(path: str, cdcd: Any, dbz: Any) -> Iterator[Difference]:
    """The differences between two decoded values (or schemas), by path; dict keys in either side compared."""
    if isinstance(cdcd, dict) and isinstance(dbz, dict):
        for name in list(dict.fromkeys([*cdcd, *dbz])):
            yield from diff(f"{path}.{name}", cdcd.get(name, MISSING), dbz.get(name, MISSING))
    elif isinstance(cdcd, list) and isinstance(dbz, list) and len(cdcd) == len(dbz):
        for i, (a, b) in enumerate(zip(cdcd, dbz, strict=True)):
            yield from diff(f"{path}[{i}]", a, b)
    elif type(cdcd) is not type(dbz) or (cdcd != dbz and not (_nan(cdcd) and _nan(dbz))):
        yield Difference(path, cdcd, dbz)


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def schema_shape(schema: Any, prefix: str, seen: set[str] | None = None, space: str = "") -> Any:
    """A schema as comparable data: records by full name (namespaces inherited as Avro does, the prefix
    replaced) with their fields in order, unions as lists, primitives with their logical type and Debezium's
    ``connect.name``; a named type met before is its full name."""
    seen = set() if seen is None else seen
    if isinstance(schema, list):
        return [schema_shape(s, prefix, seen, space) for s in schema]
    if isinstance(schema, str):
        name = schema if schema in _PRIMITIVES or "." in schema or not space else f"{space}.{schema}"
        return name.replace(prefix, PREFIX)
    kind = schema["type"]
    if kind == "record":
        full = _full_name(schema, space)
        name = full.replace(prefix, PREFIX)
        if name in seen:
            return name
        seen.add(name)
        inner = full.rpartition(".")[0]
        fields = {f["name"]: schema_shape(f["type"], prefix, seen, inner) for f in schema["fields"]}
        return {"record": name, "field order": list(fields), **fields}
    if kind == "array":
        return {"array": schema_shape(schema["items"], prefix, seen, space)}
    if kind == "map":
        return {"map": schema_shape(schema["values"], prefix, seen, space)}
    if kind == "enum":
        return {"enum": _full_name(schema, space), "symbols": schema["symbols"]}
    shape = {"type": kind}
    for prop in ("logicalType", "connect.name", "precision", "scale"):
        if prop in schema:
            shape[prop] = schema[prop]
    return shape if len(shape) > 1 else kind


def _full_name(schema: dict[str, Any], space: str) -> str:
    name = str(schema["name"])
    namespace = schema.get("namespace", space)
    return name if "." in name or not namespace else f"{namespace}.{name}"


def compare_topics(
    cdcd: dict[str, list[Message]], cdcd_prefix: str, dbz: dict[str, list[Message]], dbz_prefix: str
) -> list[Difference]:
    """Every difference between the two sides' topics: the topic set, per topic the message count, and per
    message (in topic order) key, value, headers and both schemas."""
    out: list[Difference] = []
    for topic in dict.fromkeys([*cdcd, *dbz]):
        mine, theirs = cdcd.get(topic), dbz.get(topic)
        if mine is None or theirs is None:
            out.append(Difference(f"topics {topic}", mine is not None, theirs is not None))
            continue
        if len(mine) != len(theirs):
            out.append(Difference(f"{topic} message count", len(mine), len(theirs)))
        for a, b in zip(mine, theirs, strict=False):
            out.extend(_compare_message(topic, a, cdcd_prefix, b, dbz_prefix))
    return out


# What differs between any two connectors' runs: processing times (the envelope's ts_*, not source's) and the
# connector's version. Their presence and types are still compared (the schemas).
VOLATILE: Final = ("ts_ms", "ts_us", "ts_ns")


def _steady(value: Any, topic: str) -> Any:
    if not isinstance(value, dict) or topic == "transaction":
        return value
    out: dict[str, Any] = {k: ("<time>" if k in VOLATILE and v is not None else v) for k, v in value.items()}
    source = out.get("source")
    if isinstance(source, dict):
        out["source"] = {**source, "version": "<version>"}
    return out


def _compare_message(topic: str, a: Message, pa: str, b: Message, pb: str) -> Iterable[Difference]:
    for part in ("key", "value"):
        x, y = getattr(a, part), getattr(b, part)
        if (x is None) != (y is None):
            yield Difference(f"{topic} {part} present", x is not None, y is not None)
            continue
        if x is None or y is None:
            continue
        mine, theirs = _values(x.value, pa), _values(y.value, pb)
        if part == "value":
            mine, theirs = _steady(mine, topic), _steady(theirs, topic)
        yield from diff(f"{topic} {part}", mine, theirs)
        yield from diff(f"{topic} {part} schema", schema_shape(x.schema, pa), schema_shape(y.schema, pb))
    yield from diff(f"{topic} headers", _values(a.headers, pa), _values(b.headers, pb))


def _values(value: Any, prefix: str) -> Any:
    """A decoded value with the topic prefix replaced wherever it appears as a string."""
    if isinstance(value, dict):
        return {k: _values(v, prefix) for k, v in value.items()}
    if isinstance(value, list):
        return [_values(v, prefix) for v in value]
    if isinstance(value, str):
        return value.replace(prefix, PREFIX)
    return value


def by_kind(differences: Iterable[Difference]) -> dict[str, list[Difference]]:
    """The differences by kind: their path with list indexes dropped and a table topic written ``<table>``."""
    out: dict[str, list[Difference]] = defaultdict(list)
    for d in differences:
        out[general(d.path)].append(d)
    return dict(sorted(out.items()))


def summary(kinds: dict[str, list[Difference]]) -> list[str]:
    """One line per kind of difference: its count and one example."""
    return [f"{kind} ({len(ds)}x) e.g. {ds[0]}" for kind, ds in kinds.items()]


def general(path: str) -> str:
    topic, sep, rest = path.partition(" ")
    if topic.count(".") == 1:  # <schema>.<table>
        path = f"<table>{sep}{rest}"
    out, depth = [], 0
    for ch in path:
        if ch == "[":
            depth += 1
            out.append("[]")
        elif ch == "]":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)

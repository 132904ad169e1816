"""Avro encoding of change events (Debezium-compatible envelopes). Pure: values in, bytes out, no I/O.

    schemas = build_schemas(relation, prefix, types)        # Key / Value / Envelope schema dicts
    encoder = EnvelopeEncoder(schemas)                       # compiled once per Relation message
    encoder.encode_value(op, before, after, source, lsn, ts_us, transaction)  -> Avro binary of the Envelope
    encoder.encode_key(row)                                  -> Avro binary of the Key

Rows are cdcd ``Row`` tuples in relation column order: ``str`` text form, ``bytes`` binary form, None for
NULL, ``...`` for an unchanged TOAST value (written as null and listed in the envelope's ``unchanged_toast``).
For a ``K`` old tuple (replica identity only) the non-key columns are None, so ``before`` carries only the key
columns' values and null for the rest. ``source`` is a per-transaction SourceInfo (the encoder caches its
bytes by identity); ``lsn`` the event's. Values are dispatched per value (str -> text form, bytes -> binary form),
so one encoder serves both tuple formats. The output carries no Confluent wire header (the sink adds it).
"""

from cdcd.avro.encoder import EnvelopeEncoder, SourceInfo, TxInfo
from cdcd.avro.schema import RelationSchemas, SchemaError, build_schemas, sanitize
from cdcd.avro.types import ConversionError, TypeMapping, type_mapping

__all__ = [
    "ConversionError",
    "EnvelopeEncoder",
    "RelationSchemas",
    "SchemaError",
    "SourceInfo",
    "TxInfo",
    "TypeMapping",
    "build_schemas",
    "sanitize",
    "type_mapping",
]

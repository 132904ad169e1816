"""The row stage compiled: ``cdcd._native`` (native/src), falling back to the Python specification for every
input it leaves (``None`` from a reader: the stage's Python function reads it or names the error). Importing
this module fails when the extension is not built; ``cdcd.rowstage`` decides what that means."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from cdcd import _native
from cdcd.pgoutput.messages import Relation, Row
from cdcd.snapshot.copy import row_reader

if TYPE_CHECKING:
    from cdcd.avro.metadata import TransactionFieldsEncoder
    from cdcd.rowstage.stage import ChangeReader, CopyRowReader, Encoded, Envelope, FieldSpec, LaneOutput, LaneTable


class NativeRows:
    """Row writers, envelopes and encoded runs of ``cdcd._native``."""

    @staticmethod
    def row_writer(
        fields: Sequence[FieldSpec],
        ncols: int,
        nullable: bool,
        defaults: Sequence[bytes | None] | None = None,
        placeholders: Sequence[bytes | None] | None = None,
    ) -> _native.RowWriter:
        return _native.RowWriter(fields, ncols, nullable, defaults, placeholders)

    @staticmethod
    def envelope(  # noqa: PLR0917 - the compiled constructor's parameters
        value_row: _native.RowWriter,
        key_row: _native.RowWriter | None,
        connector_name: bytes,
        schema_table: bytes,
        reference_value: Callable[..., bytes],
        reference_key: Callable[[Row], bytes],
        debezium: bool = False,
    ) -> Envelope:
        constants = connector_name, schema_table
        return _native.Envelope(value_row, key_row, *constants, reference_value, reference_key, debezium=debezium)

    @staticmethod
    def encoded(data: bytes | None = None, count: int = 0) -> Encoded:
        return _native.Encoded(data, count)


class NativeLane:
    """``cdcd._native.plain_transactions`` and its tables."""

    @staticmethod
    def plain_transactions(  # noqa: PLR0917 - the compiled function's parameters
        frames: list[bytes],
        start: int,
        relations: Mapping[int, Relation],
        tables: Mapping[int, LaneTable | Relation],
        version: str,
        db: str,
        transaction_topic: tuple[str, bytes, bytes] | None,
        tombstones: bool,
        after: int,
        last_commit_lsn: int | None,
        now_us: int,
        max_changes: int,
        max_records: int,
        debezium: bool = False,
    ) -> LaneOutput:
        return _native.plain_transactions(
            frames, start, relations, tables, version, db, transaction_topic, tombstones, after,
            last_commit_lsn, now_us, max_changes, max_records, debezium=debezium,
        )  # fmt: skip

    @staticmethod
    def table(  # noqa: PLR0917 - the compiled constructor's parameters
        relation: Relation,
        envelope: Envelope,
        topic: str,
        table: str,
        key_header: bytes | None,
        value_header: bytes,
        key_positions: Sequence[int],
        collection: str | None = None,
    ) -> LaneTable:
        headers = key_header, value_header
        return _native.LaneTable(relation, envelope, topic, table, *headers, key_positions, collection)


def _copy_row_reader() -> CopyRowReader:
    """COPY rows by ``copy_row``; what it leaves (anything unusual), ``parse_line`` reads or refuses."""
    fast, slow = _native.copy_row, row_reader()

    def read(data: bytes, width: int) -> Row:
        row = fast(data, width)
        return slow(data, width) if row is None else row

    return read


class NativeStage:
    """The compiled row stage; ``CDCD_IMPL=native``, or unset with the extension built."""

    name: Literal["native"] = "native"
    rows: NativeRows = NativeRows()
    lane: NativeLane = NativeLane()

    @staticmethod
    def change_reader(encoding: str) -> ChangeReader | None:
        """``read_change`` reads UTF-8 text only (not a SQL_ASCII database's bytes: ``wire_encoding``)."""
        utf8 = encoding.replace("-", "").replace("_", "").lower() == "utf8"
        return _native.read_change if utf8 else None

    @staticmethod
    def copy_row_reader() -> CopyRowReader:
        return _copy_row_reader()

    @staticmethod
    def transaction_fields_encoder() -> TransactionFieldsEncoder:
        return _native.transaction_event

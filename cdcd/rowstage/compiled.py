"""The row stage compiled: ``cdcd._native`` (native/src), falling back to the Python specification for every
input it leaves (``None`` from a reader: the stage's Python function reads it or names the error). Importing
this module fails when the extension is not built; ``cdcd.rowstage`` decides what that means."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, cast

from cdcd import _native
from cdcd.pgoutput.messages import Row
from cdcd.snapshot.copy import row_reader, rows_reader

if TYPE_CHECKING:
    from cdcd.avro.metadata import TransactionFieldsEncoder
    from cdcd.rowstage.stage import ChangeReader, CopyRowReader, CopyRowsReader


class NativeRows:
    """Row writers, envelopes, encoded runs and snapshot records: ``cdcd._native``'s (``RowStage.rows``)."""

    row_writer = staticmethod(_native.RowWriter)
    envelope = staticmethod(_native.Envelope)
    encoded = staticmethod(_native.Encoded)
    copy_records = staticmethod(_native.copy_records)  # COPY lines to a snapshot's records, without the GIL


class NativeLane:
    """``cdcd._native.plain_transactions`` and its tables (``RowStage.lane``)."""

    plain_transactions = staticmethod(_native.plain_transactions)
    table = staticmethod(_native.LaneTable)


def _copy_row_reader() -> CopyRowReader:
    """COPY rows by ``copy_row``; what it leaves (anything unusual), ``parse_line`` reads or refuses."""
    fast, slow = _native.copy_row, row_reader()

    def read(data: bytes, width: int) -> Row:
        row = fast(data, width)
        return slow(data, width) if row is None else row

    return read


def _copy_rows_reader() -> CopyRowsReader:
    """COPY lines by ``copy_rows`` (parsed without the GIL); the lines it gives back (anything unusual), each by
    the specification (``rows_reader``), which reads them or raises its error."""
    fast, slow = _native.copy_rows, rows_reader()

    def read(data: bytes, width: int) -> list[Row]:
        rows, left = fast(data, width)
        for i in left:
            (rows[i],) = slow(cast("bytes", rows[i]), width)
        return cast("list[Row]", rows)

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
    def copy_rows_reader() -> CopyRowsReader:
        return _copy_rows_reader()

    @staticmethod
    def transaction_fields_encoder() -> TransactionFieldsEncoder:
        return _native.transaction_event

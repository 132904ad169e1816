"""The row stage as the Python specification: the stages' own functions, nothing compiled (``CDCD_IMPL=python``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from cdcd.avro.metadata import encode_transaction_fields
from cdcd.snapshot.copy import row_reader, rows_reader

if TYPE_CHECKING:
    from cdcd.avro.metadata import TransactionFieldsEncoder
    from cdcd.rowstage.stage import ChangeReader, CompiledRows, CopyRowReader, CopyRowsReader, Lane


class PythonStage:
    """No compiled rows, no lane: the decoder, the encoders and the shaper do every row in Python."""

    name: Literal["python"] = "python"
    rows: CompiledRows | None = None
    lane: Lane | None = None

    def change_reader(self, encoding: str) -> ChangeReader | None:
        return None

    def copy_row_reader(self) -> CopyRowReader:
        return row_reader()

    def copy_rows_reader(self) -> CopyRowsReader:
        return rows_reader()

    def transaction_fields_encoder(self) -> TransactionFieldsEncoder:
        return encode_transaction_fields

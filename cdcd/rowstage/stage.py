"""The row stage's interface: the per-row operations the pipeline asks of it, whichever implementation runs.

The Python implementation (``python.py``) is the specification: the functions it hands out live in the stages
they belong to (the decoder, the COPY reader, the Avro metadata) and stay the oracle. The compiled one
(``compiled.py``, ``cdcd._native``) implements the plain forms of the same operations and hands everything else
back to them. What only the compiled code has (row writers and envelopes, encoded runs, the lane) is an
attribute that is None in the specification, so a caller asks the stage, never whether a module is there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias

from cdcd.pgoutput.messages import Relation, Row, RowChange

if TYPE_CHECKING:
    # the compiled objects' types (cdcd/_native.pyi), for the stages that hold them
    from cdcd._native import Encoded, Envelope, FieldSpec, LaneOutput, LaneTable, RowWriter
    from cdcd.avro.metadata import TransactionFieldsEncoder
    from cdcd.rowstage.compiled import NativeLane, NativeRows

__all__ = [
    "ChangeReader",
    "CompiledRows",
    "CopyRowReader",
    "CopyRowsReader",
    "Encoded",
    "Envelope",
    "FieldSpec",
    "Implementation",
    "Lane",
    "LaneOutput",
    "LaneTable",
    "RowStage",
    "RowWriter",
]

Implementation = Literal["native", "python"]
# read(payload, wal_lsn, in_stream, relations, RowChange): an Insert, Update or Delete; None: the decoder reads it
ChangeReader = Callable[[bytes, int, bool, Mapping[int, Relation], type[RowChange]], RowChange | None]
CopyRowReader = Callable[[bytes, int], Row]  # read(line with its newline, width): one COPY text row
CopyRowsReader = Callable[[bytes, int], list[Row]]  # read(lines, each with its newline, width): their rows


# What only the compiled stage has: ``cdcd._native``'s row writers, envelopes and encoded runs (built by
# ``cdcd.avro.encoder.EnvelopeEncoder`` from a table's column mappings; runs: ``cdcd.batches.EncodedRun``) and
# its lane (``cdcd.replication.lane``). Their signatures are the stub's (``cdcd/_native.pyi``), written once.
CompiledRows: TypeAlias = "NativeRows"
Lane: TypeAlias = "NativeLane"


class RowStage(Protocol):
    """The row stage: ``cdcd.rowstage.STAGE`` is the one chosen for the process (``CDCD_IMPL``)."""

    @property
    def name(self) -> Implementation: ...
    @property
    def rows(self) -> CompiledRows | None:
        """Compiled row writers and envelopes; None: the encoders' Python code only."""

    @property
    def lane(self) -> Lane | None:
        """The compiled lane; None: the core and the shaper take every frame."""

    def change_reader(self, encoding: str) -> ChangeReader | None:
        """The reader of a change's tuples for a stream in ``encoding``; None: the decoder's Python reading."""

    def copy_row_reader(self) -> CopyRowReader: ...
    def copy_rows_reader(self) -> CopyRowsReader: ...
    def transaction_fields_encoder(self) -> TransactionFieldsEncoder: ...

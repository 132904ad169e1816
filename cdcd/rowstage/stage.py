"""The row stage's interface: the per-row operations the pipeline asks of it, whichever implementation runs.

The Python implementation (``python.py``) is the specification: the functions it hands out live in the stages
they belong to (the decoder, the COPY reader, the Avro metadata) and stay the oracle. The compiled one
(``compiled.py``, ``cdcd._native``) implements the plain forms of the same operations and hands everything else
back to them. What only the compiled code has (row writers and envelopes, encoded runs, the lane) is an
attribute that is None in the specification, so a caller asks the stage, never whether a module is there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

from cdcd.pgoutput.messages import Relation, Row, RowChange

if TYPE_CHECKING:
    # the compiled objects' types (cdcd/_native.pyi), for the stages that hold them
    from cdcd._native import Encoded, Envelope, FieldSpec, LaneOutput, LaneTable, RowWriter
    from cdcd.avro.metadata import TransactionFieldsEncoder

__all__ = [
    "ChangeReader",
    "CompiledRows",
    "CopyRowReader",
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


class CompiledRows(Protocol):
    """A table's compiled row writers and envelope (``cdcd.avro.encoder.EnvelopeEncoder`` builds them from its
    column mappings) and the runs of changes its envelope encodes as they arrive (``cdcd.batches.EncodedRun``)."""

    def row_writer(
        self,
        fields: Sequence[FieldSpec],
        ncols: int,
        nullable: bool,
        defaults: Sequence[bytes | None] | None = None,
        placeholders: Sequence[bytes | None] | None = None,
    ) -> RowWriter: ...
    def envelope(  # noqa: PLR0917 - the compiled constructor's parameters
        self,
        value_row: RowWriter,
        key_row: RowWriter | None,
        connector_name: bytes,
        schema_table: bytes,
        reference_value: Callable[..., bytes],
        reference_key: Callable[[Row], bytes],
        debezium: bool = False,
    ) -> Envelope: ...
    def encoded(self, data: bytes | None = None, count: int = 0) -> Encoded: ...


class Lane(Protocol):
    """Whole plain transactions from walsender frames to Kafka records (``cdcd.replication.lane``)."""

    def plain_transactions(  # noqa: PLR0917 - the compiled function's parameters
        self,
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
    ) -> LaneOutput: ...
    def table(  # noqa: PLR0917 - the compiled constructor's parameters
        self,
        relation: Relation,
        envelope: Envelope,
        topic: str,
        table: str,
        key_header: bytes | None,
        value_header: bytes,
        key_positions: Sequence[int],
        collection: str | None = None,
    ) -> LaneTable: ...


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
    def transaction_fields_encoder(self) -> TransactionFieldsEncoder: ...

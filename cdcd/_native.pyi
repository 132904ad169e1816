"""Types of the compiled row stage (native/src, built by maturin as ``cdcd._native``). Only ``cdcd.rowstage``
imports it; what each function does is in native/src/lib.rs, and the Python specification it stands for is named
there. ``None`` from a reader or writer: the input is left to the Python specification."""

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, final

from cdcd.avro.encoder import SourceInfo, TxInfo
from cdcd.batches import Plain
from cdcd.pgoutput.messages import Relation, Row, RowChange, Value

class _Change(Protocol):  # a RowChange as the compiled code reads it
    @property
    def op(self) -> str: ...
    @property
    def old(self) -> Row | None: ...
    @property
    def new(self) -> Row | None: ...

# (index, conversion code, its parameter, the reference writer of a non-null value, the field's encoded name)
FieldSpec = tuple[int, int, int, Callable[[Value], bytes], bytes]
# a column's mask rule: (code, n, the salt or the constant's UTF-8), as cdcd.columns.Mask.native gives it
MaskSpec = tuple[int, int, bytes]
Emit = Callable[[str, bytes | None, bytes | None, None], object]

def read_tuple(buf: bytes, pos: int, /) -> tuple[Row, int] | None: ...
def read_change(
    buf: bytes, wal_lsn: int, in_stream: bool, relations: Mapping[int, Relation], row_change: type[RowChange], /
) -> RowChange | None: ...
def transaction_event(
    status: str,
    txn_id: str,
    ts_ms: int,
    event_count: int | None,
    data_collections: Sequence[tuple[str, int]] | None,
    debezium: bool,
    /,
) -> tuple[bytes, bytes]: ...
def copy_row(data: bytes, width: int, /) -> Row | None: ...
def copy_rows(data: bytes, width: int, /) -> tuple[list[Row | bytes], list[int]]: ...
def copy_records(
    data: bytes,
    width: int,
    rows: RowWriter,
    key_rows: RowWriter | None,
    key_header: bytes | None,
    value_header: bytes,
    rest: bytes,
    topic: str,
) -> tuple[list[Plain | None], list[tuple[int, bytes]]]: ...

@final
class RowWriter:
    def __init__(
        self,
        fields: Sequence[FieldSpec],
        ncols: int,
        nullable: bool,
        defaults: Sequence[bytes | None] | None = None,
        placeholders: Sequence[bytes | None] | None = None,
        masks: Sequence[MaskSpec | None] | None = None,
    ) -> None: ...
    def __call__(self, row: Row, append: Callable[[bytes], object], toast: Callable[[str], object], /) -> None: ...

@final
class Encoded:
    """A run of one table's changes, encoded as they arrived (``cdcd.batches.EncodedRun``)."""

    def __init__(self, data: bytes | None = None, count: int = 0) -> None: ...
    def __len__(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def data(self) -> bytes: ...
    def shrink(self) -> None: ...
    def truncate(self, keep: int, /) -> int: ...
    def messages(self) -> list[tuple[bytes, int, bool]]: ...
    def first_lsn(self) -> int | None: ...

@final
class Envelope:
    def __init__(
        self,
        rows: RowWriter,
        key_rows: RowWriter | None,
        connector_name: bytes,
        schema_table: bytes,
        reference_value: Callable[..., bytes],
        reference_key: Callable[[Row], bytes],
        debezium: bool = False,
    ) -> None: ...
    def encode_value(
        self,
        op: str,
        before: Row | None,
        after: Row | None,
        source: SourceInfo,
        lsn: int | None,
        ts_us: int | None,
        transaction: TxInfo | None = None,
    ) -> bytes: ...
    def encode_key(self, row: Row, /) -> bytes: ...
    def rows(
        self,
        changes: Sequence[_Change],
        start: int,
        source: SourceInfo,
        ts_us: int | None,
        txn_id: str,
        total: int,
        dco: int,
        topic: str,
        key_header: bytes | None,
        value_header: bytes,
        key_positions: Sequence[int],
        tombstones: bool,
        emit: Emit | list[Plain],
    ) -> tuple[int, list[int]]: ...
    def snapshot_rest(self, source: SourceInfo, lsn: int, ts_us: int | None) -> bytes: ...
    def snapshot_rows(
        self,
        rows: Sequence[Row],
        start: int,
        stop: int,
        source: SourceInfo,
        lsn: int,
        ts_us: int | None,
        topic: str,
        key_header: bytes | None,
        value_header: bytes,
        emit: Emit,
    ) -> int: ...
    def prepare(self, change: RowChange, payload: bytes, key_positions: Sequence[int], into: Encoded, /) -> int: ...
    def prepare_frames(
        self,
        frames: list[bytes],
        start: int,
        relation_id: int,
        width: int,
        xid: int | None,
        key_positions: Sequence[int],
        max_rows: int,
        max_bytes: int,
        into: Encoded,
        /,
    ) -> tuple[int, int, int]: ...
    def splice(
        self,
        encoded: Encoded,
        source: SourceInfo,
        ts_us: int | None,
        txn_id: str,
        total: int,
        dco: int,
        topic: str,
        key_header: bytes | None,
        value_header: bytes,
        tombstones: bool,
        out: list[Plain],
    ) -> list[int]: ...

@final
class LaneTable:
    def __init__(
        self,
        relation: Relation,
        envelope: Envelope,
        topic: str,
        table: str,
        key_header: bytes | None,
        value_header: bytes,
        key_positions: Sequence[int],
        collection: str | None = None,
    ) -> None: ...

# (stop, received, records, xids, changes, last commit LSN, end LSN, commit times, events, the relation id to ask)
LaneOutput = tuple[
    int, int, list[Plain], list[int], int, int | None, int, list[int], list[tuple[str, str, int]], int | None
]

def plain_transactions(
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

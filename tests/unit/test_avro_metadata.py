"""Transaction metadata events: the hand-written encoding equals fastavro's from the schemas."""

from __future__ import annotations

import io

from fastavro import parse_schema, schemaless_reader
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcd.avro.metadata import (
    DEBEZIUM_TRANSACTION_VALUE,
    TRANSACTION_VALUE,
    TransactionEvent,
    encode_transaction,
    encode_transaction_reference,
)

longs = st.integers(-(2**63), 2**63 - 1)
events = st.builds(
    TransactionEvent,
    st.sampled_from(["BEGIN", "END"]),
    st.text(max_size=30),
    longs,
    st.none() | longs,
    st.none() | st.lists(st.tuples(st.text(max_size=20), longs), max_size=4).map(tuple),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_hand_encoding_is_byte_identical_to_fastavro(event: TransactionEvent) -> None:
    """Both layouts: cdcd's, and Debezium's (kafka.envelope: debezium), whose collection records are nullable."""
    assert encode_transaction(event) == encode_transaction_reference(event)


def test_decodes_back() -> None:
    event = TransactionEvent("END", "7:123", 1700000000000, 3, (("p.public.a", 2), ("p.public.b", 1)))
    _, value = encode_transaction(event)
    decoded = schemaless_reader(io.BytesIO(value), parse_schema(TRANSACTION_VALUE))
    assert decoded == {
        "status": "END",
        "id": "7:123",
        "event_count": 3,
        "data_collections": [
            {"data_collection": "p.public.a", "event_count": 2},
            {"data_collection": "p.public.b", "event_count": 1},
        ],
        "ts_ms": 1700000000000,
    }


def test_decodes_back_in_debeziums_layout() -> None:
    event = TransactionEvent("END", "7:123", 1700000000000, 1, (("public.a", 1),), debezium=True)
    _, value = encode_transaction(event)
    decoded = schemaless_reader(io.BytesIO(value), parse_schema(DEBEZIUM_TRANSACTION_VALUE))
    assert isinstance(decoded, dict)
    assert decoded["data_collections"] == [{"data_collection": "public.a", "event_count": 1}]
    assert value != encode_transaction(TransactionEvent("END", "7:123", 1700000000000, 1, (("public.a", 1),)))[1]

//! cdcd's per-row stage, compiled (`cdcd._native`). The Python modules stay the specification: this module
//! implements the plain forms of their hot functions, and hands everything else back to them.
//!
//! * `read_tuple(buf, pos)`: pgoutput TupleData (UTF-8 server encoding) to a row tuple, as
//!   `cdcd.pgoutput.decoder.read_tuple` returns it; `None` for anything malformed (the Python decoder then
//!   raises its typed `DecodeError`, with the offset); `read_change`, a whole Insert, Update or Delete.
//! * `RowWriter`: a compiled row record of `cdcd.avro.encoder`: row tuple in, Avro bytes out, with the
//!   columns' mask rules of `cdcd.columns` (`mask.rs`).
//! * `Envelope`: a table's `encode_value` and `encode_key` (`cdcd.avro.encoder.EnvelopeEncoder`), and `rows`, a
//!   run of its changes shaped and emitted (`cdcd.shaping`); `prepare`, a change encoded as it arrives into an
//!   `Encoded` run, and `splice`, such a run's records with its transaction's fields; `transaction_event`, a
//!   BEGIN or END event.
//! * `plain_transactions`: whole plain transactions from walsender frames to Kafka records in one call (the
//!   lane of `cdcd.replication.lane`), with a `LaneTable` per table.
//! * `copy_row`: a `COPY ... TO STDOUT` text line to a row (`cdcd.snapshot.copy`), for snapshots; `copy_rows`,
//!   many lines in one call, parsed without the GIL (a parallel initial snapshot's reader threads);
//!   `copy_records`, many lines to a snapshot's Kafka records in one call, parsed and encoded without the GIL.

use pyo3::prelude::*;

mod avro;
mod convert;
mod copy;
mod encoded;
mod envelope;
mod frame;
mod lane;
mod mask;
mod row;
mod rules;
mod tuple;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(tuple::read_tuple, m)?)?;
    m.add_function(wrap_pyfunction!(tuple::read_change, m)?)?;
    m.add_class::<row::RowWriter>()?;
    m.add_class::<envelope::Envelope>()?;
    m.add_class::<encoded::Encoded>()?;
    m.add_function(wrap_pyfunction!(envelope::transaction_event, m)?)?;
    m.add_function(wrap_pyfunction!(copy::copy_row, m)?)?;
    m.add_function(wrap_pyfunction!(copy::copy_rows, m)?)?;
    m.add_function(wrap_pyfunction!(copy::copy_records, m)?)?;
    m.add_class::<lane::LaneTable>()?;
    m.add_function(wrap_pyfunction!(lane::plain_transactions, m)?)?;
    Ok(())
}

//! One table version's Debezium envelope (`cdcd.avro.encoder.EnvelopeEncoder.encode_value`), compiled: the
//! rows through the table's `RowWriter`, the transaction-wide `source` fields encoded once per `SourceInfo`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};

use crate::avro;
use crate::row::RowWriter;

/// `Envelope(rows, key_rows, connector_name, schema_table, reference_value, reference_key)`: the table's Value
/// and Key (None: no key) record writers; the encoded constant strings of `source` (connector and topic
/// prefix; schema and table); the Python reference's encode_value and encode_key, which get the calls the
/// compiled code refuses (they raise the typed, diagnosed error).
#[pyclass(module = "cdcd._native")]
pub struct Envelope {
    rows: Py<RowWriter>,
    key_rows: Option<Py<RowWriter>>,
    reference_value: Py<PyAny>,
    reference_key: Py<PyAny>,
    connector_name: Vec<u8>,
    schema_table: Vec<u8>,
    /// The `SourceInfo` the parts below were encoded from (compared by identity, as the Python encoder does).
    source: Option<Py<PyAny>>,
    head: Vec<u8>,       // version .. db
    seq_prefix: Vec<u8>, // `[null,` or `["<last commit lsn>",`
    mid: Vec<u8>,        // schema, table, txId
    tail: Vec<u8>,       // commit_lsn, origin
    ts: Option<(i64, Vec<u8>)>,
    txn: Option<(String, Vec<u8>)>,
}

fn nullable_long(out: &mut Vec<u8>, x: Option<i64>) {
    match x {
        None => out.push(0),
        Some(x) => {
            out.push(2);
            avro::long(out, x);
        }
    }
}

fn string_attr(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<String> {
    Ok(obj.getattr(name)?.cast_exact::<PyString>()?.to_str()?.to_owned())
}

#[pymethods]
impl Envelope {
    #[new]
    fn new(
        rows: Py<RowWriter>,
        key_rows: Option<Py<RowWriter>>,
        connector_name: Vec<u8>,
        schema_table: Vec<u8>,
        reference_value: Py<PyAny>,
        reference_key: Py<PyAny>,
    ) -> Self {
        Envelope {
            rows,
            key_rows,
            reference_value,
            reference_key,
            connector_name,
            schema_table,
            source: None,
            head: Vec::new(),
            seq_prefix: Vec::new(),
            mid: Vec::new(),
            tail: Vec::new(),
            ts: None,
            txn: None,
        }
    }

    /// The Avro binary Envelope of one event (the arguments of the Python encoder's ``encode_value``).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (op, before, after, source, lsn, ts_us, transaction=None))]
    fn encode_value<'py>(
        &mut self,
        py: Python<'py>,
        op: Bound<'py, PyAny>,
        before: Bound<'py, PyAny>,
        after: Bound<'py, PyAny>,
        source: Bound<'py, PyAny>,
        lsn: Bound<'py, PyAny>,
        ts_us: Bound<'py, PyAny>,
        transaction: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let compiled = (|| {
            let op = op.cast_exact::<PyString>()?.to_str()?;
            let row = |r: &Bound<'py, PyAny>| -> PyResult<Option<Bound<'py, PyTuple>>> {
                Ok(if r.is_none() {
                    None
                } else {
                    Some(r.cast_exact::<PyTuple>()?.clone())
                })
            };
            self.encode(
                py,
                op,
                row(&before)?,
                row(&after)?,
                &source,
                lsn.extract()?,
                ts_us.extract()?,
                &transaction,
            )
        })();
        match compiled {
            Ok(bytes) => Ok(bytes.into_any()),
            Err(_) => self
                .reference_value
                .bind(py)
                .call1((op, before, after, source, lsn, ts_us, transaction)),
        }
    }

    /// The Avro binary Key record of a row (the Python encoder's ``encode_key``).
    fn encode_key<'py>(&self, py: Python<'py>, row: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if let (Some(key_rows), Ok(tuple)) = (&self.key_rows, row.cast_exact::<PyTuple>()) {
            let mut out = Vec::with_capacity(32);
            if key_rows.get().write(py, tuple, &mut out, &mut |_| Ok(())).is_ok() {
                return Ok(PyBytes::new(py, &out).into_any());
            }
        }
        self.reference_key.bind(py).call1((row,))
    }
}

impl Envelope {
    #[allow(clippy::too_many_arguments)]
    fn encode<'py>(
        &mut self,
        py: Python<'py>,
        op: &str,
        before: Option<Bound<'py, PyTuple>>,
        after: Option<Bound<'py, PyTuple>>,
        source: &Bound<'py, PyAny>,
        lsn: Option<i64>,
        ts_us: Option<i64>,
        transaction: &Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let rows = self.rows.get();
        let mut out = Vec::with_capacity(256);
        let mut toast = Vec::new();
        let mut toast_count = 0i64;
        match &before {
            None => out.push(0),
            Some(row) => {
                out.push(2);
                rows.write(py, row, &mut out, &mut |_| {
                    Err(PyValueError::new_err("unchanged TOAST value in before"))
                })?;
            }
        }
        match &after {
            None => out.push(0),
            Some(row) => {
                out.push(2);
                rows.write(py, row, &mut out, &mut |name| {
                    toast.extend_from_slice(name.as_bytes());
                    toast_count += 1;
                    Ok(())
                })?;
            }
        }
        if !self.source.as_ref().is_some_and(|s| s.bind(py).is(source)) {
            self.encode_source(source)?;
        }
        out.extend_from_slice(&self.head);
        match lsn {
            None => {
                out.push(0);
                out.extend_from_slice(&self.mid);
                out.push(0);
            }
            Some(lsn) => {
                let mut seq = self.seq_prefix.clone();
                seq.extend_from_slice(format!("\"{lsn}\"]").as_bytes());
                out.push(2);
                avro::bytes(&mut out, &seq);
                out.extend_from_slice(&self.mid);
                out.push(2);
                avro::long(&mut out, lsn);
            }
        }
        out.extend_from_slice(&self.tail);
        if !matches!(op, "c" | "u" | "d" | "r" | "t") {
            return Err(PyValueError::new_err("unknown envelope op"));
        }
        avro::bytes(&mut out, op.as_bytes());
        match ts_us {
            None => out.extend_from_slice(&[0, 0]),
            Some(ts) => {
                if self.ts.as_ref().is_none_or(|(cached, _)| *cached != ts) {
                    let mut b = vec![2];
                    avro::long(&mut b, ts.div_euclid(1000));
                    b.push(2);
                    avro::long(&mut b, ts);
                    self.ts = Some((ts, b));
                }
                out.extend_from_slice(self.ts.as_ref().map_or(&[][..], |(_, b)| b));
            }
        }
        match transaction {
            None => out.push(0),
            Some(t) => self.write_transaction(&mut out, t)?,
        }
        if toast_count > 0 {
            avro::long(&mut out, toast_count);
            out.extend_from_slice(&toast);
        }
        out.push(0);
        Ok(PyBytes::new(py, &out))
    }

    fn encode_source(&mut self, s: &Bound<'_, PyAny>) -> PyResult<()> {
        let ts: i64 = s.getattr("ts_us")?.extract()?;
        let mut head = Vec::with_capacity(64);
        avro::bytes(&mut head, string_attr(s, "version")?.as_bytes());
        head.extend_from_slice(&self.connector_name);
        avro::long(&mut head, ts.div_euclid(1000));
        avro::long(&mut head, ts);
        avro::bytes(&mut head, string_attr(s, "snapshot")?.as_bytes());
        avro::bytes(&mut head, string_attr(s, "db")?.as_bytes());
        let last: Option<i64> = s.getattr("last_commit_lsn")?.extract()?;
        let seq_prefix = match last {
            None => b"[null,".to_vec(),
            Some(last) => format!("[\"{last}\",").into_bytes(),
        };
        let mut mid = self.schema_table.clone();
        nullable_long(&mut mid, s.getattr("tx_id")?.extract()?);
        let mut tail = Vec::new();
        nullable_long(&mut tail, s.getattr("commit_lsn")?.extract()?);
        let origin = s.getattr("origin")?;
        if origin.is_none() {
            tail.push(0);
        } else {
            tail.push(2);
            avro::bytes(&mut tail, origin.cast_exact::<PyString>()?.to_str()?.as_bytes());
        }
        (self.head, self.seq_prefix, self.mid, self.tail) = (head, seq_prefix, mid, tail);
        self.source = Some(s.clone().unbind());
        Ok(())
    }

    fn write_transaction(&mut self, out: &mut Vec<u8>, t: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = t.getattr("id")?;
        let id = id.cast_exact::<PyString>()?.to_str()?;
        if self.txn.as_ref().is_none_or(|(cached, _)| cached != id) {
            let mut b = vec![2];
            avro::bytes(&mut b, id.as_bytes());
            self.txn = Some((id.to_owned(), b));
        }
        out.extend_from_slice(self.txn.as_ref().map_or(&[][..], |(_, b)| b));
        avro::long(out, t.getattr("total_order")?.extract()?);
        avro::long(out, t.getattr("data_collection_order")?.extract()?);
        Ok(())
    }
}

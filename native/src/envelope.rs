//! One table version's Debezium envelope (`cdcd.avro.encoder.EnvelopeEncoder.encode_value`), compiled: the
//! rows through the table's `RowWriter`, the transaction-wide `source` fields encoded once per `SourceInfo`.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use crate::avro;
use crate::encoded::Encoded;
use crate::frame::{signed, u32_at, xlogdata};
use crate::row::RowWriter;
use crate::rules::{key_changed, tombstone};
use crate::tuple::change_parts;

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
    /// What the parts below were encoded from: a `SourceInfo` (compared by identity, as the Python encoder
    /// does) or a transaction of the compiled lane.
    source: SourceKey,
    head: Vec<u8>,       // version .. db
    seq_prefix: Vec<u8>, // `[null,` or `["<last commit lsn>",`
    mid: Vec<u8>,        // schema, table, txId
    tail: Vec<u8>,       // commit_lsn, origin
    ts: Option<(i64, Vec<u8>)>,
    txn: Option<(String, Vec<u8>)>,
    /// Debezium's layout (`kafka.envelope: debezium`): its source fields, the transaction block before the
    /// op and named after each event's LSN, ts_ns.
    debezium: bool,
    tx_id: Option<i64>, // the source's, for Debezium's transaction id
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

fn nullable_string(out: &mut Vec<u8>, x: Option<&str>) {
    match x {
        None => out.push(0),
        Some(x) => {
            out.push(2);
            avro::bytes(out, x.as_bytes());
        }
    }
}

/// Debezium's transaction block: named ``<xid>:<event LSN>`` (``cdcd.avro.encoder.debezium_transaction_id``).
fn debezium_block(out: &mut Vec<u8>, transaction: Option<(&str, i64, i64)>, tx_id: Option<i64>, lsn: Option<i64>) {
    let Some((id, total, dco)) = transaction else {
        out.push(0);
        return;
    };
    out.push(2);
    match (tx_id, lsn) {
        (Some(x), Some(lsn)) => avro::bytes(out, format!("{x}:{lsn}").as_bytes()),
        _ => avro::bytes(out, id.as_bytes()),
    }
    avro::long(out, total);
    avro::long(out, dco);
}

fn string_attr(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<String> {
    Ok(obj.getattr(name)?.cast_exact::<PyString>()?.to_str()?.to_owned())
}

/// The transaction-wide fields of the `source` block (`cdcd.avro.encoder.SourceInfo`).
pub struct Source {
    pub version: String,
    pub db: String,
    pub ts_us: i64,
    pub snapshot: String,
    pub tx_id: Option<i64>,
    pub commit_lsn: Option<i64>,
    pub last_commit_lsn: Option<i64>,
    pub origin: Option<String>,
}

impl Source {
    fn of(s: &Bound<'_, PyAny>) -> PyResult<Self> {
        let origin = s.getattr("origin")?;
        Ok(Source {
            version: string_attr(s, "version")?,
            db: string_attr(s, "db")?,
            ts_us: s.getattr("ts_us")?.extract()?,
            snapshot: string_attr(s, "snapshot")?,
            tx_id: s.getattr("tx_id")?.extract()?,
            commit_lsn: s.getattr("commit_lsn")?.extract()?,
            last_commit_lsn: s.getattr("last_commit_lsn")?.extract()?,
            origin: if origin.is_none() {
                None
            } else {
                Some(origin.cast_exact::<PyString>()?.to_str()?.to_owned())
            },
        })
    }
}

/// Whose `source` an event has: a `SourceInfo`, or the lane's transaction number ``generation``.
pub enum SourceArg<'a, 'py> {
    Py(&'a Bound<'py, PyAny>),
    Lane(u64, &'a Source),
}

enum SourceKey {
    Unset,
    Py(Py<PyAny>),
    Lane(u64),
}

#[pymethods]
impl Envelope {
    #[new]
    #[pyo3(signature = (rows, key_rows, connector_name, schema_table, reference_value, reference_key, debezium=false))]
    fn new(
        rows: Py<RowWriter>,
        key_rows: Option<Py<RowWriter>>,
        connector_name: Vec<u8>,
        schema_table: Vec<u8>,
        reference_value: Py<PyAny>,
        reference_key: Py<PyAny>,
        debezium: bool,
    ) -> Self {
        Envelope {
            rows,
            key_rows,
            reference_value,
            reference_key,
            connector_name,
            schema_table,
            source: SourceKey::Unset,
            head: Vec::new(),
            seq_prefix: Vec::new(),
            mid: Vec::new(),
            tail: Vec::new(),
            ts: None,
            txn: None,
            debezium,
            tx_id: None,
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
            let block = match &transaction {
                None => None,
                Some(t) => Some(transaction_block(t)?),
            };
            let block = match &block {
                None => None,
                Some((id, total, dco)) => Some((id.to_str()?, *total, *dco)),
            };
            let (lsn, ts_us) = (lsn.extract()?, ts_us.extract()?);
            self.encode(
                py,
                op,
                row(&before)?,
                row(&after)?,
                SourceArg::Py(&source),
                lsn,
                ts_us,
                block,
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

    /// The records of ``changes[start:]`` (RowChanges of this table, in order) handed to ``emit(topic, key,
    /// value, headers)``, or appended to ``emit`` as ``(topic, key, value)`` when it is a list, as
    /// `cdcd.shaping.EventShaper` makes them: the key (with ``key_header``; none when
    /// it is None), the envelope (with ``value_header``) and, after a delete, a tombstone when ``tombstones``;
    /// the transaction block counts on from ``total`` and ``dco``. Stops before a change it leaves to the
    /// Python shaper (an update that changes the key, a value the compiled code refuses); returns that
    /// change's index (``len(changes)`` when all were done) and how many c, u and d events it made.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (changes, start, source, ts_us, txn_id, total, dco, topic, key_header, value_header, key_positions, tombstones, emit))]
    fn rows<'py>(
        &mut self,
        py: Python<'py>,
        changes: &Bound<'py, PyList>,
        start: usize,
        source: Bound<'py, PyAny>,
        ts_us: Option<i64>,
        txn_id: &str,
        total: i64,
        dco: i64,
        topic: Bound<'py, PyAny>,
        key_header: Option<&[u8]>,
        value_header: &[u8],
        key_positions: Vec<usize>,
        tombstones: bool,
        emit: Bound<'py, PyAny>,
    ) -> PyResult<(usize, [usize; 3])> {
        let records = emit.cast::<PyList>().ok().cloned();
        let mut counts = [0usize; 3];
        let mut order = (total, dco);
        let mut rest = Vec::with_capacity(192);
        for index in start..changes.len() {
            let change = changes.get_item(index)?;
            let kind = change.getattr(intern!(py, "op"))?;
            let (op, code) = match kind.cast_exact::<PyString>()?.to_str()? {
                "insert" => ("c", 0u8),
                "update" => ("u", 1),
                "delete" => ("d", 2),
                _ => return Ok((index, counts)),
            };
            let old = optional_tuple(change.getattr(intern!(py, "old"))?)?;
            let new = optional_tuple(change.getattr(intern!(py, "new"))?)?;
            let old_is_key = code == 1 && change.getattr(intern!(py, "old_is_key"))?.is_truthy()?;
            let Some((key, images, toast)) =
                self.parts(py, code, old.as_ref(), new.as_ref(), old_is_key, &key_positions)?
            else {
                return Ok((index, counts)); // a key change or a value refused: left to the shaper
            };
            let lsn: i64 = change.getattr(intern!(py, "wal_lsn"))?.extract()?;
            let block = Some((txn_id, order.0 + 1, order.1 + 1));
            rest.clear();
            if self
                .write_rest(
                    py,
                    &mut rest,
                    op,
                    SourceArg::Py(&source),
                    Some(lsn),
                    ts_us,
                    block,
                    &toast,
                )
                .is_err()
            {
                return Ok((index, counts));
            }
            order = (order.0 + 1, order.1 + 1);
            counts[usize::from(code)] += 1;
            let (key, value) = record(py, key_header, key.as_deref(), value_header, &images, &rest)?;
            let tombstone = tombstone(code == 2, tombstones, key.is_some());
            match &records {
                Some(list) => {
                    list.append((&topic, &key, value))?;
                    if tombstone {
                        list.append((&topic, &key, py.None()))?;
                    }
                }
                None => {
                    emit.call1((&topic, &key, value, py.None()))?;
                    if tombstone {
                        emit.call1((&topic, &key, py.None(), py.None()))?;
                    }
                }
            }
        }
        Ok((changes.len(), counts))
    }

    /// Snapshot rows ``rows[start:stop]`` as ``r`` events handed to ``emit(topic, key, value, None)`` as
    /// `cdcd.shaping.EventShaper.snapshot` makes them (all with ``source``); stops before a row whose values
    /// the compiled code refuses and returns its index (``stop`` when all were done).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (rows, start, stop, source, lsn, ts_us, topic, key_header, value_header, emit))]
    fn snapshot_rows<'py>(
        &mut self,
        py: Python<'py>,
        rows: &Bound<'py, PyAny>,
        start: usize,
        stop: usize,
        source: Bound<'py, PyAny>,
        lsn: i64,
        ts_us: Option<i64>,
        topic: Bound<'py, PyAny>,
        key_header: Option<&[u8]>,
        value_header: &[u8],
        emit: Bound<'py, PyAny>,
    ) -> PyResult<usize> {
        for index in start..stop {
            let row = rows.get_item(index)?.cast_into_exact::<PyTuple>()?;
            let key = match key_header {
                Some(header) => match self.key_bytes(py, header, &row) {
                    Some(key) => Some(PyBytes::new(py, &key)),
                    None => return Ok(index),
                },
                None => None,
            };
            let Ok(value) = self.encode(py, "r", None, Some(row), SourceArg::Py(&source), Some(lsn), ts_us, None)
            else {
                return Ok(index);
            };
            let mut framed = Vec::with_capacity(value_header.len() + value.as_bytes().len());
            framed.extend_from_slice(value_header);
            framed.extend_from_slice(value.as_bytes());
            emit.call1((&topic, key, PyBytes::new(py, &framed), py.None()))?;
        }
        Ok(stop)
    }

    /// The part of a snapshot row's envelope after its ``before`` and ``after`` fields (``op`` r, ``source``,
    /// ``lsn``, ``ts_us``, no transaction, no unchanged TOAST), as `encode` writes it: what `copy_records`
    /// appends to each row of a batch.
    fn snapshot_rest<'py>(
        &mut self,
        py: Python<'py>,
        source: Bound<'py, PyAny>,
        lsn: i64,
        ts_us: Option<i64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut rest = Vec::with_capacity(128);
        self.write_rest(py, &mut rest, "r", SourceArg::Py(&source), Some(lsn), ts_us, None, &[])?;
        Ok(PyBytes::new(py, &rest))
    }

    /// Encode a RowChange of this table as it arrives, appended to ``into`` with ``payload`` (its pgoutput
    /// message): its key, before and after, and unchanged TOAST names, which do not depend on its transaction.
    /// Returns the bytes appended; 0 for a change left to the shaper (`rows` leaves it too): an update that
    /// changes the key, a value the compiled code refuses.
    fn prepare(
        &self,
        py: Python<'_>,
        change: &Bound<'_, PyAny>,
        payload: &Bound<'_, PyBytes>,
        key_positions: Vec<usize>,
        mut into: PyRefMut<'_, Encoded>,
    ) -> PyResult<usize> {
        let op = match change.getattr(intern!(py, "op"))?.cast_exact::<PyString>()?.to_str()? {
            "insert" => 0,
            "update" => 1,
            "delete" => 2,
            _ => return Ok(0),
        };
        let old = optional_tuple(change.getattr(intern!(py, "old"))?)?;
        let new = optional_tuple(change.getattr(intern!(py, "new"))?)?;
        let old_is_key = change.getattr(intern!(py, "old_is_key"))?.is_truthy()?;
        let Some((key, images, toast)) = self.parts(py, op, old.as_ref(), new.as_ref(), old_is_key, &key_positions)?
        else {
            return Ok(0);
        };
        let lsn: i64 = change.getattr(intern!(py, "wal_lsn"))?.extract()?;
        let in_stream = !change.getattr(intern!(py, "xid"))?.is_none();
        let before = into.nbytes();
        into.push(op, in_stream, lsn, key.as_deref(), &images, &toast, payload.as_bytes())?;
        Ok(into.nbytes() - before)
    }

    /// What `prepare` does, straight from walsender frames: the Insert, Update and Delete messages of
    /// ``frames[start:]`` encoded into ``into`` as the decoder and `prepare` would, up to the first frame it
    /// leaves to them: another message, another table (``relation_id``, ``width`` columns), another
    /// subtransaction than ``xid`` (None: not in a streamed block), a change `prepare` refuses, malformed
    /// bytes; or once it took ``max_rows`` changes or ``max_bytes`` bytes. Returns the index of that frame,
    /// how many changes it took and the highest WAL position their frames reported.
    #[allow(clippy::too_many_arguments)]
    fn prepare_frames(
        &self,
        py: Python<'_>,
        frames: &Bound<'_, PyList>,
        start: usize,
        relation_id: u32,
        width: usize,
        xid: Option<u32>,
        key_positions: Vec<usize>,
        max_rows: usize,
        max_bytes: usize,
        mut into: PyRefMut<'_, Encoded>,
    ) -> PyResult<(usize, usize, u64)> {
        let (mut index, mut taken, mut received) = (start, 0, 0u64);
        let first_byte = into.nbytes();
        while index < frames.len() && taken < max_rows && into.nbytes() - first_byte < max_bytes {
            let frame = frames.get_item(index)?;
            let Ok(frame) = frame.cast::<PyBytes>() else { break };
            let Some((payload, data_start, seen)) = xlogdata(frame.as_bytes()) else {
                break;
            };
            let Some((op, pos)) = change_head(payload, relation_id, xid) else {
                break;
            };
            let Some((old, new, old_is_key)) = change_parts(py, payload, pos, width) else {
                break;
            };
            let Some((key, images, toast)) =
                self.parts(py, op, old.as_ref(), new.as_ref(), old_is_key, &key_positions)?
            else {
                break;
            };
            let Some(lsn) = signed(data_start) else { break };
            into.push(op, xid.is_some(), lsn, key.as_deref(), &images, &toast, payload)?;
            received = received.max(seen);
            taken += 1;
            index += 1;
        }
        Ok((index, taken, received))
    }

    /// The records of ``encoded`` (changes this envelope prepared) appended to ``out`` as ``(topic, key,
    /// value)``, exactly as `rows` makes them from the changes; returns how many c, u and d events it made.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (encoded, source, ts_us, txn_id, total, dco, topic, key_header, value_header, tombstones, out))]
    fn splice<'py>(
        &mut self,
        py: Python<'py>,
        encoded: PyRef<'py, Encoded>,
        source: Bound<'py, PyAny>,
        ts_us: Option<i64>,
        txn_id: &str,
        total: i64,
        dco: i64,
        topic: Bound<'py, PyAny>,
        key_header: Option<&[u8]>,
        value_header: &[u8],
        tombstones: bool,
        out: &Bound<'py, PyList>,
    ) -> PyResult<[usize; 3]> {
        let mut counts = [0usize; 3];
        let mut order = (total, dco);
        let mut rest = Vec::with_capacity(192); // the envelope after before/after, made again per record
        for rec in encoded.records()? {
            let op = ["c", "u", "d"][usize::from(rec.op)];
            order = (order.0 + 1, order.1 + 1);
            rest.clear();
            let block = Some((txn_id, order.0, order.1));
            let source = SourceArg::Py(&source);
            self.write_rest(py, &mut rest, op, source, Some(rec.lsn), ts_us, block, rec.toast)?;
            counts[usize::from(rec.op)] += 1;
            let (key, value) = record(py, key_header, rec.key, value_header, rec.images, &rest)?;
            let tombstone = tombstone(rec.op == 2, tombstones, key.is_some());
            out.append((&topic, &key, value))?;
            if tombstone {
                out.append((&topic, &key, py.None()))?;
            }
        }
        Ok(counts)
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
    /// ``header`` and the Key record of ``row``, or None when the compiled code refuses it.
    pub(crate) fn key_bytes(&self, py: Python<'_>, header: &[u8], row: &Bound<'_, PyTuple>) -> Option<Vec<u8>> {
        let mut out = header.to_vec();
        self.key_rows
            .as_ref()?
            .get()
            .write(py, row, &mut out, &mut |_| Ok(()))
            .ok()?;
        Some(out)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn encode<'py>(
        &mut self,
        py: Python<'py>,
        op: &str,
        before: Option<Bound<'py, PyTuple>>,
        after: Option<Bound<'py, PyTuple>>,
        source: SourceArg<'_, 'py>,
        lsn: Option<i64>,
        ts_us: Option<i64>,
        transaction: Option<(&str, i64, i64)>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = Vec::with_capacity(256);
        let mut toast = Vec::new();
        self.write_images(py, before.as_ref(), after.as_ref(), &mut out, &mut toast)?;
        self.write_rest(py, &mut out, op, source, lsn, ts_us, transaction, &toast)?;
        Ok(PyBytes::new(py, &out))
    }

    /// The envelope's ``before`` and ``after`` fields; ``toast`` gets the ``unchanged_toast`` array's items
    /// (count and names, empty when there are none).
    pub(crate) fn write_images(
        &self,
        py: Python<'_>,
        before: Option<&Bound<'_, PyTuple>>,
        after: Option<&Bound<'_, PyTuple>>,
        out: &mut Vec<u8>,
        toast: &mut Vec<u8>,
    ) -> PyResult<()> {
        let rows = self.rows.get();
        match before {
            None => out.push(0),
            Some(row) => {
                out.push(2);
                rows.write(py, row, out, &mut |_| {
                    Err(PyValueError::new_err("unchanged TOAST value in before"))
                })?;
            }
        }
        let mut names = Vec::new();
        let mut count = 0i64;
        match after {
            None => out.push(0),
            Some(row) => {
                out.push(2);
                rows.write(py, row, out, &mut |name| {
                    names.extend_from_slice(name.as_bytes());
                    count += 1;
                    Ok(())
                })?;
            }
        }
        if count > 0 {
            avro::long(toast, count);
            toast.extend_from_slice(&names);
        }
        Ok(())
    }

    /// Everything of the envelope after ``before`` and ``after``: source, op, ts, transaction and the
    /// ``unchanged_toast`` items ``toast`` (as `write_images` made them).
    #[allow(clippy::too_many_arguments)]
    fn write_rest<'py>(
        &mut self,
        py: Python<'py>,
        out: &mut Vec<u8>,
        op: &str,
        source: SourceArg<'_, 'py>,
        lsn: Option<i64>,
        ts_us: Option<i64>,
        transaction: Option<(&str, i64, i64)>,
        toast: &[u8],
    ) -> PyResult<()> {
        let tx_id = match source {
            SourceArg::Py(s) => {
                if !matches!(&self.source, SourceKey::Py(cached) if cached.bind(py).is(s)) {
                    self.set_source(&Source::of(s)?)?;
                    self.source = SourceKey::Py(s.clone().unbind());
                }
                self.tx_id
            }
            SourceArg::Lane(generation, s) => {
                if !matches!(self.source, SourceKey::Lane(cached) if cached == generation) {
                    self.set_source(s)?;
                    self.source = SourceKey::Lane(generation);
                }
                self.tx_id
            }
        };
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
                avro::bytes(out, &seq);
                out.extend_from_slice(&self.mid);
                out.push(2);
                avro::long(out, lsn);
            }
        }
        out.extend_from_slice(&self.tail);
        if !matches!(op, "c" | "u" | "d" | "r" | "t") {
            return Err(PyValueError::new_err("unknown envelope op"));
        }
        if self.debezium {
            debezium_block(out, transaction, tx_id, lsn);
            avro::bytes(out, op.as_bytes());
            match ts_us {
                None => out.extend_from_slice(&[0, 0, 0]),
                Some(ts) => {
                    let ns = ts
                        .checked_mul(1000)
                        .ok_or_else(|| PyValueError::new_err("ts_ns out of range"))?;
                    for x in [ts.div_euclid(1000), ts, ns] {
                        out.push(2);
                        avro::long(out, x);
                    }
                }
            }
        } else {
            avro::bytes(out, op.as_bytes());
            self.write_ts(out, ts_us);
            match transaction {
                None => out.push(0),
                Some((id, total, dco)) => {
                    self.write_transaction_id(out, id);
                    avro::long(out, total);
                    avro::long(out, dco);
                }
            }
        }
        out.extend_from_slice(toast);
        out.push(0);
        Ok(())
    }

    fn write_ts(&mut self, out: &mut Vec<u8>, ts_us: Option<i64>) {
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
    }

    /// A change's key record, before and after fields and ``unchanged_toast`` items, or None when it is left to
    /// the shaper: an update that changes the key, a value the compiled code refuses.
    #[allow(clippy::type_complexity)]
    fn parts(
        &self,
        py: Python<'_>,
        op: u8,
        old: Option<&Bound<'_, PyTuple>>,
        new: Option<&Bound<'_, PyTuple>>,
        old_is_key: bool,
        key_positions: &[usize],
    ) -> PyResult<Option<(Option<Vec<u8>>, Vec<u8>, Vec<u8>)>> {
        let has_key = self.key_rows.is_some();
        if key_changed(op == 1, has_key, old, new, old_is_key, key_positions)? {
            return Ok(None);
        }
        let key = match (has_key, new.or(old)) {
            (true, Some(row)) => match self.key_bytes(py, &[], row) {
                Some(key) => Some(key),
                None => return Ok(None),
            },
            _ => None,
        };
        let (mut images, mut toast) = (Vec::with_capacity(128), Vec::new());
        if self.write_images(py, old, new, &mut images, &mut toast).is_err() {
            return Ok(None);
        }
        Ok(Some((key, images, toast)))
    }

    fn set_source(&mut self, s: &Source) -> PyResult<()> {
        let mut head = Vec::with_capacity(64);
        avro::bytes(&mut head, s.version.as_bytes());
        head.extend_from_slice(&self.connector_name);
        avro::long(&mut head, s.ts_us.div_euclid(1000));
        if self.debezium {
            head.push(0); // the snapshot union's string branch
        } else {
            avro::long(&mut head, s.ts_us);
        }
        avro::bytes(&mut head, s.snapshot.as_bytes());
        avro::bytes(&mut head, s.db.as_bytes());
        let seq_prefix = match s.last_commit_lsn {
            None => b"[null,".to_vec(),
            Some(last) => format!("[\"{last}\",").into_bytes(),
        };
        let mut mid = Vec::with_capacity(self.schema_table.len() + 24);
        if self.debezium {
            let ns = s
                .ts_us
                .checked_mul(1000)
                .ok_or_else(|| PyValueError::new_err("ts_ns out of range"))?;
            nullable_long(&mut mid, Some(s.ts_us));
            nullable_long(&mut mid, Some(ns));
        }
        mid.extend_from_slice(&self.schema_table);
        nullable_long(&mut mid, s.tx_id);
        let mut tail = Vec::new();
        if self.debezium {
            tail.push(0); // xmin
            nullable_string(&mut tail, s.origin.as_deref());
            tail.push(0); // origin_lsn
            nullable_long(&mut tail, s.commit_lsn);
        } else {
            nullable_long(&mut tail, s.commit_lsn);
            nullable_string(&mut tail, s.origin.as_deref());
        }
        (self.head, self.seq_prefix, self.mid, self.tail) = (head, seq_prefix, mid, tail);
        self.tx_id = s.tx_id;
        Ok(())
    }

    fn write_transaction_id(&mut self, out: &mut Vec<u8>, id: &str) {
        if self.txn.as_ref().is_none_or(|(cached, _)| cached != id) {
            let mut b = vec![2];
            avro::bytes(&mut b, id.as_bytes());
            self.txn = Some((id.to_owned(), b));
        }
        out.extend_from_slice(self.txn.as_ref().map_or(&[][..], |(_, b)| b));
    }
}

/// A record's key and value bytes: ``key_header`` and the Key record (None for a table without a key), and
/// ``value_header`` with the envelope's parts. Each bytes object is written in place: one allocation each.
#[allow(clippy::type_complexity)]
fn record<'py>(
    py: Python<'py>,
    key_header: Option<&[u8]>,
    key: Option<&[u8]>,
    value_header: &[u8],
    images: &[u8],
    rest: &[u8],
) -> PyResult<(Option<Bound<'py, PyBytes>>, Bound<'py, PyBytes>)> {
    let key = match (key_header, key) {
        (Some(header), Some(k)) => Some(joined(py, &[header, k])?),
        _ => None,
    };
    Ok((key, joined(py, &[value_header, images, rest])?))
}

/// A bytes object of ``parts`` one after the other.
pub(crate) fn joined<'py>(py: Python<'py>, parts: &[&[u8]]) -> PyResult<Bound<'py, PyBytes>> {
    let length = parts.iter().map(|p| p.len()).sum();
    PyBytes::new_with(py, length, |buf| {
        let mut at = 0;
        for part in parts {
            buf[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        Ok(())
    })
}

/// An Insert, Update or Delete of relation ``relation_id`` by ``xid`` (None: outside a streamed block, no
/// xid in the message): its op (0 c, 1 u, 2 d) and where its tuples start.
fn change_head(payload: &[u8], relation_id: u32, xid: Option<u32>) -> Option<(u8, usize)> {
    let op = match payload.first()? {
        b'I' => 0,
        b'U' => 1,
        b'D' => 2,
        _ => return None,
    };
    let pos = match xid {
        Some(x) => (u32_at(payload, 1)? == x).then_some(5)?,
        None => 1,
    };
    (u32_at(payload, pos)? == relation_id).then_some((op, pos + 4))
}

/// A `TxInfo`'s fields: id, total order, data collection order.
fn transaction_block<'py>(t: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyString>, i64, i64)> {
    let id = t.getattr("id")?.cast_exact::<PyString>()?.clone();
    Ok((
        id,
        t.getattr("total_order")?.extract()?,
        t.getattr("data_collection_order")?.extract()?,
    ))
}

fn optional_tuple(value: Bound<'_, PyAny>) -> PyResult<Option<Bound<'_, PyTuple>>> {
    Ok(if value.is_none() {
        None
    } else {
        Some(value.cast_into_exact::<PyTuple>()?)
    })
}

/// Key and value of a BEGIN or END event on the transaction topic, in cdcd's or Debezium's layout
/// (`cdcd.avro.metadata.encode_transaction_fields`).
#[pyfunction]
#[pyo3(signature = (status, txn_id, ts_ms, event_count, data_collections, debezium, /))]
pub fn transaction_event<'py>(
    py: Python<'py>,
    status: &str,
    txn_id: &str,
    ts_ms: i64,
    event_count: Option<i64>,
    data_collections: Option<Vec<(String, i64)>>,
    debezium: bool,
) -> (Bound<'py, PyBytes>, Bound<'py, PyBytes>) {
    let (key, value) = transaction_fields(
        status,
        txn_id,
        ts_ms,
        event_count,
        data_collections.as_deref(),
        debezium,
    );
    (PyBytes::new(py, &key), PyBytes::new(py, &value))
}

/// Key and value of a BEGIN or END event, in Debezium's layout when ``debezium`` (its collection records are
/// nullable).
pub(crate) fn transaction_fields(
    status: &str,
    txn_id: &str,
    ts_ms: i64,
    event_count: Option<i64>,
    data_collections: Option<&[(String, i64)]>,
    debezium: bool,
) -> (Vec<u8>, Vec<u8>) {
    let mut key = Vec::with_capacity(txn_id.len() + 2);
    avro::bytes(&mut key, txn_id.as_bytes());
    let mut value = Vec::with_capacity(64);
    avro::bytes(&mut value, status.as_bytes());
    value.extend_from_slice(&key);
    nullable_long(&mut value, event_count);
    match data_collections {
        None => value.push(0),
        Some(items) => {
            value.push(2);
            if !items.is_empty() {
                avro::long(&mut value, items.len() as i64);
                for (name, count) in items {
                    if debezium {
                        value.push(2);
                    }
                    avro::bytes(&mut value, name.as_bytes());
                    avro::long(&mut value, *count);
                }
            }
            value.push(0);
        }
    }
    avro::long(&mut value, ts_ms);
    (key, value)
}

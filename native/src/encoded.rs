//! Changes encoded as they arrive (`cdcd.batches.EncodedRun`): each change of a run of one table's changes
//! kept as the parts of its envelope that do not depend on its transaction (key, before and after, the
//! unchanged TOAST names), with its pgoutput message for whoever needs its values again. What depends on the
//! transaction (source, order, the schema ids) is spliced in at commit (`Envelope.splice`).
//!
//! A record: op (0 c, 1 u, 2 d), whether the message came in a streamed block (it then holds an xid), the
//! change's LSN (i64), then four length-prefixed parts (u32; `u32::MAX` for a missing key): the Key record,
//! the before and after fields, the ``unchanged_toast`` items, the message. Little-endian, in memory and in
//! spill files alike (a spill file is read back by the process that wrote it).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

const NO_KEY: u32 = u32::MAX;

/// `Encoded(data=b"", count=0)`: a run's records; from a spill file, ``data`` holds ``count`` of them.
#[pyclass(module = "cdcd._native")]
pub struct Encoded {
    data: Vec<u8>,
    count: usize,
}

/// One record's fields, borrowed from the run's bytes.
pub struct Record<'a> {
    pub op: u8,
    pub in_stream: bool,
    pub lsn: i64,
    pub key: Option<&'a [u8]>,
    pub images: &'a [u8],
    pub toast: &'a [u8],
    pub payload: &'a [u8],
}

/// A length-prefixed part at ``pos`` (moved past it): Some(None) for the missing key's length.
fn part<'a>(data: &'a [u8], pos: &mut usize) -> Option<Option<&'a [u8]>> {
    let length = u32::from_le_bytes(data.get(*pos..*pos + 4)?.try_into().ok()?);
    *pos += 4;
    if length == NO_KEY {
        return Some(None);
    }
    let end = pos.checked_add(length as usize)?;
    let slice = data.get(*pos..end)?;
    *pos = end;
    Some(Some(slice))
}

/// The record at ``pos`` and the offset after it; None when the bytes are not a whole record.
fn record(data: &[u8], mut pos: usize) -> Option<(Record<'_>, usize)> {
    let op = *data.get(pos)?;
    let in_stream = *data.get(pos + 1)? != 0;
    let lsn = i64::from_le_bytes(data.get(pos + 2..pos + 10)?.try_into().ok()?);
    pos += 10;
    let key = part(data, &mut pos)?;
    let images = part(data, &mut pos)??;
    let toast = part(data, &mut pos)??;
    let payload = part(data, &mut pos)??;
    let rec = Record {
        op,
        in_stream,
        lsn,
        key,
        images,
        toast,
        payload,
    };
    (op <= 2).then_some((rec, pos))
}

fn corrupt() -> PyErr {
    PyValueError::new_err("encoded changes are corrupt (a spill file damaged?)")
}

impl Encoded {
    /// Every record in order; an error when the bytes are not ``count`` whole records.
    pub fn records(&self) -> PyResult<Vec<Record<'_>>> {
        let mut out = Vec::with_capacity(self.count);
        let mut pos = 0;
        while pos < self.data.len() {
            let (rec, next) = record(&self.data, pos).ok_or_else(corrupt)?;
            out.push(rec);
            pos = next;
        }
        if out.len() != self.count {
            return Err(corrupt());
        }
        Ok(out)
    }

    /// Append one record.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        op: u8,
        in_stream: bool,
        lsn: i64,
        key: Option<&[u8]>,
        images: &[u8],
        toast: &[u8],
        payload: &[u8],
    ) -> PyResult<()> {
        let too_long = || PyValueError::new_err("an encoded change part over 4 GiB");
        let length = |d: &mut Vec<u8>, b: &[u8]| -> PyResult<()> {
            let n = u32::try_from(b.len())
                .ok()
                .filter(|n| *n != NO_KEY)
                .ok_or_else(too_long)?;
            d.extend_from_slice(&n.to_le_bytes());
            d.extend_from_slice(b);
            Ok(())
        };
        let d = &mut self.data;
        d.push(op);
        d.push(u8::from(in_stream));
        d.extend_from_slice(&lsn.to_le_bytes());
        match key {
            Some(k) => length(d, k)?,
            None => d.extend_from_slice(&NO_KEY.to_le_bytes()),
        }
        length(d, images)?;
        length(d, toast)?;
        length(d, payload)?;
        self.count += 1;
        Ok(())
    }
}

#[pymethods]
impl Encoded {
    #[new]
    #[pyo3(signature = (data=None, count=0))]
    fn new(data: Option<&[u8]>, count: usize) -> PyResult<Self> {
        let run = Encoded {
            data: data.unwrap_or_default().to_vec(),
            count,
        };
        run.records()?;
        Ok(run)
    }

    fn __len__(&self) -> usize {
        self.count
    }

    /// Bytes held.
    #[getter]
    pub fn nbytes(&self) -> usize {
        self.data.len()
    }

    /// The records' bytes (for a spill file; ``Encoded(data, len)`` takes them back).
    fn data<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.data)
    }

    /// Give back the spare capacity of a run that is done growing.
    fn shrink(&mut self) {
        self.data.shrink_to_fit();
    }

    /// Keep the first ``keep`` records; returns how many bytes were dropped.
    fn truncate(&mut self, keep: usize) -> PyResult<usize> {
        if keep >= self.count {
            return Ok(0);
        }
        let mut pos = 0;
        for _ in 0..keep {
            pos = record(&self.data, pos).ok_or_else(corrupt)?.1;
        }
        let dropped = self.data.len() - pos;
        self.data.truncate(pos);
        self.count = keep;
        Ok(dropped)
    }

    /// The first record's LSN (None: no records).
    fn first_lsn(&self) -> PyResult<Option<i64>> {
        if self.data.is_empty() {
            return Ok(None);
        }
        Ok(Some(record(&self.data, 0).ok_or_else(corrupt)?.0.lsn))
    }

    /// Each record's pgoutput message, LSN and whether it came in a streamed block: to decode it again.
    fn messages<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for rec in self.records()? {
            out.append((PyBytes::new(py, rec.payload), rec.lsn, rec.in_stream))?;
        }
        Ok(out)
    }
}

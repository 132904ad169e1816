//! A line of `COPY ... TO STDOUT` text format to a row of pgoutput text values (`cdcd.snapshot.copy`).

use std::borrow::Cow;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use crate::row::RowWriter;

/// The row of one COPY text line (its newline included, as COPY sends it), or `None` when the line is not
/// plainly what COPY writes (wrong width, not UTF-8, an escape other than COPY's own, a trailing backslash):
/// `cdcd.snapshot.copy.parse_line` then decides.
#[pyfunction]
pub fn copy_row<'py>(py: Python<'py>, data: &[u8], width: usize) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let line = &data[..data.len().saturating_sub(1)];
    if std::str::from_utf8(line).is_err() {
        return Ok(None);
    }
    let mut values: Vec<Bound<'py, PyAny>> = Vec::with_capacity(width);
    for field in line.split(|&c| c == b'\t') {
        if values.len() == width {
            return Ok(None);
        }
        let value = if field == b"\\N" {
            py.None().into_bound(py)
        } else if !field.contains(&b'\\') {
            // UTF-8 checked above, and a tab never falls inside a UTF-8 sequence
            PyString::new(py, std::str::from_utf8(field).unwrap_or_default()).into_any()
        } else {
            match unescape(field).and_then(|v| String::from_utf8(v).ok()) {
                Some(text) => PyString::new(py, &text).into_any(),
                None => return Ok(None),
            }
        };
        values.push(value);
    }
    if values.len() != width {
        return Ok(None);
    }
    Ok(Some(PyTuple::new(py, values)?))
}

/// The rows of COPY text lines, joined as COPY sends them (each ending in its newline), in a list: parsed with
/// the GIL released (other threads run meanwhile), then made into tuples. A line `copy_row` would leave is in
/// the list as its bytes (newline included), its index in the second list: `cdcd.snapshot.copy.parse_line`
/// then decides.
#[pyfunction]
pub fn copy_rows<'py>(py: Python<'py>, data: &[u8], width: usize) -> PyResult<(Bound<'py, PyList>, Vec<usize>)> {
    let parsed: Vec<(&[u8], Option<Fields<'_>>)> = py.detach(|| {
        data.split_inclusive(|&c| c == b'\n')
            .map(|line| (line, line.strip_suffix(b"\n").and_then(|text| fields(text, width))))
            .collect()
    });
    let mut left = Vec::new();
    let mut rows: Vec<Bound<'py, PyAny>> = Vec::with_capacity(parsed.len());
    for (index, (line, values)) in parsed.into_iter().enumerate() {
        let Some(values) = values else {
            left.push(index);
            rows.push(PyBytes::new(py, line).into_any());
            continue;
        };
        let items = values.into_iter().map(|value| match value {
            Some(text) => PyString::new(py, &text).into_any(),
            None => py.None().into_bound(py),
        });
        rows.push(PyTuple::new(py, items)?.into_any());
    }
    Ok((PyList::new(py, rows)?, left))
}

/// A snapshot's records of COPY text lines (joined as COPY sends them) in one call, with the GIL released while
/// the lines are parsed and encoded: for each line ``(topic, key, value)`` as `cdcd.shaping.EventShaper.snapshot`
/// makes it (``key_header`` and the Key record of ``key_rows``, none when it is None; ``value_header``, a null
/// ``before``, the row as ``after`` and ``rest``, the envelope after them: `Envelope.snapshot_rest`). A line it
/// leaves (not plainly what COPY writes, or a value the row writers refuse) is None in the list, its index and
/// bytes (newline included) in the second: the specification then reads and encodes it, or raises its error.
#[pyfunction]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
#[pyo3(signature = (data, width, rows, key_rows, key_header, value_header, rest, topic))]
pub fn copy_records<'py>(
    py: Python<'py>,
    data: &[u8],
    width: usize,
    rows: &Bound<'py, RowWriter>,
    key_rows: Option<&Bound<'py, RowWriter>>,
    key_header: Option<&[u8]>,
    value_header: &[u8],
    rest: &[u8],
    topic: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyList>, Vec<(usize, Bound<'py, PyBytes>)>)> {
    let (value_rows, key_rows) = (rows.get(), key_rows.map(|k| k.get()));
    let keyed = key_rows.zip(key_header);
    let encoded: Vec<(&[u8], Option<(Option<Vec<u8>>, Vec<u8>)>)> = py.detach(|| {
        data.split_inclusive(|&c| c == b'\n')
            .map(|line| {
                let values = line.strip_suffix(b"\n").and_then(|text| fields(text, width));
                (
                    line,
                    values.and_then(|values| encode(&values, value_rows, keyed, value_header, rest)),
                )
            })
            .collect()
    });
    let mut left = Vec::new();
    let mut records: Vec<Bound<'py, PyAny>> = Vec::with_capacity(encoded.len());
    for (index, (line, record)) in encoded.into_iter().enumerate() {
        let Some((key, value)) = record else {
            left.push((index, PyBytes::new(py, line)));
            records.push(py.None().into_bound(py));
            continue;
        };
        let key = match key {
            Some(key) => PyBytes::new(py, &key).into_any(),
            None => py.None().into_bound(py),
        };
        let value = PyBytes::new(py, &value).into_any();
        records.push(PyTuple::new(py, [topic.clone(), key, value])?.into_any());
    }
    Ok((PyList::new(py, records)?, left))
}

/// A row's key bytes (with their header; None without `keyed`) and value bytes, or None when a writer refuses it.
fn encode(
    values: &[Option<Cow<'_, str>>],
    rows: &RowWriter,
    keyed: Option<(&RowWriter, &[u8])>,
    value_header: &[u8],
    rest: &[u8],
) -> Option<(Option<Vec<u8>>, Vec<u8>)> {
    let key = match keyed {
        Some((key_rows, header)) => {
            let mut key = Vec::with_capacity(header.len() + 16);
            key.extend_from_slice(header);
            if !key_rows.write_text(values, &mut key) {
                return None;
            }
            Some(key)
        }
        None => None,
    };
    let mut value = Vec::with_capacity(value_header.len() + rest.len() + 128);
    value.extend_from_slice(value_header);
    value.extend_from_slice(&[0, 2]); // before: null; after: the row
    if !rows.write_text(values, &mut value) {
        return None;
    }
    value.extend_from_slice(rest);
    Some((key, value))
}

/// A line's values: None for NULL.
type Fields<'a> = Vec<Option<Cow<'a, str>>>;

/// A line's `width` values, or None when it is not plainly what COPY writes (as `copy_row`).
fn fields(line: &[u8], width: usize) -> Option<Fields<'_>> {
    let text = std::str::from_utf8(line).ok()?;
    let mut values = Vec::with_capacity(width);
    for field in text.split('\t') {
        if values.len() == width {
            return None;
        }
        values.push(if field == "\\N" {
            None
        } else if !field.contains('\\') {
            Some(Cow::Borrowed(field))
        } else {
            Some(Cow::Owned(String::from_utf8(unescape(field.as_bytes())?).ok()?))
        });
    }
    (values.len() == width).then_some(values)
}

fn unescape(field: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(field.len());
    let mut bytes = field.iter();
    while let Some(&c) = bytes.next() {
        if c != b'\\' {
            out.push(c);
            continue;
        }
        out.push(match bytes.next()? {
            b'\\' => b'\\',
            b't' => b'\t',
            b'n' => b'\n',
            b'r' => b'\r',
            b'b' => 8,
            b'f' => 12,
            b'v' => 11,
            _ => return None,
        });
    }
    Some(out)
}

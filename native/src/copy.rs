//! A line of `COPY ... TO STDOUT` text format to a row of pgoutput text values (`cdcd.snapshot.copy`).

use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

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

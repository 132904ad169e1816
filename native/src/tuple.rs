//! pgoutput TupleData to a row tuple: `str` for text values, `bytes` for binary ones, `None` for NULL,
//! `Ellipsis` for an unchanged TOAST value.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};

/// The row at `pos` and the offset after it, or `None` when the bytes are not a well-formed TupleData with
/// UTF-8 text values (the caller's reference decoder then names the problem).
#[pyfunction]
pub fn read_tuple<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyBytes>,
    pos: usize,
) -> PyResult<Option<(Bound<'py, PyTuple>, usize)>> {
    let data = buf.as_bytes();
    let mut values: Vec<Bound<'py, PyAny>> = Vec::new();
    match parse(py, data, pos, &mut values) {
        Some(end) => Ok(Some((PyTuple::new(py, values)?, end))),
        None => Ok(None),
    }
}

fn parse<'py>(py: Python<'py>, data: &[u8], pos: usize, values: &mut Vec<Bound<'py, PyAny>>) -> Option<usize> {
    let count = i16::from_be_bytes(data.get(pos..pos + 2)?.try_into().ok()?);
    let mut pos = pos + 2;
    values.reserve(usize::try_from(count).ok()?);
    for _ in 0..count {
        let kind = *data.get(pos)?;
        match kind {
            b't' | b'b' => {
                let length = i32::from_be_bytes(data.get(pos + 1..pos + 5)?.try_into().ok()?);
                let start = pos + 5;
                pos = start.checked_add(usize::try_from(length).ok()?)?;
                let value = data.get(start..pos)?;
                if kind == b't' {
                    values.push(PyString::new(py, std::str::from_utf8(value).ok()?).into_any());
                } else {
                    values.push(PyBytes::new(py, value).into_any());
                }
            }
            b'n' => {
                values.push(py.None().into_bound(py));
                pos += 1;
            }
            b'u' => {
                values.push(py.Ellipsis().into_bound(py));
                pos += 1;
            }
            _ => return None,
        }
    }
    Some(pos)
}

//! pgoutput TupleData to a row tuple: `str` for text values, `bytes` for binary ones, `None` for NULL,
//! `Ellipsis` for an unchanged TOAST value.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};
use pyo3::{intern, BoundObject};

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

pub(crate) fn parse<'py>(
    py: Python<'py>,
    data: &[u8],
    pos: usize,
    values: &mut Vec<Bound<'py, PyAny>>,
) -> Option<usize> {
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

/// An Insert, Update or Delete message decoded as `cdcd.pgoutput.decoder.Decoder` decodes it: ``row_change``
/// (the RowChange class) called with its fields, or `None` when the message is not well-formed, names an
/// unknown relation or has tuples of the wrong width (the Python decoder then raises its `DecodeError`).
#[pyfunction]
pub fn read_change<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyBytes>,
    wal_lsn: &Bound<'py, PyAny>,
    in_stream: bool,
    relations: &Bound<'py, PyDict>,
    row_change: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let data = buf.as_bytes();
    let u32_at = |at: usize| u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
    let op = match data.first() {
        Some(b'I') => intern!(py, "insert"),
        Some(b'U') => intern!(py, "update"),
        Some(b'D') => intern!(py, "delete"),
        _ => return Ok(None),
    };
    let (xid, relation_id, pos) = match (in_stream, data.len()) {
        (true, 10..) => (Some(u32_at(1)), u32_at(5), 9),
        (false, 6..) => (None, u32_at(1), 5),
        _ => return Ok(None),
    };
    let Some(relation) = relations.get_item(relation_id)? else {
        return Ok(None);
    };
    let width = relation.getattr(intern!(py, "columns"))?.len()?;
    let Some((old, new, old_is_key)) = change_parts(py, data, pos, width) else {
        return Ok(None);
    };
    let args = (op, relation, old, new, old_is_key, xid, wal_lsn, data.len());
    Ok(Some(row_change.call1(args)?.into_bound()))
}

/// An Insert's, Update's or Delete's (``data[0]``) tuples from ``pos`` (after the relation id) to the message's
/// end: (old, new, old is the key), or None when they are not well-formed or not ``width`` columns wide.
pub(crate) fn change_parts<'py>(py: Python<'py>, data: &[u8], mut pos: usize, width: usize) -> Option<Parts<'py>> {
    let row = |pos: usize| -> Option<(Bound<'py, PyTuple>, usize)> {
        let mut values = Vec::new();
        let end = parse(py, data, pos, &mut values)?;
        (values.len() == width).then(|| PyTuple::new(py, values).ok().map(|t| (t, end)))?
    };
    let kind = *data.first()?;
    let mut part = *data.get(pos)?;
    let (mut old, mut new, mut old_is_key) = (None, None, false);
    if kind != b'I' && (part == b'K' || part == b'O') {
        old_is_key = part == b'K';
        let (tuple, end) = row(pos + 1)?;
        old = Some(tuple);
        pos = end;
        if kind == b'U' {
            part = *data.get(pos)?;
        }
    }
    if kind == b'D' {
        old.as_ref()?;
    } else if part == b'N' {
        let (tuple, end) = row(pos + 1)?;
        new = Some(tuple);
        pos = end;
    } else {
        return None;
    }
    (pos == data.len()).then_some((old, new, old_is_key))
}

pub(crate) type Parts<'py> = (Option<Bound<'py, PyTuple>>, Option<Bound<'py, PyTuple>>, bool);

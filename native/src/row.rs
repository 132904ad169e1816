//! One table version's row record, compiled: the row tuple's values converted and written as Avro, in the
//! record's field order, exactly as the Python encoder generated for the same columns writes them.

use std::borrow::Cow;

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};

use crate::convert::{self, Kind};
use crate::mask::Mask;

struct Field {
    index: usize,
    kind: Kind,
    /// The reference writer of this field: value in, the field's Avro bytes out (union branch included).
    fallback: Py<PyAny>,
    /// The field's name as an Avro string, for `unchanged_toast`.
    name: Py<PyBytes>,
    /// A Value field that is not nullable (Debezium's NOT NULL columns): what a missing value writes.
    default: Option<Vec<u8>>,
    /// What an unchanged TOAST value writes instead of null (Debezium's placeholder, union branch included).
    placeholder: Option<Vec<u8>>,
    /// The column's mask rule (`cdcd.columns`): applied to a text value, written as a string.
    mask: Option<Mask>,
}

/// `RowWriter(fields, ncols, nullable, defaults=None, placeholders=None, masks=None)`: ``fields`` are (column
/// index, kind code, kind parameter, fallback, encoded field name) in record order. Calling it with (row,
/// append, toast) appends the record's bytes with ``append`` once; in a nullable (Value) record, NULL and
/// unchanged TOAST values write the null branch, and unchanged ones call ``toast`` with the field's name; in a
/// Key record they raise ValueError. ``defaults`` (by field, None or bytes): a field that is not nullable and
/// what a missing value writes there; ``placeholders`` (by field): what an unchanged TOAST value writes there;
/// ``masks`` (by field, None or `cdcd.columns.Mask.native`'s (code, n, bytes)): the field's mask rule, which
/// the fallback applies too (a value the rule cannot read, such as a binary form, goes to it).
#[pyclass(frozen, module = "cdcd._native")]
pub struct RowWriter {
    fields: Vec<Field>,
    ncols: usize,
    nullable: bool,
}

type FieldSpec = (usize, u32, u32, Py<PyAny>, Py<PyBytes>);
type MaskSpec = (u32, usize, Vec<u8>);

#[pymethods]
impl RowWriter {
    #[new]
    #[pyo3(signature = (fields, ncols, nullable, defaults=None, placeholders=None, masks=None))]
    fn new(
        fields: Vec<FieldSpec>,
        ncols: usize,
        nullable: bool,
        defaults: Option<Vec<Option<Vec<u8>>>>,
        placeholders: Option<Vec<Option<Vec<u8>>>>,
        masks: Option<Vec<Option<MaskSpec>>>,
    ) -> PyResult<Self> {
        let n = fields.len();
        let mut defaults = defaults.unwrap_or_else(|| vec![None; n]).into_iter();
        let mut placeholders = placeholders.unwrap_or_else(|| vec![None; n]).into_iter();
        let mut masks = masks.unwrap_or_else(|| vec![None; n]).into_iter();
        if defaults.len() != n || placeholders.len() != n || masks.len() != n {
            return Err(PyValueError::new_err("defaults, placeholders and masks go by field"));
        }
        let fields = fields
            .into_iter()
            .map(|(index, code, param, fallback, name)| {
                let kind = Kind::from_code(code, param)
                    .ok_or_else(|| PyValueError::new_err(format!("unknown kind code {code} ({param})")))?;
                if index >= ncols {
                    return Err(PyValueError::new_err(format!("column {index} of {ncols}")));
                }
                let mask = match masks.next().flatten() {
                    Some((code, n, data)) => Some(
                        Mask::from_spec(code, n, data)
                            .ok_or_else(|| PyValueError::new_err(format!("unknown mask code {code}")))?,
                    ),
                    None => None,
                };
                Ok(Field {
                    index,
                    kind,
                    fallback,
                    name,
                    default: defaults.next().flatten(),
                    placeholder: placeholders.next().flatten(),
                    mask,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(RowWriter {
            fields,
            ncols,
            nullable,
        })
    }

    fn __call__(
        &self,
        py: Python<'_>,
        row: &Bound<'_, PyTuple>,
        append: &Bound<'_, PyAny>,
        toast: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let mut out = Vec::with_capacity(16 * self.fields.len());
        self.write(py, row, &mut out, &mut |name| toast.call1((name,)).map(drop))?;
        append.call1((PyBytes::new(py, &out),))?;
        Ok(())
    }
}

impl RowWriter {
    /// Write a masked field's present value: the null branch for the null rule, else the rule's text of a
    /// `str` (with the union branch when `branch`); false: a value left to the fallback (not a `str`, or one
    /// without a UTF-8 form).
    fn write_masked(mask: &Mask, value: &Bound<'_, PyAny>, branch: bool, out: &mut Vec<u8>) -> bool {
        if matches!(mask, Mask::Null) {
            out.push(0);
            return true;
        }
        let Ok(s) = value.cast_exact::<PyString>() else {
            return false;
        };
        let Ok(text) = s.to_str() else {
            return false;
        };
        Self::write_masked_text(mask, text, branch, out);
        true
    }

    /// A masked value's bytes (``branch``: after the union's non-null branch when the field is nullable).
    fn write_masked_text(mask: &Mask, text: &str, branch: bool, out: &mut Vec<u8>) {
        if matches!(mask, Mask::Null) {
            out.push(0);
            return;
        }
        if branch {
            out.push(2);
        }
        mask.write(text, out);
    }

    /// The union branch a present value of ``field`` starts with: the non-null one of a nullable field, the
    /// array one of a Key's [array, string].
    fn write_branch(&self, field: &Field, out: &mut Vec<u8>) {
        if self.nullable && field.default.is_none() {
            out.push(2);
        } else if matches!(field.kind, Kind::Array(_)) {
            out.push(0);
        }
    }

    /// Append the record of a row of text values (None: NULL), as `write` does for a tuple of those `str`s,
    /// without Python (callable with the GIL released); false when it would need the fallback (a value the
    /// compiled conversion refuses, a missing key value): `out` is then to be discarded.
    pub fn write_text(&self, row: &[Option<Cow<'_, str>>], out: &mut Vec<u8>) -> bool {
        if row.len() != self.ncols {
            return false;
        }
        for field in &self.fields {
            let Some(text) = &row[field.index] else {
                match &field.default {
                    Some(default) => out.extend_from_slice(default),
                    None if self.nullable => out.push(0),
                    None => return false,
                }
                continue;
            };
            if let Some(mask) = &field.mask {
                Self::write_masked_text(mask, text, self.nullable && field.default.is_none(), out);
                continue;
            }
            self.write_branch(field, out);
            if !convert::text(field.kind, text, out) {
                return false;
            }
        }
        true
    }

    /// Append the record of ``row`` to ``out``; ``toast`` gets the encoded name of each unchanged TOAST field.
    pub fn write(
        &self,
        py: Python<'_>,
        row: &Bound<'_, PyTuple>,
        out: &mut Vec<u8>,
        toast: &mut dyn FnMut(&Bound<'_, PyBytes>) -> PyResult<()>,
    ) -> PyResult<()> {
        if row.len() != self.ncols {
            return Err(PyIndexError::new_err("row length"));
        }
        for field in &self.fields {
            let value = row.get_item(field.index)?;
            if value.is_none() || value.is(py.Ellipsis()) {
                let unchanged = !value.is_none();
                match (&field.placeholder, &field.default) {
                    (Some(placeholder), _) if unchanged => out.extend_from_slice(placeholder),
                    (_, Some(default)) => out.extend_from_slice(default),
                    _ if self.nullable => out.push(0),
                    _ => {
                        return Err(PyValueError::new_err(format!(
                            "missing key value (column {})",
                            field.index
                        )))
                    }
                }
                if unchanged {
                    toast(field.name.bind(py))?;
                }
                continue;
            }
            if let Some(mask) = &field.mask {
                if Self::write_masked(mask, &value, self.nullable && field.default.is_none(), out) {
                    continue;
                }
            }
            let mark = out.len();
            self.write_branch(field, out);
            let done = if let Ok(s) = value.cast_exact::<PyString>() {
                // a str with lone surrogates has no UTF-8 form: the reference raises for it
                s.to_str().is_ok_and(|s| convert::text(field.kind, s, out))
            } else if let Ok(b) = value.cast_exact::<PyBytes>() {
                convert::binary(field.kind, b.as_bytes(), out)
            } else {
                false
            };
            if !done {
                out.truncate(mark);
                let written = field.fallback.bind(py).call1((value,))?;
                out.extend_from_slice(written.cast_exact::<PyBytes>()?.as_bytes());
            }
        }
        Ok(())
    }
}

//! The rules of Debezium's PostgreSQL connector that decide which records a change makes (`cdcd.shaping`),
//! written once for the compiled runs (`Envelope.rows`, `Envelope.prepare`, `Envelope.prepare_frames`), the
//! splice (`Envelope.splice`) and the lane.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// Whether an update changes the key of a keyed table (`cdcd.shaping.key_changed`): PostgreSQL sent the old
/// key (``old_is_key``), or a key column differs between the old and the new row. Such a change becomes a
/// delete and a create, which the Python shaper makes.
pub fn key_changed(
    update: bool,
    has_key: bool,
    old: Option<&Bound<'_, PyTuple>>,
    new: Option<&Bound<'_, PyTuple>>,
    old_is_key: bool,
    positions: &[usize],
) -> PyResult<bool> {
    match (update, has_key, old, new) {
        (true, true, Some(old), Some(new)) => Ok(old_is_key || differ(old, new, positions)?),
        _ => Ok(false),
    }
}

/// Whether a delete is followed by a tombstone: when tombstones are on and the record has a key.
pub fn tombstone(delete: bool, tombstones: bool, has_key: bool) -> bool {
    delete && tombstones && has_key
}

/// Whether two rows differ in any of the given columns (Python's ``!=``).
fn differ(old: &Bound<'_, PyTuple>, new: &Bound<'_, PyTuple>, positions: &[usize]) -> PyResult<bool> {
    for &i in positions {
        if old.get_item(i)?.ne(new.get_item(i)?)? {
            return Ok(true);
        }
    }
    Ok(false)
}

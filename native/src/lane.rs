//! The compiled lane (`cdcd.replication.lane`): whole plain transactions from walsender frames to Kafka records
//! in one call, as the Python stages make them one frame and one record at a time (`ReplicationCore.frame`,
//! the decoder, the assembler, `EventShaper.transaction`). It takes only the plain forms: XLogData frames
//! holding Begin, Insert/Update/Delete of tables it was given, Commit. Anything else (another message, a
//! table it was not given, a key change, a value the compiled encoder refuses, an unfinished transaction,
//! malformed bytes) stops it at that transaction's Begin, with nothing of that transaction done: the Python
//! stages take it from there, and name any problem.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::envelope::{joined, transaction_fields, Envelope, Source, SourceArg};
use crate::frame::{signed, u32_at, u64_at, xlogdata, PG_EPOCH_OFFSET_US, XLOGDATA_HEADER};
use crate::rules::{key_changed, tombstone};
use crate::tuple::change_parts;

/// Tells the envelopes' source caches one lane transaction from another.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// `LaneTable(relation, envelope, topic, table, key_header, value_header, key_positions, collection=None)`:
/// what the lane needs of one table version: the decoder's Relation it was made for (the lane refuses the
/// table once the decoder holds another), its compiled `Envelope`, topic, ``schema.table`` name (for event
/// counts), wire headers, key columns, and the name END events count its events under (Debezium's data
/// collection; the topic when None).
#[pyclass(frozen, module = "cdcd._native")]
pub struct LaneTable {
    relation: Py<PyAny>,
    envelope: Py<Envelope>,
    topic: Py<PyString>,
    topic_name: String,
    table: Py<PyString>,
    key_header: Option<Vec<u8>>,
    value_header: Vec<u8>,
    key_positions: Vec<usize>,
    width: usize,
    collection: String,
}

#[pymethods]
impl LaneTable {
    #[new]
    #[pyo3(signature = (relation, envelope, topic, table, key_header, value_header, key_positions, collection=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        relation: Bound<'_, PyAny>,
        envelope: Py<Envelope>,
        topic: Bound<'_, PyString>,
        table: Py<PyString>,
        key_header: Option<Vec<u8>>,
        value_header: Vec<u8>,
        key_positions: Vec<usize>,
        collection: Option<String>,
    ) -> PyResult<Self> {
        let width = relation.getattr("columns")?.len()?;
        let collection = match collection {
            Some(name) => name,
            None => topic.to_str()?.to_owned(),
        };
        Ok(LaneTable {
            collection,
            relation: relation.unbind(),
            envelope,
            topic_name: topic.to_str()?.to_owned(),
            topic: topic.unbind(),
            table,
            key_header,
            value_header,
            key_positions,
            width,
        })
    }
}

/// One decoded change, waiting for its transaction's Commit.
struct Change<'py> {
    table: Bound<'py, LaneTable>,
    op: &'static str,
    old: Option<Bound<'py, PyTuple>>,
    new: Option<Bound<'py, PyTuple>>,
    old_is_key: bool,
    lsn: i64,
}

struct Commit {
    commit_lsn: i64,
    end_lsn: i64,
    commit_time: i64,
}

/// How a transaction went: done (the index after its Commit), left to Python, or left to Python because the
/// lane has no (current) table for a relation id, which the caller may add before calling again.
enum Outcome<'py> {
    Done(usize, Vec<Change<'py>>, Commit, u32, u64),
    Stop,
    Ask(u32),
}

type Record<'py> = (
    Bound<'py, PyAny>,
    Option<Bound<'py, PyBytes>>,
    Option<Bound<'py, PyBytes>>,
);

/// The session-wide inputs of the lane's shaping (`EventShaper`'s settings).
struct Shaping<'a, 'py> {
    transaction_topic: Option<&'a (Bound<'py, PyString>, Vec<u8>, Vec<u8>)>,
    tombstones: bool,
    now_us: i64,
    /// Debezium's layout: transactions named after their first event's LSN, BEGIN and END at the commit time,
    /// counting data collections.
    debezium: bool,
}

/// Whole plain transactions of ``frames[start:]``, up to the first one the lane leaves to Python. Returns
/// ``(stop, received, records, xids, changes, last_commit_lsn, end_lsn, commit_times, events, ask)``:
/// the index of the first frame not done; the highest WAL position the done frames reported (0: none); the
/// records ``(topic, key, value)`` in order; the transactions' xids and their number of changes; the last
/// one's commit and end LSN and every one's commit time (PostgreSQL µs, in commit order); events
/// made as ``(table, op, count)``; and the relation id the lane stopped for want of a table (or None).
/// ``tables``: relation id -> `LaneTable`, or the Relation of a table the lane leaves to Python; ``relations``: the
/// decoder's Relations; ``transaction_topic``: (topic, key header, value header) for BEGIN and END events,
/// or None; ``after``: transactions committed at or below it are left to Python; a transaction of more than
/// ``max_changes`` changes too. Once it has made ``max_records`` records it stops at the next Begin (the caller
/// produces them and calls again): what one call holds is bounded. ``debezium``: in Debezium's layout.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (frames, start, relations, tables, version, db, transaction_topic, tombstones, after, last_commit_lsn, now_us, max_changes, max_records, debezium=false))]
pub fn plain_transactions<'py>(
    py: Python<'py>,
    frames: &Bound<'py, PyList>,
    start: usize,
    relations: &Bound<'py, PyDict>,
    tables: &Bound<'py, PyDict>,
    version: &str,
    db: &str,
    transaction_topic: Option<(Bound<'py, PyString>, Vec<u8>, Vec<u8>)>,
    tombstones: bool,
    after: i64,
    mut last_commit_lsn: Option<i64>,
    now_us: i64,
    max_changes: usize,
    max_records: usize,
    debezium: bool,
) -> PyResult<Bound<'py, PyTuple>> {
    let shaping = Shaping {
        transaction_topic: transaction_topic.as_ref(),
        tombstones,
        now_us,
        debezium,
    };
    let records = PyList::empty(py);
    let xids = PyList::empty(py);
    let mut events: Vec<(Bound<'py, LaneTable>, [usize; 3])> = Vec::new();
    let commit_times = PyList::empty(py);
    let (mut received, mut changes, mut end_lsn) = (0u64, 0usize, 0i64);
    let mut index = start;
    let mut ask = None;
    while index < frames.len() && records.len() < max_records {
        let (next, txn, commit, xid, seen) = match transaction(frames, index, relations, tables, max_changes)? {
            Outcome::Done(next, txn, commit, xid, seen) => (next, txn, commit, xid, seen),
            Outcome::Stop => break,
            Outcome::Ask(relid) => {
                ask = Some(relid);
                break;
            }
        };
        if commit.commit_lsn <= after {
            break;
        }
        let source = Source {
            version: version.to_owned(),
            db: db.to_owned(),
            ts_us: commit.commit_time + PG_EPOCH_OFFSET_US,
            snapshot: "false".to_owned(),
            tx_id: Some(i64::from(xid)),
            commit_lsn: Some(commit.commit_lsn),
            last_commit_lsn,
            origin: None,
        };
        let named = match txn.first() {
            Some(first) if debezium => first.lsn,
            _ => commit.commit_lsn,
        };
        let txn_id = format!("{xid}:{named}");
        let Some(made) = shape(py, &shaping, &txn, &source, &txn_id)? else {
            break;
        };
        for record in made.records {
            records.append(record)?;
        }
        for (table, counts) in made.events {
            match events.iter_mut().find(|(t, _)| t.is(&table)) {
                Some((_, total)) => (0..3).for_each(|i| total[i] += counts[i]),
                None => events.push((table, counts)),
            }
        }
        xids.append(xid)?;
        changes += txn.len();
        received = received.max(seen);
        last_commit_lsn = Some(commit.commit_lsn);
        end_lsn = commit.end_lsn;
        commit_times.append(commit.commit_time)?;
        index = next;
    }
    let counted = PyList::empty(py);
    for (table, counts) in &events {
        for (op, count) in ["c", "u", "d"].iter().zip(counts) {
            if *count > 0 {
                counted.append((table.get().table.bind(py), *op, *count))?;
            }
        }
    }
    let result = (
        index,
        received,
        records,
        xids,
        changes,
        last_commit_lsn,
        end_lsn,
        commit_times,
        counted,
        ask,
    );
    result.into_pyobject(py)
}

fn frame_at<'py>(frames: &Bound<'py, PyList>, index: usize) -> PyResult<Option<Bound<'py, PyBytes>>> {
    Ok(frames.get_item(index)?.cast_into::<PyBytes>().ok())
}

/// Decode the transaction whose Begin is ``frames[index]``.
fn transaction<'py>(
    frames: &Bound<'py, PyList>,
    index: usize,
    relations: &Bound<'py, PyDict>,
    tables: &Bound<'py, PyDict>,
    max_changes: usize,
) -> PyResult<Outcome<'py>> {
    let py = frames.py();
    let Some(frame) = frame_at(frames, index)? else {
        return Ok(Outcome::Stop);
    };
    let Some((begin, _, mut seen)) = xlogdata(frame.as_bytes()) else {
        return Ok(Outcome::Stop);
    };
    if begin.len() != 21 || begin[0] != b'B' {
        return Ok(Outcome::Stop);
    }
    let (Some(final_lsn), Some(xid)) = (u64_at(begin, 1), u32_at(begin, 17)) else {
        return Ok(Outcome::Stop);
    };
    // Where its Commit is, if it is in this batch after plain changes only (before anything is decoded).
    let mut commit_at = None;
    for at in index + 1..frames.len().min(index + max_changes + 2) {
        let Some(frame) = frame_at(frames, at)? else {
            return Ok(Outcome::Stop);
        };
        match frame.as_bytes().get(XLOGDATA_HEADER) {
            Some(b'C') => {
                commit_at = Some(at);
                break;
            }
            Some(b'I' | b'U' | b'D') => {}
            _ => return Ok(Outcome::Stop),
        }
    }
    let Some(commit_at) = commit_at else {
        return Ok(Outcome::Stop);
    };
    let mut changes = Vec::with_capacity(commit_at - index - 1);
    for at in index + 1..=commit_at {
        let Some(frame) = frame_at(frames, at)? else {
            return Ok(Outcome::Stop);
        };
        let Some((payload, data_start, reported)) = xlogdata(frame.as_bytes()) else {
            return Ok(Outcome::Stop);
        };
        seen = seen.max(reported);
        match payload[0] {
            b'C' if payload.len() == 26 => {
                let (Some(commit_lsn), Some(end_lsn), Some(time)) =
                    (u64_at(payload, 2), u64_at(payload, 10), u64_at(payload, 18))
                else {
                    return Ok(Outcome::Stop);
                };
                if commit_lsn != final_lsn {
                    return Ok(Outcome::Stop); // the assembler names the mismatch
                }
                let (Some(commit_lsn), Some(end_lsn)) = (signed(commit_lsn), signed(end_lsn)) else {
                    return Ok(Outcome::Stop);
                };
                let commit = Commit {
                    commit_lsn,
                    end_lsn,
                    commit_time: time as i64, // a PostgreSQL timestamp: signed on the wire
                };
                return Ok(Outcome::Done(at + 1, changes, commit, xid, seen));
            }
            b'I' | b'U' | b'D' => {
                let relid = u32_at(payload, 1).unwrap_or(0);
                let Some(table) = tables.get_item(relid)? else {
                    return Ok(Outcome::Ask(relid));
                };
                let Some(current) = relations.get_item(relid)? else {
                    return Ok(Outcome::Stop); // the decoder names the unknown relation
                };
                // A LaneTable, or the Relation whose table the lane leaves to Python; either holds for the
                // table version it was made for: another one is asked about again.
                let table = match table.cast::<LaneTable>() {
                    Ok(made) if current.is(made.get().relation.bind(py)) => made.clone(),
                    Err(_) if current.is(&table) => return Ok(Outcome::Stop),
                    _ => return Ok(Outcome::Ask(relid)),
                };
                let Some(lsn) = signed(data_start) else {
                    return Ok(Outcome::Stop);
                };
                match change(py, payload, table, lsn) {
                    Some(change) => changes.push(change),
                    None => return Ok(Outcome::Stop),
                }
            }
            _ => return Ok(Outcome::Stop),
        }
    }
    Ok(Outcome::Stop) // its Commit is not in this batch
}

/// An Insert, Update or Delete outside a streamed block, as `cdcd._native.read_change` reads it.
fn change<'py>(py: Python<'py>, data: &[u8], table: Bound<'py, LaneTable>, lsn: i64) -> Option<Change<'py>> {
    let (old, new, old_is_key) = change_parts(py, data, 5, table.get().width)?;
    let op = match data[0] {
        b'I' => "c",
        b'U' => "u",
        _ => "d",
    };
    Some(Change {
        table,
        op,
        old,
        new,
        old_is_key,
        lsn,
    })
}

struct Made<'py> {
    records: Vec<Record<'py>>,
    events: Vec<(Bound<'py, LaneTable>, [usize; 3])>,
}

/// A transaction's records as `EventShaper.transaction` makes them, or None when one of its changes is left to
/// the Python shaper (a key change, a value the compiled encoder refuses): then the whole transaction is.
fn shape<'py>(
    py: Python<'py>,
    shaping: &Shaping<'_, 'py>,
    txn: &[Change<'py>],
    source: &Source,
    txn_id: &str,
) -> PyResult<Option<Made<'py>>> {
    let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
    let mut records: Vec<Record<'py>> = Vec::with_capacity(txn.len() + 2);
    let mut events: Vec<(Bound<'py, LaneTable>, [usize; 3])> = Vec::new();
    let mut per_topic: Vec<(String, i64, String)> = Vec::new();
    let mut total = 0i64;
    let ts_ms = if shaping.debezium {
        source.ts_us.div_euclid(1000)
    } else {
        shaping.now_us.div_euclid(1000)
    };
    let metadata = shaping.transaction_topic.filter(|_| !txn.is_empty());
    if let Some((topic, key_header, value_header)) = metadata {
        let (key, value) = transaction_fields("BEGIN", txn_id, ts_ms, None, None, shaping.debezium);
        records.push(framed(py, topic, key_header, &key, value_header, &value)?);
    }
    for change in txn {
        let table = change.table.get();
        let mut envelope = table.envelope.bind(py).borrow_mut();
        let (old, new) = (change.old.as_ref(), change.new.as_ref());
        let update = change.op == "u";
        if key_changed(
            update,
            table.key_header.is_some(),
            old,
            new,
            change.old_is_key,
            &table.key_positions,
        )? {
            return Ok(None); // a key change: a delete and a create, by the Python shaper
        }
        let key = match (&table.key_header, change.new.as_ref().or(change.old.as_ref())) {
            (Some(header), Some(row)) => match envelope.key_bytes(py, header, row) {
                Some(key) => Some(PyBytes::new(py, &key)),
                None => return Ok(None),
            },
            _ => None,
        };
        let dco = match per_topic.iter_mut().find(|(name, _, _)| *name == table.topic_name) {
            Some((_, count, _)) => count,
            None => {
                per_topic.push((table.topic_name.clone(), 0, table.collection.clone()));
                &mut per_topic.last_mut().expect("just pushed").1
            }
        };
        let block = Some((txn_id, total + 1, *dco + 1));
        let (old, new) = (change.old.clone(), change.new.clone());
        let lane_source = SourceArg::Lane(generation, source);
        let Ok(value) = envelope.encode(
            py,
            change.op,
            old,
            new,
            lane_source,
            Some(change.lsn),
            Some(shaping.now_us),
            block,
        ) else {
            return Ok(None);
        };
        *dco += 1;
        total += 1;
        let mut bytes = Vec::with_capacity(table.value_header.len() + value.as_bytes().len());
        bytes.extend_from_slice(&table.value_header);
        bytes.extend_from_slice(value.as_bytes());
        let topic = table.topic.bind(py).clone().into_any();
        let tombstone = tombstone(change.op == "d", shaping.tombstones, key.is_some());
        records.push((topic.clone(), key.clone(), Some(PyBytes::new(py, &bytes))));
        if tombstone {
            records.push((topic, key, None));
        }
        let slot = ["c", "u", "d"].iter().position(|op| *op == change.op).unwrap_or(0);
        match events.iter_mut().find(|(t, _)| t.is(&change.table)) {
            Some((_, counts)) => counts[slot] += 1,
            None => {
                let mut counts = [0; 3];
                counts[slot] = 1;
                events.push((change.table.clone(), counts));
            }
        }
    }
    if let Some((topic, key_header, value_header)) = metadata {
        per_topic.sort();
        let counts: Vec<(String, i64)> = per_topic.into_iter().map(|(_, n, name)| (name, n)).collect();
        let (key, value) = transaction_fields("END", txn_id, ts_ms, Some(total), Some(&counts), shaping.debezium);
        records.push(framed(py, topic, key_header, &key, value_header, &value)?);
    }
    Ok(Some(Made { records, events }))
}

fn framed<'py>(
    py: Python<'py>,
    topic: &Bound<'py, PyString>,
    key_header: &[u8],
    key: &[u8],
    value_header: &[u8],
    value: &[u8],
) -> PyResult<Record<'py>> {
    Ok((
        topic.clone().into_any(),
        Some(joined(py, &[key_header, key])?),
        Some(joined(py, &[value_header, value])?),
    ))
}

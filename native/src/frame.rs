//! Walsender frames as the compiled lane and `Envelope.prepare_frames` read them (`cdcd.source.protocol`):
//! the XLogData header, big-endian fields, PostgreSQL's epoch.

/// 'w', data start, WAL end, send time.
pub const XLOGDATA_HEADER: usize = 25;
/// PostgreSQL's epoch (2000-01-01) in µs since the Unix epoch.
pub const PG_EPOCH_OFFSET_US: i64 = 10_957 * 86_400_000_000;

/// An LSN as the Avro long it is written as; the Python stages handle (and name) one past that range.
pub fn signed(lsn: u64) -> Option<i64> {
    i64::try_from(lsn).ok()
}

pub fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

pub fn u64_at(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(data.get(at..at + 8)?.try_into().ok()?))
}

/// An XLogData frame's payload, its data start and the highest WAL position its header reports (as
/// `ReplicationCore.frame`).
pub fn xlogdata(data: &[u8]) -> Option<(&[u8], u64, u64)> {
    if data.len() <= XLOGDATA_HEADER || data[0] != b'w' {
        return None;
    }
    let (start, end) = (u64_at(data, 1)?, u64_at(data, 9)?);
    Some((&data[XLOGDATA_HEADER..], start, start.max(end)))
}

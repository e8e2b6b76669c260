//! The segment format and its one frame codec: every byte of a segment is read and written
//! through [`Version::frame_at`] and [`encode_frame`].
//!
//! ```text
//! segment   = magic (8 bytes) frame*
//! magic     = "CSPOOL04"                          (this release)
//!           | "CSPOOL03"                          (the previous release; read, never written)
//!           | "CSPOOL02", "CSPOOL01"              (earlier releases; read, never written)
//! frame v4  = a v2 frame whose rows have every column of the table, attribution included
//! frame v3  = a v2 frame whose rows have the columns of v2 of the table, before attribution
//! frame v2  = u32 LE  payload length, 1 ..= MAX_RECORD_BYTES
//!             u32 LE  row count, >= 1
//!             u32 LE  earliest received_at of its rows (Unix seconds)
//!             u32 LE  CRC-32C (Castagnoli) of the 12 bytes above and the payload
//!             [u8]    payload: `row count` RowBinary rows (`crate::measurement`)
//! frame v1  = u32 LE  payload length, u32 LE CRC-32C of the payload,
//!             [u8]    payload: a JSON array of measurements
//! ```
//!
//! A v4 payload is exactly what the writer sends to ClickHouse (`INSERT … FORMAT RowBinary`),
//! so the writer joins frames without decoding a row; the header's row count and earliest
//! time let recovery count what a segment holds without decoding either. Segments left by
//! earlier releases are replayed by decoding their rows once and encoding them in this
//! release's layout, with the columns they lack derived or NULL: a v3 payload holds rows
//! without the attribution columns ([`upgrade_v3`]: NULL), a v2 payload rows of 18 columns
//! ([`upgrade_v2`]), a v1 payload JSON ([`to_rowbinary`]). The appender writes only v4.

use crate::measurement::{EncodedRows, Measurement};

/// Segment header of this release's format.
pub const MAGIC: &[u8; 8] = b"CSPOOL04";
/// Segment header of the previous release's format: RowBinary rows without the attribution
/// columns (read only).
pub const MAGIC_V3: &[u8; 8] = b"CSPOOL03";
/// Segment header of an earlier release's format: RowBinary rows without the columns v2 of
/// the table adds (read only).
pub const MAGIC_V2: &[u8; 8] = b"CSPOOL02";
/// Segment header of the JSON format of earlier releases (read only).
pub const MAGIC_V1: &[u8; 8] = b"CSPOOL01";
/// Length of the segment header, in bytes.
pub const HEADER_LEN: u64 = MAGIC.len() as u64;
/// Length of a v2 frame header, in bytes.
pub const FRAME_HEADER_LEN: usize = 16;
const V1_FRAME_HEADER_LEN: usize = 8;
/// Largest record payload accepted when reading, in bytes (a request is at most 64 KiB of
/// JSON in, so its encoded measurements are far below this).
pub const MAX_RECORD_BYTES: u32 = 4 * 1024 * 1024;
/// Most rows in a v2 frame: one request's measurements ([`crate::beacon::MAX_BATCH`]).
const MAX_FRAME_ROWS: u32 = crate::beacon::MAX_BATCH as u32;
/// Fewest bytes of a RowBinary row: the UUID (16), `received_at` (4), `sample_rate` (8), the
/// three string lengths (3) and the ten nullable flags (10).
const MIN_ROW_BYTES: u32 = 41;

/// The format of a segment, from its magic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// JSON payloads (earlier releases).
    V1,
    /// RowBinary payloads with a row count, rows of 18 columns (before v2 of the table).
    V2,
    /// RowBinary payloads with a row count, rows of v2 of the table without attribution.
    V3,
    /// RowBinary payloads with a row count, rows of this release's columns.
    V4,
}

/// One whole, checksummed frame found in a segment's bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrameRef<'a> {
    /// The payload, in the segment's format.
    pub payload: &'a [u8],
    /// Rows it holds.
    pub rows: u32,
    /// Earliest `received_at` of its rows (Unix seconds; 0 when unknown).
    pub earliest_received_at: u32,
    /// Offset just after the frame.
    pub next: usize,
}

impl Version {
    /// The version a segment header names, if it names one.
    pub fn of(magic: &[u8]) -> Option<Version> {
        match magic {
            m if m == MAGIC => Some(Version::V4),
            m if m == MAGIC_V3 => Some(Version::V3),
            m if m == MAGIC_V2 => Some(Version::V2),
            m if m == MAGIC_V1 => Some(Version::V1),
            _ => None,
        }
    }

    /// The magic of this version.
    pub fn magic(self) -> &'static [u8; 8] {
        match self {
            Version::V1 => MAGIC_V1,
            Version::V2 => MAGIC_V2,
            Version::V3 => MAGIC_V3,
            Version::V4 => MAGIC,
        }
    }

    /// The whole, checksummed frame at `off` of `data`, or `None` (cut short, damaged, or no
    /// frame starts there). A v1 frame is counted by decoding its JSON.
    pub fn frame_at(self, data: &[u8], off: usize) -> Option<FrameRef<'_>> {
        match self {
            Version::V2 | Version::V3 | Version::V4 => {
                let header = data.get(off..off.checked_add(FRAME_HEADER_LEN)?)?;
                let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().unwrap());
                let (len, rows, earliest, crc) = (word(0), word(4), word(8), word(12));
                // Cheap checks before the checksum: they keep the resynchronising scan of a
                // damaged segment fast (few random offsets look like a frame header).
                if len > MAX_RECORD_BYTES
                    || rows == 0
                    || rows > MAX_FRAME_ROWS
                    || len < rows * MIN_ROW_BYTES
                {
                    return None;
                }
                let start = off + FRAME_HEADER_LEN;
                let payload = data.get(start..start + len as usize)?;
                let sum = crc32c::crc32c_append(crc32c::crc32c(&header[..12]), payload);
                (sum == crc).then_some(FrameRef {
                    payload,
                    rows,
                    earliest_received_at: earliest,
                    next: start + len as usize,
                })
            }
            Version::V1 => {
                let header = data.get(off..off.checked_add(V1_FRAME_HEADER_LEN)?)?;
                let len = u32::from_le_bytes(header[..4].try_into().unwrap());
                let crc = u32::from_le_bytes(header[4..].try_into().unwrap());
                if len == 0 || len > MAX_RECORD_BYTES {
                    return None;
                }
                let start = off + V1_FRAME_HEADER_LEN;
                let payload = data.get(start..start + len as usize)?;
                // Every v1 payload is a JSON array: a cheap check before the checksum, which
                // keeps the resynchronising scan of a damaged segment fast.
                if payload.first() != Some(&b'[') || crc32c::crc32c(payload) != crc {
                    return None;
                }
                let (rows, earliest) = scan_v1(payload);
                Some(FrameRef {
                    payload,
                    rows,
                    earliest_received_at: earliest,
                    next: start + len as usize,
                })
            }
        }
    }

    /// The length of the frame whose header starts `data` (header included), if `data` holds
    /// a plausible header: how much to read for a frame longer than what was read.
    pub fn frame_len(self, data: &[u8]) -> Option<usize> {
        let (header_len, len) = match self {
            Version::V2 | Version::V3 | Version::V4 => (FRAME_HEADER_LEN, data.get(..4)?),
            Version::V1 => (V1_FRAME_HEADER_LEN, data.get(..4)?),
        };
        let len = u32::from_le_bytes(len.try_into().unwrap());
        (len > 0 && len <= MAX_RECORD_BYTES).then_some(header_len + len as usize)
    }
}

/// Appends one v4 frame holding `rows` to `out`.
pub fn encode_frame(out: &mut Vec<u8>, rows: &EncodedRows) {
    out.extend_from_slice(&frame_header(rows));
    out.extend_from_slice(&rows.bytes);
}

/// The header of the v4 frame holding `rows` (its payload is `rows.bytes`), checksum included.
pub fn frame_header(rows: &EncodedRows) -> [u8; FRAME_HEADER_LEN] {
    let mut header = [0u8; FRAME_HEADER_LEN];
    header[0..4].copy_from_slice(&(rows.bytes.len() as u32).to_le_bytes());
    header[4..8].copy_from_slice(&rows.count.to_le_bytes());
    header[8..12].copy_from_slice(&rows.earliest_received_at.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header[..12]), &rows.bytes);
    header[12..16].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Whether `rest`, the bytes of a segment after its last whole frame, is space never written:
/// zeros, as a segment is made ([`super::prepare`]). No frame is all zeros (its length and
/// row count are at least 1), so zeros are never a torn or damaged frame.
pub fn is_unused(rest: &[u8]) -> bool {
    rest.iter().all(|&b| b == 0)
}

/// The rows of a v1 payload (a JSON array of measurements), encoded as RowBinary; `None` when
/// it is not such an array (checked by its checksum at start, so only a bug gets here).
pub fn to_rowbinary(v1_payload: &[u8]) -> Option<EncodedRows> {
    let rows: Vec<Measurement> = serde_json::from_slice(v1_payload).ok()?;
    let rows: Vec<_> = rows
        .into_iter()
        .map(|m| crate::measurement::complete_earlier(m.into_owned()))
        .collect();
    Some(EncodedRows::encode(&rows))
}

/// The rows of a v2 payload (RowBinary rows of the previous release's columns), completed and
/// encoded in this release's layout; `None` when the payload does not hold whole rows.
pub fn upgrade_v2(v2_payload: &[u8]) -> Option<EncodedRows> {
    let mut input = v2_payload;
    let mut rows = Vec::new();
    while !input.is_empty() {
        rows.push(crate::measurement::decode_earlier(&mut input).ok()?);
    }
    Some(EncodedRows::encode(&rows))
}

/// The rows of a v3 payload (rows of v2 of the table, before attribution), encoded in this
/// release's layout with their attribution NULL; `None` when the payload does not hold whole
/// rows.
pub fn upgrade_v3(v3_payload: &[u8]) -> Option<EncodedRows> {
    let mut input = v3_payload;
    let mut rows = Vec::new();
    while !input.is_empty() {
        rows.push(Measurement::decode_prefix(&mut input, crate::measurement::V2_COLUMNS).ok()?);
    }
    Some(EncodedRows::encode(&rows))
}

/// The rows of a frame's payload in this release's RowBinary layout: a v4 payload as it is,
/// an earlier one converted (`None` when it does not hold what its format says).
pub fn current_rows(version: Version, payload: &[u8]) -> Option<std::borrow::Cow<'_, [u8]>> {
    match version {
        Version::V4 => Some(std::borrow::Cow::Borrowed(payload)),
        Version::V3 => upgrade_v3(payload).map(|r| std::borrow::Cow::Owned(r.bytes)),
        Version::V2 => upgrade_v2(payload).map(|r| std::borrow::Cow::Owned(r.bytes)),
        Version::V1 => to_rowbinary(payload).map(|r| std::borrow::Cow::Owned(r.bytes)),
    }
}

/// The number of measurements in a v1 payload and their earliest `received_at` (0 and 0 for
/// a payload that is not an array of measurements).
fn scan_v1(payload: &[u8]) -> (u32, u32) {
    #[derive(serde::Deserialize)]
    struct ReceivedAt {
        received_at: u32,
    }
    serde_json::from_slice::<Vec<ReceivedAt>>(payload).map_or((0, 0), |v| {
        (
            v.len() as u32,
            v.iter().map(|m| m.received_at).min().unwrap_or(0),
        )
    })
}

/// Encodes a v1 frame, as releases before RowBinary did: for tests of the upgrade path only.
#[cfg(test)]
pub fn encode_v1_frame(out: &mut Vec<u8>, rows: &[Measurement<'_>]) {
    let payload = serde_json::to_vec(rows).unwrap();
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measurement::{decode_all, DateTime};

    /// The spool tests' row, received at 100 + n.
    fn row(n: u128) -> Measurement<'static> {
        Measurement {
            received_at: DateTime(100 + n as u32),
            page_view_at: DateTime(100 + n as u32),
            ..crate::spool::tests::m(n)
        }
    }

    #[test]
    fn a_frame_reads_back_and_any_flipped_bit_is_caught() {
        let rows = EncodedRows::encode(&[row(2), row(1)]);
        let mut data = b"CSPOOL04".to_vec();
        encode_frame(&mut data, &rows);
        assert_eq!(Version::of(&data[..8]), Some(Version::V4));
        let f = Version::V4.frame_at(&data, 8).unwrap();
        assert_eq!(
            (f.rows, f.earliest_received_at, f.next),
            (2, 101, data.len())
        );
        assert_eq!(decode_all(f.payload).unwrap(), [row(2), row(1)]);
        assert_eq!(Version::V4.frame_len(&data[8..]), Some(data.len() - 8));
        for i in 8..data.len() {
            let mut bad = data.clone();
            bad[i] ^= 0x10;
            assert_ne!(Version::V4.frame_at(&bad, 8), Some(f), "byte {i}");
        }
        assert_eq!(Version::V4.frame_at(&data[..data.len() - 1], 8), None);
    }

    /// A frame of the previous release (`CSPOOL02`: rows of 18 columns) is read with the
    /// columns it lacks derived: the page view's time and the parsed user agent.
    #[test]
    fn a_v2_frame_is_completed() {
        let mut earlier = row(7);
        earlier.received_at = DateTime(1_779_999_005);
        earlier.ts = Some(1_779_999_000_500);
        earlier.user_agent =
            "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0".into();
        let mut full = Vec::new();
        earlier.encode(&mut full);
        let mut tail = Vec::new();
        crate::measurement::Column::encode(&earlier.page_view_at, &mut tail);
        for l in [
            &earlier.device_type,
            &earlier.browser,
            &earlier.browser_version,
            &earlier.os,
        ] {
            crate::measurement::Column::encode(l, &mut tail);
        }
        // The attribution columns, each a NULL (one byte).
        tail.extend(std::iter::repeat_n(
            1u8,
            crate::measurement::COLUMNS.len() - crate::measurement::V2_COLUMNS,
        ));
        let v2_row = &full[..full.len() - tail.len()];
        let mut data = MAGIC_V2.to_vec();
        encode_frame(
            &mut data,
            &EncodedRows {
                bytes: v2_row.to_vec(),
                count: 1,
                earliest_received_at: 107,
            },
        );
        let version = Version::of(&data[..8]).unwrap();
        assert_eq!(version, Version::V2);
        let f = version.frame_at(&data, 8).unwrap();
        let rows = decode_all(&current_rows(version, f.payload).unwrap()).unwrap();
        assert_eq!(rows.len(), 1);
        let m = &rows[0];
        assert_eq!(m.page_view_at, DateTime(1_779_999_000));
        assert_eq!(
            (&*m.device_type, &*m.browser, &*m.browser_version, &*m.os),
            ("desktop", "Firefox", "128", "Linux")
        );
        assert_eq!(m.id, earlier.id);
    }

    #[test]
    fn a_v1_frame_is_counted_and_converted() {
        let mut data = b"CSPOOL01".to_vec();
        encode_v1_frame(&mut data, &[row(5), row(3)]);
        assert_eq!(Version::of(&data[..8]), Some(Version::V1));
        let f = Version::V1.frame_at(&data, 8).unwrap();
        assert_eq!((f.rows, f.earliest_received_at), (2, 103));
        let rows = to_rowbinary(f.payload).unwrap();
        assert_eq!(decode_all(&rows.bytes).unwrap(), [row(5), row(3)]);
        assert_eq!(Version::V4.frame_at(&data, 8), None, "not a v4 frame");
    }

    /// A frame of the previous release (`CSPOOL03`: rows without the attribution columns)
    /// is read with its attribution NULL and everything else as it was.
    #[test]
    fn a_v3_frame_reads_with_null_attribution() {
        let rows = [row(4), row(9)];
        let mut payload = Vec::new();
        for r in &rows {
            let mut one = Vec::new();
            r.encode(&mut one);
            // `row` has no attribution: its last columns are NULL flags, one byte each.
            one.truncate(
                one.len() - (crate::measurement::COLUMNS.len() - crate::measurement::V2_COLUMNS),
            );
            payload.extend(one);
        }
        let mut data = MAGIC_V3.to_vec();
        encode_frame(
            &mut data,
            &EncodedRows {
                bytes: payload,
                count: 2,
                earliest_received_at: 104,
            },
        );
        let version = Version::of(&data[..8]).unwrap();
        assert_eq!(version, Version::V3);
        let f = version.frame_at(&data, 8).unwrap();
        assert_eq!(f.rows, 2);
        let read = decode_all(&current_rows(version, f.payload).unwrap()).unwrap();
        assert_eq!(read, rows);
    }
}

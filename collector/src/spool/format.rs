//! The segment format and its one frame codec: every byte of a segment is read and written
//! through [`Version::frame_at`] and [`encode_frame`].
//!
//! ```text
//! segment   = magic (8 bytes) frame*
//! magic     = "CSPOOL05"                          (this release)
//!           | "CSPOOL04", "CSPOOL03", "CSPOOL02"  (earlier releases; read, never written)
//!           | "CSPOOL01"                          (the JSON release; read, never written)
//! frame v5  = u32 LE  payload length, 1 ..= MAX_RECORD_BYTES
//!             u32 LE  row count, 1 ..= MAX_FRAME_ROWS
//!             u32 LE  earliest received_at of its rows (Unix seconds)
//!             u16 LE  layout of its rows (a number the rows' owner gives, see below)
//!             u16 LE  0 (reserved)
//!             u32 LE  CRC-32C (Castagnoli) of the 16 bytes above and the payload
//!             [u8]    payload: `row count` rows in that layout, opaque to the spool
//! frame v2  = a v5 frame without the layout and reserved words (a 16-byte header); the
//!             layout is the segment's: 2, 3 or 4 for "CSPOOL02", "CSPOOL03", "CSPOOL04"
//! frame v1  = u32 LE  payload length, u32 LE CRC-32C of the payload,
//!             [u8]    payload: a JSON array (layout 1), its rows counted only when upgraded
//! ```
//!
//! **The spool never reads a row.** A frame is a layout tag and bytes (Vector's disk buffer
//! keeps its records the same way: opaque bytes and their encoding as metadata, so that
//! encodings can change without changing the buffer). The owner of the rows (the
//! `measurement` module) says at [`super::open`] which layout is current and hands over the one
//! function that turns a payload of any layout it ever wrote into the current one
//! ([`Layouts`]); a frame of the current layout goes to the writer as its bytes are on disk.
//! A column added to the row is a new layout number, not a new spool format. The row count and
//! the earliest time in the header let recovery count what a segment holds and how old it is
//! without the owner's help (apart from layout 1, whose frames never had a count).

/// Segment header of this release's format.
pub const MAGIC: &[u8; 8] = b"CSPOOL05";
/// Segment headers of earlier releases' formats, by version (read only).
pub const MAGIC_V4: &[u8; 8] = b"CSPOOL04";
/// See [`MAGIC_V4`].
pub const MAGIC_V3: &[u8; 8] = b"CSPOOL03";
/// See [`MAGIC_V4`].
pub const MAGIC_V2: &[u8; 8] = b"CSPOOL02";
/// See [`MAGIC_V4`].
pub const MAGIC_V1: &[u8; 8] = b"CSPOOL01";
/// Length of the segment header, in bytes.
pub const HEADER_LEN: u64 = MAGIC.len() as u64;
/// Length of a v5 frame header, in bytes.
pub const FRAME_HEADER_LEN: usize = 20;
/// Length of a v2 frame header (`CSPOOL02` to `CSPOOL04`), in bytes.
const V2_FRAME_HEADER_LEN: usize = 16;
const V1_FRAME_HEADER_LEN: usize = 8;
/// Largest record payload accepted when reading, in bytes (a request is at most 64 KiB of
/// JSON in, so its encoded rows are far below this).
pub const MAX_RECORD_BYTES: u32 = 4 * 1024 * 1024;
/// Most rows in one frame: far above what one request appends (50 measurements at most), a
/// cheap check that keeps the resynchronising scan of a damaged segment fast.
pub const MAX_FRAME_ROWS: u32 = 1024;

/// What one append carries: one request's rows in one layout, opaque to the spool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    /// The layout of the rows (see the module doc); the writer receives only the current one.
    pub layout: u16,
    /// How many rows `payload` holds (at least 1 for a frame on disk).
    pub rows: u32,
    /// The earliest time of receipt among the rows (Unix seconds; 0 when unknown): the age
    /// `collector_spool_oldest_record_age_seconds` counts from after a restart.
    pub earliest_received_at: u32,
    /// The rows, encoded by their owner.
    pub payload: Vec<u8>,
}

/// The rows' owner's side of the spool: which layout is current, and how a payload of an
/// earlier one becomes it. Given to [`super::open`] (and to `collector spool dump`'s reader).
#[derive(Debug, Clone, Copy)]
pub struct Layouts {
    /// The layout that the appender writes and that the writer receives.
    pub current: u16,
    /// The rows of a payload of `layout` as a record of the current layout, or `None` when the
    /// payload does not hold whole rows of that layout (or the layout is unknown). Called for
    /// frames of earlier layouts only, and by recovery to tell the layout of a segment whose
    /// magic was damaged.
    pub upgrade: fn(layout: u16, payload: &[u8]) -> Option<Record>,
}

/// The format of a segment, from its magic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// JSON payloads (layout 1).
    V1,
    /// Counted payloads of layout 2.
    V2,
    /// Counted payloads of layout 3.
    V3,
    /// Counted payloads of layout 4.
    V4,
    /// Counted payloads, each frame tagged with its layout: this release's.
    V5,
}

/// One whole, checksummed frame found in a segment's bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrameRef<'a> {
    /// The payload, in `layout`.
    pub payload: &'a [u8],
    /// The rows' layout.
    pub layout: u16,
    /// Rows it holds (0 in a v1 frame, which does not say: count it by upgrading it).
    pub rows: u32,
    /// Earliest `received_at` of its rows (Unix seconds; 0 when unknown).
    pub earliest_received_at: u32,
    /// Offset just after the frame.
    pub next: usize,
}

impl Version {
    /// Every version, the current one first.
    pub const ALL: [Version; 5] = [
        Version::V5,
        Version::V4,
        Version::V3,
        Version::V2,
        Version::V1,
    ];

    /// The version a segment header names, if it names one.
    pub fn of(magic: &[u8]) -> Option<Version> {
        Version::ALL.into_iter().find(|v| v.magic() == magic)
    }

    /// The magic of this version.
    pub fn magic(self) -> &'static [u8; 8] {
        match self {
            Version::V1 => MAGIC_V1,
            Version::V2 => MAGIC_V2,
            Version::V3 => MAGIC_V3,
            Version::V4 => MAGIC_V4,
            Version::V5 => MAGIC,
        }
    }

    /// The layout of every frame of a segment of this version; `None` for this release's,
    /// whose frames carry their own.
    fn segment_layout(self) -> Option<u16> {
        match self {
            Version::V1 => Some(1),
            Version::V2 => Some(2),
            Version::V3 => Some(3),
            Version::V4 => Some(4),
            Version::V5 => None,
        }
    }

    /// The whole, checksummed frame at `off` of `data`, or `None` (cut short, damaged, or no
    /// frame starts there).
    pub fn frame_at(self, data: &[u8], off: usize) -> Option<FrameRef<'_>> {
        match self {
            Version::V2 | Version::V3 | Version::V4 | Version::V5 => {
                self.counted_frame_at(data, off)
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
                Some(FrameRef {
                    payload,
                    layout: 1,
                    rows: 0,
                    earliest_received_at: 0,
                    next: start + len as usize,
                })
            }
        }
    }

    /// A frame with a row count (v2 to v5).
    fn counted_frame_at(self, data: &[u8], off: usize) -> Option<FrameRef<'_>> {
        let header_len = self.frame_header_len();
        let header = data.get(off..off.checked_add(header_len)?)?;
        let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().unwrap());
        let (len, rows, earliest) = (word(0), word(4), word(8));
        let half = |i: usize| u16::from_le_bytes(header[i..i + 2].try_into().unwrap());
        let (layout, reserved) = match self.segment_layout() {
            Some(layout) => (layout, 0),
            None => (half(12), half(14)),
        };
        let crc = word(header_len - 4);
        // Cheap checks before the checksum: they keep the resynchronising scan of a damaged
        // segment fast (few random offsets look like a frame header).
        if len > MAX_RECORD_BYTES
            || rows == 0
            || rows > MAX_FRAME_ROWS
            || len < rows
            || reserved != 0
            || layout == 0
        {
            return None;
        }
        let start = off + header_len;
        let payload = data.get(start..start + len as usize)?;
        let sum = crc32c::crc32c_append(crc32c::crc32c(&header[..header_len - 4]), payload);
        (sum == crc).then_some(FrameRef {
            payload,
            layout,
            rows,
            earliest_received_at: earliest,
            next: start + len as usize,
        })
    }

    fn frame_header_len(self) -> usize {
        match self {
            Version::V1 => V1_FRAME_HEADER_LEN,
            Version::V2 | Version::V3 | Version::V4 => V2_FRAME_HEADER_LEN,
            Version::V5 => FRAME_HEADER_LEN,
        }
    }

    /// The length of the frame whose header starts `data` (header included), if `data` holds
    /// a plausible header: how much to read for a frame longer than what was read.
    pub fn frame_len(self, data: &[u8]) -> Option<usize> {
        let len = u32::from_le_bytes(data.get(..4)?.try_into().unwrap());
        (len > 0 && len <= MAX_RECORD_BYTES).then_some(self.frame_header_len() + len as usize)
    }
}

/// Appends one v5 frame holding `record` to `out`.
pub fn encode_frame(out: &mut Vec<u8>, record: &Record) {
    out.extend_from_slice(&frame_header(record));
    out.extend_from_slice(&record.payload);
}

/// The header of the v5 frame holding `record` (its payload is `record.payload`), checksum
/// included.
pub fn frame_header(record: &Record) -> [u8; FRAME_HEADER_LEN] {
    let mut header = [0u8; FRAME_HEADER_LEN];
    header[0..4].copy_from_slice(&(record.payload.len() as u32).to_le_bytes());
    header[4..8].copy_from_slice(&record.rows.to_le_bytes());
    header[8..12].copy_from_slice(&record.earliest_received_at.to_le_bytes());
    header[12..14].copy_from_slice(&record.layout.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header[..16]), &record.payload);
    header[16..20].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Whether `rest`, the bytes of a segment after its last whole frame, is space never written:
/// zeros, as a segment is made ([`super::prepare`]). No frame is all zeros (its length and
/// row count are at least 1), so zeros are never a torn or damaged frame.
pub fn is_unused(rest: &[u8]) -> bool {
    rest.iter().all(|&b| b == 0)
}

/// Encodes a frame of an earlier version (`CSPOOL01` to `CSPOOL04`), as those releases did:
/// for tests of the upgrade path only.
#[cfg(test)]
pub fn encode_earlier_frame(out: &mut Vec<u8>, version: Version, record: &Record) {
    if version == Version::V1 {
        out.extend_from_slice(&(record.payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&record.payload).to_le_bytes());
        out.extend_from_slice(&record.payload);
        return;
    }
    let mut header = [0u8; V2_FRAME_HEADER_LEN];
    header[0..4].copy_from_slice(&(record.payload.len() as u32).to_le_bytes());
    header[4..8].copy_from_slice(&record.rows.to_le_bytes());
    header[8..12].copy_from_slice(&record.earliest_received_at.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header[..12]), &record.payload);
    header[12..16].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&record.payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(layout: u16, rows: u32, payload: &[u8]) -> Record {
        Record {
            layout,
            rows,
            earliest_received_at: 100 + rows,
            payload: payload.to_vec(),
        }
    }

    #[test]
    fn a_frame_reads_back_with_its_layout_and_any_flipped_bit_is_caught() {
        let r = record(7, 2, b"two opaque rows");
        let mut data = MAGIC.to_vec();
        encode_frame(&mut data, &r);
        assert_eq!(Version::of(&data[..8]), Some(Version::V5));
        let f = Version::V5.frame_at(&data, 8).unwrap();
        assert_eq!(
            (f.layout, f.rows, f.earliest_received_at, f.next, f.payload),
            (7, 2, 102, data.len(), &b"two opaque rows"[..])
        );
        assert_eq!(Version::V5.frame_len(&data[8..]), Some(data.len() - 8));
        for i in 8..data.len() {
            let mut bad = data.clone();
            bad[i] ^= 0x10;
            assert_ne!(Version::V5.frame_at(&bad, 8), Some(f), "byte {i}");
        }
        assert_eq!(Version::V5.frame_at(&data[..data.len() - 1], 8), None);
    }

    /// A frame of `CSPOOL02` to `CSPOOL04` has no layout word: its layout is the segment's.
    #[test]
    fn an_earlier_frame_takes_its_segments_layout() {
        for (version, layout) in [(Version::V2, 2), (Version::V3, 3), (Version::V4, 4)] {
            let mut data = version.magic().to_vec();
            encode_earlier_frame(&mut data, version, &record(99, 1, b"row"));
            let f = version.frame_at(&data, 8).unwrap();
            assert_eq!((f.layout, f.rows, f.payload), (layout, 1, &b"row"[..]));
            assert_eq!(Version::V5.frame_at(&data, 8), None, "not a v5 frame");
        }
    }

    #[test]
    fn a_v1_frame_is_found_uncounted() {
        let mut data = MAGIC_V1.to_vec();
        encode_earlier_frame(&mut data, Version::V1, &record(1, 0, b"[{}]"));
        let f = Version::V1.frame_at(&data, 8).unwrap();
        assert_eq!((f.layout, f.rows, f.payload), (1, 0, &b"[{}]"[..]));
        assert_eq!(Version::V5.frame_at(&data, 8), None, "not a v5 frame");
    }
}

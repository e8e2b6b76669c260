//! `collector spool dump`: the rows a spool folder holds, as JSON lines, for people.
//!
//! It reads the segments as they are, without the folder's lock and without repairing
//! anything, so it is safe beside a running collector (a frame being written at that moment
//! is simply not whole yet and ends the segment's listing).

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use super::files::Cursor;
use super::format::{self, Version, HEADER_LEN, MAGIC};
use super::Position;
use crate::measurement::decode_all;

/// What a dump found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Segments read.
    pub segments: usize,
    /// Frames listed.
    pub frames: usize,
    /// Rows listed.
    pub rows: usize,
    /// Frames that could not be decoded (listed as an error line each).
    pub damaged: usize,
    /// The cursor: everything before it is confirmed by ClickHouse.
    pub cursor: Position,
}

/// Writes one JSON line per row to `out`: `{"segment":N,"offset":N,"row":{...}}`, the
/// position being that of the row's frame. Only rows after the cursor (not yet confirmed by
/// ClickHouse) unless `all`. Errors: the folder or a segment cannot be read.
pub fn dump(dir: &Path, all: bool, out: &mut impl Write) -> io::Result<Summary> {
    if !dir.join("segments").is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "not a spool folder (it has no segments/ folder)",
        ));
    }
    let cursor = Cursor::read(dir)?;
    let mut summary = Summary {
        cursor,
        ..Summary::default()
    };
    for n in super::segment_numbers(dir)? {
        let data = match fs::read(super::segment_path(dir, n)) {
            Ok(d) => d,
            // Deleted by the collector since the listing: delivered.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        summary.segments += 1;
        let version = Version::of(data.get(..MAGIC.len()).unwrap_or(&[])).unwrap_or(Version::V4);
        let mut off = HEADER_LEN as usize;
        loop {
            let Some(frame) = version.frame_at(&data, off) else {
                if !format::is_unused(&data[off.min(data.len())..]) {
                    // Torn (a write in progress, or a crash) or damaged: recovery at the next
                    // start decides; the dump says where its listing of the segment stops.
                    summary.damaged += 1;
                    let line = serde_json::json!({"segment": n, "offset": off, "error": "torn or damaged frame: the rest of this segment is not listed"});
                    writeln!(out, "{line}")?;
                }
                break;
            };
            let at = Position {
                segment: n,
                offset: off as u64,
            };
            off = frame.next;
            if !all && at < cursor {
                continue;
            }
            summary.frames += 1;
            let rows = format::current_rows(version, frame.payload)
                .ok_or_else(|| "not whole measurements of its format".to_owned())
                .and_then(|r| decode_all(&r).map_err(|e| e.to_string()));
            match rows {
                Ok(rows) => {
                    for row in rows {
                        summary.rows += 1;
                        let line =
                            serde_json::json!({"segment": n, "offset": at.offset, "row": row});
                        writeln!(out, "{line}")?;
                    }
                }
                Err(error) => {
                    summary.damaged += 1;
                    let line =
                        serde_json::json!({"segment": n, "offset": at.offset, "error": error});
                    writeln!(out, "{line}")?;
                }
            }
        }
    }
    out.flush()?;
    Ok(summary)
}

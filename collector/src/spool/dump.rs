//! `collector spool dump`'s reading of a folder: every frame the segments hold, in order, as
//! the spool sees them (a layout tag and bytes); the command turns them into rows for people.
//!
//! It reads the segments as they are, without the folder's lock and without repairing
//! anything, so it is safe beside a running collector (a frame being written at that moment
//! is simply not whole yet and ends the segment's listing).

use std::fs;
use std::io;
use std::path::Path;

use super::files::Cursor;
use super::format::{self, Version, HEADER_LEN, MAGIC};
use super::Position;

/// What a dump found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Segments read.
    pub segments: usize,
    /// Frames handed to the visitor.
    pub frames: usize,
    /// Segments whose listing stopped at a torn or damaged frame.
    pub torn: usize,
    /// The cursor: everything before it is confirmed by ClickHouse.
    pub cursor: Position,
}

/// One thing found in a segment, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found<'a> {
    /// A whole, checksummed frame starting at `at`.
    Frame {
        /// Where the frame starts.
        at: Position,
        /// Its rows' layout ([`super::Layouts`]).
        layout: u16,
        /// Its rows, opaque.
        payload: &'a [u8],
    },
    /// A frame cut short (a write in progress, or a crash) or damaged at `at`: recovery at the
    /// next start decides; the rest of that segment is not listed.
    Torn {
        /// Where the listing of the segment stops.
        at: Position,
    },
}

/// Hands `visit` every frame after the cursor (ClickHouse has not confirmed them), or every
/// frame on disk when `all`, in spool order, and every place a segment's listing stops.
/// Errors: the folder or a segment cannot be read, or `visit` failed.
pub fn dump(
    dir: &Path,
    all: bool,
    mut visit: impl FnMut(Found<'_>) -> io::Result<()>,
) -> io::Result<Summary> {
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
        let version = Version::of(data.get(..MAGIC.len()).unwrap_or(&[])).unwrap_or(Version::V5);
        let mut off = HEADER_LEN as usize;
        loop {
            let at = Position {
                segment: n,
                offset: off as u64,
            };
            let Some(frame) = version.frame_at(&data, off) else {
                if !format::is_unused(&data[off.min(data.len())..]) {
                    summary.torn += 1;
                    visit(Found::Torn { at })?;
                }
                break;
            };
            off = frame.next;
            if !all && at < cursor {
                continue;
            }
            summary.frames += 1;
            visit(Found::Frame {
                at,
                layout: frame.layout,
                payload: frame.payload,
            })?;
        }
    }
    Ok(summary)
}

//! Recovery at open: each segment checked frame by frame and repaired so that it holds only
//! whole, checksummed frames, and what is still to be delivered counted from frame headers.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use super::files::Cursor;
use super::format::{is_unused, FrameRef, Layouts, Version, HEADER_LEN, MAGIC};
use super::{held_since_recovered, segment_path, HeldTimes, Position};
use crate::metrics::Metrics;

/// What recovery kept of one segment.
pub(super) struct Recovered {
    /// Length of the segment after recovery.
    pub len: u64,
    /// Measurements at or after the cursor.
    pub records_after: u64,
    /// Frame bytes at or after the cursor.
    pub bytes_after: u64,
    /// Whether the segment was rewritten without damaged frames (positions moved).
    pub rewritten: bool,
}

/// Checks segment `n` frame by frame and repairs it; returns `None` when nothing of it is left
/// (it is then removed).
///
/// - A frame cut short at the end (a torn write) is cut off. Zeros after the last byte written
///   are a prepared segment's room, so a damaged last frame whose bytes end in zeros reads as
///   torn: cut and warned about, without a copy aside.
/// - A damaged frame in the middle is skipped: the scan resynchronises on the next offset
///   that holds a whole, checksummed frame, the original file is copied to
///   `kept-aside/damaged-<n>.seg` for inspection, and the segment is rewritten without the
///   damage (the cursor is moved to the same frame in the rewritten file).
/// - A damaged magic does not lose the frames after it: they carry their own checksums, and
///   the format is the one whose frames are found there.
pub(super) fn recover_segment(
    dir: &Path,
    layouts: &Layouts,
    n: u64,
    cursor: &mut Position,
    cursor_file: &mut Cursor,
    metrics: &Metrics,
    received: &mut HeldTimes,
) -> io::Result<Option<Recovered>> {
    let path = segment_path(dir, n);
    let data = fs::read(&path)?;
    let no_frame = data.len() >= MAGIC.len()
        && Version::of(&data[..MAGIC.len()]).is_some()
        && is_unused(&data[MAGIC.len()..]);
    if data.len() <= MAGIC.len() || no_frame {
        // Just the magic (and a prepared segment's zeros) is an empty segment, what a clean
        // stop leaves: normal. Less than the magic is a torn segment start.
        if data.len() >= MAGIC.len() {
            tracing::debug!(segment = %path.display(), "spool: removing an empty segment");
        } else if !data.is_empty() {
            tracing::warn!(segment = %path.display(), bytes = data.len(), "spool: removing a segment too short to hold a record");
        }
        fs::remove_file(&path)?;
        return Ok(None);
    }
    let named = Version::of(&data[..MAGIC.len()]);
    let version = named.unwrap_or_else(|| {
        tracing::error!(segment = %path.display(), "spool: damaged segment header; reading its records anyway");
        guess_version(&data, layouts)
    });
    let (frames, skipped) = whole_frames(&data, version);
    let valid_end = frames.last().map_or(HEADER_LEN as usize, |f| f.1);
    // Zeros after the last byte written are a prepared segment's room, never written: cut
    // without a word and not counted as damage, also after a torn frame.
    let written_end = data
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |p| p + 1)
        .max(valid_end);
    let cut = written_end - valid_end;
    let rewrite = skipped > 0 || named.is_none();
    let (len, data) = if rewrite {
        let aside = copy_damaged_aside(dir, n, &data[..written_end]);
        tracing::error!(segment = %path.display(), skipped_bytes = skipped, kept = %aside, "spool: skipped damaged records; the original is kept aside");
        metrics.spool.damaged_bytes.inc_by((skipped + cut) as u64);
        let out = rewrite_whole(dir, n, version, &data, &frames, cursor, cursor_file)?;
        (out.len() as u64, out)
    } else {
        if cut > 0 {
            // A tail torn by a crash is part of one group write; a tail holding a whole frame
            // by its length field that fails its checksum is damage: keep the original.
            let whole = version
                .frame_len(&data[valid_end..])
                .is_some_and(|len| len <= cut);
            if whole {
                let aside = copy_damaged_aside(dir, n, &data[..written_end]);
                tracing::error!(segment = %path.display(), cut_bytes = cut, kept = %aside, "spool: cut a damaged tail; the original is kept aside");
            } else {
                tracing::warn!(segment = %path.display(), cut_bytes = cut, "spool: cut a torn tail");
            }
            metrics.spool.damaged_bytes.inc_by(cut as u64);
        }
        if valid_end < data.len() {
            if cut == 0 {
                tracing::debug!(segment = %path.display(), bytes = data.len() - valid_end, "spool: cutting a prepared segment's unused space");
            }
            let f = OpenOptions::new().write(true).open(&path)?;
            f.set_len(valid_end as u64)?;
            f.sync_all()?;
        }
        (valid_end as u64, data)
    };
    let (records_after, bytes_after) = count_after(&data, version, layouts, n, cursor, received);
    Ok(Some(Recovered {
        len,
        records_after,
        bytes_after,
        rewritten: rewrite,
    }))
}

/// The whole, checksummed frames of a segment's bytes as `(start, end)` offsets, skipping
/// damage (the scan resynchronises on the next offset that holds a whole frame), and how many
/// bytes were skipped. It stops at zeros that run to the end: a prepared segment's room.
pub(super) fn whole_frames(data: &[u8], version: Version) -> (Vec<(usize, usize)>, usize) {
    let mut frames = Vec::new();
    let (mut off, mut skipped) = (HEADER_LEN as usize, 0usize);
    while off < data.len() {
        if let Some(f) = version.frame_at(data, off) {
            frames.push((off, f.next));
            off = f.next;
            continue;
        }
        if is_unused(&data[off..]) {
            break;
        }
        match (off + 1..data.len()).find(|&p| version.frame_at(data, p).is_some()) {
            Some(p) => {
                skipped += p - off;
                off = p;
            }
            None => break,
        }
    }
    (frames, skipped)
}

/// Rewrites segment `n` with its whole `frames` only (through a synced temporary file and a
/// rename), remapping the cursor if it points in here; the new bytes.
fn rewrite_whole(
    dir: &Path,
    n: u64,
    version: Version,
    data: &[u8],
    frames: &[(usize, usize)],
    cursor: &mut Position,
    cursor_file: &mut Cursor,
) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len());
    out.extend_from_slice(version.magic());
    let mut new_cursor = None;
    for &(start, end) in frames {
        if n == cursor.segment && new_cursor.is_none() && start as u64 >= cursor.offset {
            new_cursor = Some(out.len() as u64);
        }
        out.extend_from_slice(&data[start..end]);
    }
    if n == cursor.segment {
        cursor.offset = new_cursor.unwrap_or(out.len() as u64);
        cursor_file.persist(*cursor)?;
    }
    let path = segment_path(dir, n);
    let tmp = path.with_extension("seg.tmp");
    let mut f = super::files::create_private(&tmp)?;
    f.write_all(&out)?;
    f.sync_all()?;
    fs::rename(&tmp, &path)?;
    File::open(dir.join("segments"))?.sync_all()?;
    Ok(out)
}

/// What segment `n` (its recovered bytes) holds at or after the cursor, rows and frame bytes,
/// counted from the frame headers alone (a v1 frame's rows by their owner); each frame's
/// earliest time is recorded in `received`.
fn count_after(
    data: &[u8],
    version: Version,
    layouts: &Layouts,
    n: u64,
    cursor: &Position,
    received: &mut HeldTimes,
) -> (u64, u64) {
    let (mut records, mut bytes) = (0, 0);
    let mut off = HEADER_LEN as usize;
    while let Some(f) = version.frame_at(data, off) {
        let at = Position {
            segment: n,
            offset: off as u64,
        };
        if at >= *cursor {
            let (rows, earliest) = counted(&f, layouts);
            records += u64::from(rows);
            bytes += (f.next - off) as u64;
            if rows > 0 {
                let end = Position {
                    segment: n,
                    offset: f.next as u64,
                };
                received.appended(end, held_since_recovered(earliest));
            }
        }
        off = f.next;
    }
    (records, bytes)
}

/// The version of a segment whose magic is damaged, from its first frame: v5 frames name their
/// layout; the versions before share one framing, and the one whose rows the owner reads as
/// exactly the header's row count is the one that wrote it ([`Layouts::upgrade`]: the spool
/// itself never reads a row). This release's when nothing fits.
fn guess_version(data: &[u8], layouts: &Layouts) -> Version {
    Version::ALL
        .into_iter()
        .find(|v| {
            v.frame_at(data, HEADER_LEN as usize).is_some_and(|f| {
                *v == Version::V5
                    || (layouts.upgrade)(f.layout, f.payload)
                        .is_some_and(|r| f.rows == 0 || r.rows == f.rows)
            })
        })
        .unwrap_or(Version::V5)
}

/// The rows a frame holds and the earliest time among them: from its header, or, for a frame
/// of the JSON release (whose header has neither), from its rows as the owner reads them.
fn counted(f: &FrameRef<'_>, layouts: &Layouts) -> (u32, u32) {
    if f.rows > 0 {
        return (f.rows, f.earliest_received_at);
    }
    (layouts.upgrade)(f.layout, f.payload).map_or((0, 0), |r| (r.rows, r.earliest_received_at))
}

/// Copies a damaged segment's bytes (its prepared zeros left out) to
/// `kept-aside/damaged-<n>.seg` for inspection, and says where for the log. Best effort: the
/// copy needs space, and opening a spool on a full disk must not fail for it.
fn copy_damaged_aside(dir: &Path, n: u64, bytes: &[u8]) -> String {
    let aside = dir.join("kept-aside").join(format!("damaged-{n:020}.seg"));
    match super::files::create_private(&aside).and_then(|mut f| f.write_all(bytes)) {
        Ok(()) => aside.display().to_string(),
        Err(e) => {
            let _ = fs::remove_file(&aside);
            format!("nowhere ({e})")
        }
    }
}

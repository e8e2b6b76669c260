//! The reading side: durable frames in order, handed to the writer as they are on disk (a
//! frame of an earlier layout upgraded by the rows' owner, [`super::Layouts`]; the spool never
//! reads a row), then confirmation: the cursor moved and delivered segments deleted; and the
//! dead-letter files of rows ClickHouse refused, as the writer renders them.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use super::files::{Cursor, SlotFile};
use super::format::{Version, HEADER_LEN, MAGIC};
use super::{Position, Shared, INFLIGHT_FILE};

/// Bytes read from a segment with one `pread` at least (frames are a few hundred bytes each).
const READ_CHUNK_MIN: u64 = 64 * 1024;
/// Bytes read with one `pread` at most.
const READ_CHUNK_MAX: u64 = 4 * 1024 * 1024;

/// The reading side, held by the writer.
pub struct SpoolReader {
    pub(super) shared: Arc<Shared>,
    pub(super) pos: Position,
    /// End of the batch that was in flight when the spool was last closed, if it starts here.
    pub(super) replay_bound: Option<Position>,
    pub(super) committed: watch::Receiver<Position>,
    /// The segment being read: its number, file and format.
    pub(super) open: Option<(u64, File, Version)>,
    pub(super) cursor: Cursor,
    /// The in-flight file; `None` while it is missing and cannot be made.
    pub(super) in_flight: Option<SlotFile>,
}

/// One durable frame (one request's accepted rows), as the writer sends it.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Position just after this frame.
    pub end: Position,
    /// Rows it holds (at least 1).
    pub rows: u32,
    /// Its size on disk, header included.
    pub bytes: u64,
    /// The rows, in the current layout ([`super::Layouts::current`]): as they are on disk, or,
    /// for a frame of an earlier layout, upgraded once, when read.
    pub payload: Bytes,
}

impl SpoolReader {
    /// Position of the next frame to read.
    pub fn position(&self) -> Position {
        self.pos
    }

    /// This spool's identity: 32 hex digits, random, stable for the spool's life (see the
    /// module doc).
    pub fn identity(&self) -> &str {
        &self.shared.identity
    }

    /// The end of the batch that was in flight when this spool was last closed, if that batch
    /// starts where reading started: until it is confirmed, [`SpoolReader::read_available`]
    /// reads nothing past it, so the writer's first batch is exactly that batch again and its
    /// retry carries the same token.
    pub fn replay_bound(&self) -> Option<Position> {
        self.replay_bound
    }

    /// Records that the batch `start..end` is about to be sent (see the module doc), in place.
    /// Not synced: losing it costs only ClickHouse's folding of a retry. Errors are ignored
    /// (a full disk must not stop delivery), apart from a rate-limited warning.
    pub fn record_in_flight(&mut self, start: Position, end: Position) {
        let body = format!(
            "{} {} {} {} {}",
            self.shared.identity, start.segment, start.offset, end.segment, end.offset
        );
        let result = match &mut self.in_flight {
            Some(file) => file.write(&body, false),
            None => SlotFile::open(&self.shared.dir, INFLIGHT_FILE).and_then(|(mut file, _)| {
                let written = file.write(&body, false);
                self.in_flight = Some(file);
                written
            }),
        };
        if let Err(e) = result {
            crate::logging::warn_limited(
                "spool_inflight",
                || tracing::warn!(error = %e, "spool: cannot record the batch in flight"),
            );
        }
    }

    /// Waits until something past the read position is durable, or `limit` passes.
    pub async fn wait(&mut self, limit: Duration) {
        let pos = self.pos;
        let _ = tokio::time::timeout(limit, self.committed.wait_for(|c| *c > pos)).await;
    }

    /// Reads durable frames in order until about `max_bytes` or `max_rows` are read (at least
    /// one frame) or none is left, with one `pread` per run of frames. Blocking file I/O (from
    /// the page cache, as a rule): the writer calls it from its own thread.
    // Never inlined, so that a profile of the whole-program (LTO) build names it.
    #[inline(never)]
    pub fn read_available(&mut self, max_bytes: u64, max_rows: u64, out: &mut Vec<Frame>) {
        let (mut read, mut rows) = (0, 0);
        while read < max_bytes && rows < max_rows {
            if self.replay_bound.is_some_and(|b| self.pos >= b) {
                return;
            }
            let committed = *self.committed.borrow();
            if self.pos >= committed {
                // Read to the end of a sealed segment: let go of it, so that deleting it frees
                // its space (an open file keeps its blocks).
                if self.shared.state.lock().unwrap().sealed {
                    self.open = None;
                }
                return;
            }
            let end = if self.pos.segment == committed.segment {
                committed.offset
            } else {
                let len = self
                    .shared
                    .state
                    .lock()
                    .unwrap()
                    .segments
                    .get(&self.pos.segment)
                    .copied();
                match len {
                    Some(len) => len,
                    // The segment is gone or never existed: go on with the next one.
                    None => match self.next_segment() {
                        true => continue,
                        false => return,
                    },
                }
            };
            if self.pos.offset >= end {
                match self.next_segment() {
                    true => continue,
                    false => return,
                }
            }
            // A batch replayed after a restart ends where it ended before (same token).
            let end = match self.replay_bound {
                Some(b) if b.segment == self.pos.segment => end.min(b.offset),
                _ => end,
            };
            match self.read_frames(end, max_bytes - read, max_rows - rows, out) {
                Ok((n, r)) => {
                    read += n;
                    rows += r;
                }
                Err(e) => {
                    // Checked at start and written by us since; only a disk fault gets here.
                    tracing::error!(segment = self.pos.segment, offset = self.pos.offset, error = %e, "spool: unreadable record; skipping the rest of the segment");
                    self.pos.offset = end;
                }
            }
        }
    }

    /// Moves to the next segment; `false` when there is none.
    fn next_segment(&mut self) -> bool {
        let next = self
            .shared
            .state
            .lock()
            .unwrap()
            .segments
            .range(self.pos.segment + 1..)
            .next()
            .map(|(&n, _)| n);
        match next {
            Some(n) => {
                self.pos = Position {
                    segment: n,
                    offset: HEADER_LEN,
                };
                self.open = None;
                true
            }
            None => false,
        }
    }

    /// Reads the whole frames between the read position and `end` (at least one, about
    /// `room` bytes and at most about `max_rows` rows) with one `pread`; returns the bytes and
    /// rows read.
    fn read_frames(
        &mut self,
        end: u64,
        room: u64,
        max_rows: u64,
        out: &mut Vec<Frame>,
    ) -> io::Result<(u64, u64)> {
        if self.open.as_ref().map(|(n, _, _)| *n) != Some(self.pos.segment) {
            let file = File::open(self.shared.segment_path(self.pos.segment))?;
            let mut magic = [0u8; MAGIC.len()];
            file.read_exact_at(&mut magic, 0)?;
            // Recovery rewrote any segment whose magic was damaged.
            let version = Version::of(&magic).unwrap_or(Version::V5);
            self.open = Some((self.pos.segment, file, version));
        }
        let (segment, file, version) = self.open.as_ref().expect("just opened");
        let (segment, version) = (*segment, *version);
        let start = self.pos.offset;
        let want = (end - start).min(room.clamp(READ_CHUNK_MIN, READ_CHUNK_MAX));
        let mut chunk = vec![0u8; want as usize];
        file.read_exact_at(&mut chunk, start)?;
        if version.frame_at(&chunk, 0).is_none() {
            // The first frame is longer than the chunk (or damaged): read exactly it.
            let len = version
                .frame_len(&chunk)
                .filter(|&len| len as u64 <= end - start)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad record length"))?;
            chunk = vec![0u8; len];
            file.read_exact_at(&mut chunk, start)?;
        }
        let chunk = Bytes::from(chunk);
        let (mut off, mut rows_read) = (0, 0u64);
        while rows_read < max_rows {
            let Some(f) = version.frame_at(&chunk, off) else {
                break;
            };
            let layouts = &self.shared.layouts;
            let (payload, rows) = if f.layout == layouts.current {
                (chunk.slice_ref(f.payload), f.rows)
            } else {
                let record = (layouts.upgrade)(f.layout, f.payload).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "a frame of layout {} that does not hold whole rows of it",
                            f.layout
                        ),
                    )
                })?;
                (Bytes::from(record.payload), record.rows)
            };
            out.push(Frame {
                end: Position {
                    segment,
                    offset: start + f.next as u64,
                },
                rows,
                bytes: (f.next - off) as u64,
                payload,
            });
            off = f.next;
            rows_read += u64::from(rows);
        }
        if off == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "checksum mismatch",
            ));
        }
        self.pos.offset = start + off as u64;
        Ok((off as u64, rows_read))
    }

    /// Marks everything before `upto` as confirmed by ClickHouse (`records` measurements and
    /// `bytes` spool bytes since the last confirmation): persists the cursor (in place, synced)
    /// and deletes every segment that holds nothing unconfirmed: older ones, and the active one
    /// too once it is sealed and the cursor is durably past it.
    pub fn confirm(&mut self, upto: Position, records: u64, bytes: u64) {
        // The replayed batch is the first one confirmed after opening.
        self.replay_bound = None;
        // The counts first: the rows are in ClickHouse whatever happens to the files below.
        {
            let mut st = self.shared.state.lock().unwrap();
            st.unconfirmed_records = st.unconfirmed_records.saturating_sub(records);
            st.unconfirmed_bytes = st.unconfirmed_bytes.saturating_sub(bytes);
            st.received.confirmed(upto);
            self.shared.publish(&st);
        }
        // The cursor before any deletion: a stale cursor replays confirmed records after a
        // restart (storage folds them), but no segment may go that a durable cursor has not
        // passed if it is the last one left (numbering would restart below it).
        let mut durable = self.persist_cursor(upto);
        let deleted = self.delete_confirmed(upto, false);
        if !durable && deleted {
            // Space may have returned with the deleted segments.
            durable = self.persist_cursor(upto);
        }
        if durable {
            self.delete_confirmed(upto, true);
        }
    }

    fn persist_cursor(&mut self, upto: Position) -> bool {
        match self.cursor.persist(upto) {
            Ok(()) => {
                self.shared.state.lock().unwrap().durable = upto;
                true
            }
            Err(e) => {
                crate::logging::warn_limited(
                    "spool_cursor",
                    || tracing::warn!(error = %crate::logging::chain(&e), "spool: cannot record the cursor"),
                );
                false
            }
        }
    }

    /// Deletes the segments wholly before `upto` other than the active one, and the active one
    /// too when `with_sealed` and it is sealed; whether any was deleted. Files are removed
    /// outside the lock that the appender and `/readyz` take.
    fn delete_confirmed(&mut self, upto: Position, with_sealed: bool) -> bool {
        let done: Vec<(u64, u64)> = {
            let st = self.shared.state.lock().unwrap();
            let (active, sealed) = (st.active, st.sealed);
            st.segments
                .iter()
                .filter(|(&n, &len)| {
                    n < upto.segment
                        || (n == upto.segment
                            && upto.offset >= len
                            && (n != active || (with_sealed && sealed)))
                })
                .map(|(&n, &len)| (n, len))
                .collect()
        };
        let mut deleted = false;
        for (n, len) in done {
            if self.open.as_ref().is_some_and(|(o, _, _)| *o == n) {
                self.open = None;
            }
            match fs::remove_file(self.shared.segment_path(n)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                // Tried again at the next confirmation; meanwhile it only takes disk space.
                Err(e) => {
                    crate::logging::warn_limited(
                        "spool_delete",
                        || tracing::warn!(segment = n, error = %e, "spool: cannot delete a confirmed segment"),
                    );
                    continue;
                }
            }
            self.shared.forget_segment(n, len);
            deleted = true;
        }
        deleted
    }

    /// Writes rows ClickHouse refused as bad data to `kept-aside/` (the dead-letter folder):
    /// `<segment>-<offset>-<row>.json`, named by the batch's start and the index of the first
    /// row in the batch, holding `body` as the writer rendered it (the reason and the rows as
    /// JSON), synced. `rows` is how many rows it holds, for
    /// `collector_spool_kept_aside_rows_total`. Returns the file written.
    pub fn write_kept_aside(
        &self,
        start: Position,
        first_row: usize,
        body: &[u8],
        rows: usize,
    ) -> io::Result<PathBuf> {
        let name = format!("{:020}-{:012}-{first_row:06}", start.segment, start.offset);
        let path = self
            .shared
            .dir
            .join("kept-aside")
            .join(format!("{name}.json"));
        let mut f = super::files::create_private(&path)?;
        f.write_all(body)?;
        f.sync_all()?;
        self.shared
            .metrics
            .spool
            .kept_aside_rows
            .inc_by(rows as u64);
        Ok(path)
    }
}

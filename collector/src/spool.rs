//! The durable spool: where the request path ends and the write path begins.
//!
//! Intake appends the measurements of a request and answers 202 only once they are on disk
//! (fdatasync). The writer reads them back, inserts them into ClickHouse in batches and
//! confirms; confirmed segments are deleted. Neither side calls the other: they share only
//! this log.
//!
//! # On-disk format (version 1)
//!
//! ```text
//! SPOOL_DIR/
//!   LOCK                      advisory exclusive lock (fs4): one collector per folder
//!   IDENTITY                  this spool's random identity (32 hex digits), made once
//!   CURSOR                    "<segment> <offset>": everything before it is confirmed
//!   INFLIGHT                  "<identity> <seg> <off> <seg> <off>": the batch last sent
//!   segments/<20 digits>.seg  the log, in order of the number
//!   kept-aside/*.json         batches ClickHouse refused as bad data, for an operator
//! ```
//!
//! A segment is the 8-byte magic `CSPOOL01` followed by records:
//!
//! ```text
//! u32 LE  payload length in bytes (1 ..= MAX_RECORD_BYTES)
//! u32 LE  CRC-32C (Castagnoli) of the payload
//! [u8]    payload: a JSON array of `Measurement` (one request's accepted measurements)
//! ```
//!
//! `CURSOR` and `INFLIGHT` are slot files ([`SlotFile`]): 512 bytes written in full once, when
//! the file is made, then rewritten in place (`pwrite`, and `fdatasync` for the cursor), never
//! through a new file and a rename, so that recording progress never needs free space. Each
//! holds two 256-byte slots written in turn; a slot is one line, `<seq> <body> <crc32c hex>`
//! padded with spaces, and the valid slot with the higher sequence number is the file's value,
//! so a write torn by a crash leaves the previous value. (A shorter file is the one-line format
//! of earlier versions, read as it is and turned into slots by its first rewrite.)
//!
//! JSON keeps the spool and kept-aside batches readable with ordinary tools; CRC-32C (the
//! `crc32c` crate, hardware-accelerated) detects torn and corrupted records. At start every
//! segment is scanned; a record that is cut short or fails its checksum ends the segment
//! there (the file is truncated to the last whole record), so a torn tail after a crash is
//! never replayed as garbage. A write or sync error truncates the segment back to its last
//! durable length and continues in a new segment (after a failed fsync the page cache cannot
//! be trusted, so the data is never re-synced: the affected requests got 503).
//!
//! # Identity and the batch in flight
//!
//! ClickHouse (22.2 and later) drops, and answers `200` to, any INSERT into a replicated table
//! whose `insert_deduplication_token` it has seen within its deduplication window, whatever the
//! rows; that memory is per table, shared by every replica and every collector. A token must
//! therefore name one batch of one spool and nothing else. Spool positions alone do not:
//! every fresh spool starts at the same position, so two collectors routinely form batches
//! with equal ranges. The writer's token is `<identity>-<start>-<end>`: the identity is random
//! (a UUID v4), made when the spool folder is created and kept in `IDENTITY`, so it survives
//! restarts and no two spools share it; the range makes it unique within the spool, because
//! a range, once sent, always holds the same records. The one event that breaks that last
//! rule, recovery rewriting a segment without a damaged record (which moves the records after
//! it), gives the spool a new identity, so that no later batch can reuse an earlier token.
//!
//! A range rather than a content hash: equally stable, free to compute, and readable in
//! ClickHouse's `system.query_log`. To keep the token of a batch stable across a crash, the
//! writer records each batch's range in `INFLIGHT` before sending it ([`SpoolReader::
//! record_in_flight`]); after a restart the first batch is cut to exactly that range
//! ([`SpoolReader::replay_bound`]), so its retry carries the same token and ClickHouse folds it
//! if the first attempt had landed. Losing `INFLIGHT` only costs that folding: the table's
//! `ReplacingMergeTree` still folds duplicate ids.
//!
//! # A full disk
//!
//! The spool's bound ([`crate::config::DEFAULT_SPOOL_MAX_BYTES`]) says nothing about the free
//! space of the filesystem under it. When a write, a sync or the start of a new segment fails
//! (`ENOSPC`, `EDQUOT`, or any other error), the spool turns *unwritable*: the segment is cut
//! back to its last durable length and sealed, every append is refused at once
//! ([`AppendError::DiskFull`] or [`AppendError::Io`]: 503 with `Retry-After`),
//! [`Spool::unwritable`] says why (`/readyz` answers 503 with it) and
//! `collector_spool_disk_full` is 1. Reading, delivering and confirming go on, and need no free
//! space: the cursor is rewritten in place, and a sealed segment is deleted as soon as the
//! durable cursor has passed it (even the newest one: numbering goes on from the cursor). Every
//! [`PROBE_INTERVAL`] the appender tries to leave the state: start a new segment if it has none
//! and reserve [`RESUME_ROOM_BYTES`] in it (`fallocate` with `FALLOC_FL_KEEP_SIZE`); once both
//! succeed, appends are taken again. So the state ends by itself when space returns or when the
//! drain of the spool frees it. Opening needs no free space either when the spool's files exist:
//! if no new segment can be made, the spool opens unwritable and still delivers what it holds.
//!
//! # Group commit
//!
//! One appender thread takes every request queued while the previous sync was in flight,
//! writes them with one `write` and makes them durable with one `fdatasync`, so durability
//! costs one sync per group, not per request.
//!
//! # Bounds
//!
//! What the spool holds that ClickHouse has not confirmed never exceeds `max_bytes`
//! ([`crate::config::DEFAULT_SPOOL_MAX_BYTES`]): an append that would cross it is refused
//! ([`AppendError::Full`], a 503), and nothing already acknowledged is ever dropped. On disk
//! there may be, in addition, up to about one segment of confirmed records waiting for their
//! segment to be sealed and deleted; segments are sized `max_bytes / 8` (between 64 KiB and
//! [`SEGMENT_TARGET_BYTES`]) so that this stays small next to the bound. The append queue holds [`APPEND_QUEUE`] requests;
//! beyond that intake is shed ([`AppendError::Overloaded`]).

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fs4::fs_std::FileExt as _;
use tokio::sync::{oneshot, watch};

use crate::measurement::Measurement;
use crate::metrics::Metrics;

/// Segment header: identifies the format version.
pub const MAGIC: &[u8; 8] = b"CSPOOL01";
const HEADER_LEN: u64 = MAGIC.len() as u64;
const FRAME_LEN: u64 = 8;
/// Largest record payload accepted when reading, in bytes (a request is at most 64 KiB of
/// JSON in, so its re-encoded measurements are far below this).
pub const MAX_RECORD_BYTES: u32 = 4 * 1024 * 1024;
/// Largest segment: one is sealed and a new one started at `max_bytes / 8`, at most this.
pub const SEGMENT_TARGET_BYTES: u64 = 16 * 1024 * 1024;
/// Smallest segment target.
const SEGMENT_MIN_BYTES: u64 = 64 * 1024;
/// Requests waiting for the appender at most; beyond this intake is shed with 503.
pub const APPEND_QUEUE: usize = 4096;
/// Most bytes written by one group commit.
const GROUP_MAX_BYTES: usize = 8 * 1024 * 1024;

/// File holding the spool's identity (see the module doc).
pub const IDENTITY_FILE: &str = "IDENTITY";
/// File recording the range of the batch last handed to ClickHouse.
pub const INFLIGHT_FILE: &str = "INFLIGHT";
/// File recording the cursor: everything before it is confirmed by ClickHouse.
pub const CURSOR_FILE: &str = "CURSOR";
/// Size of one slot of a [`SlotFile`], in bytes; the file holds two.
const SLOT_BYTES: usize = 256;
/// While the spool is unwritable, how often it tries to write again.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// Room the spool must be able to reserve in its segment before it takes appends again after
/// a write failed, in bytes: a typical request's group several times over, small enough for a
/// small volume. It keeps a disk with a few KiB free from flapping between ready and not.
pub const RESUME_ROOM_BYTES: u64 = 64 * 1024;

/// A place in the spool: a segment number and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Position {
    /// Segment number (file name).
    pub segment: u64,
    /// Byte offset in that segment.
    pub offset: u64,
}

/// Why an append was refused. No part of a refused append is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// The spool is at its bound.
    #[error("spool full")]
    Full,
    /// The append queue is full.
    #[error("spool overloaded")]
    Overloaded,
    /// The spool cannot write for lack of space (a full disk or a quota): refused until
    /// space returns (see the module doc).
    #[error("spool disk full")]
    DiskFull,
    /// The disk refused the write or sync, or the appender has stopped.
    #[error("spool write failed")]
    Io,
}

/// Errors opening the spool.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another process holds the lock.
    #[error("spool folder {0} is in use by another collector (lock held on its LOCK file)")]
    Locked(PathBuf),
    /// A filesystem error.
    #[error("spool folder {0}: {1}")]
    Io(PathBuf, io::Error),
}

struct AppendRequest {
    payload: Vec<u8>,
    records: u64,
    /// The earliest `received_at` of its measurements (Unix seconds).
    received_at: Option<u32>,
    ack: oneshot::Sender<Result<(), AppendError>>,
}

#[derive(Debug, Default)]
struct State {
    /// Segment number to its durable length in bytes.
    segments: BTreeMap<u64, u64>,
    /// The segment being appended to (or, while `sealed`, the last one made).
    active: u64,
    /// The active segment takes no more appends: a write to it failed, or no new segment could
    /// be made at start. Once confirmed, it is deleted like any older segment.
    sealed: bool,
    /// What the cursor file durably holds: a sealed active segment before it may be deleted
    /// (numbering goes on from the cursor when no segment is left).
    durable: Position,
    /// Sum of the segments' lengths: what the bound is checked against.
    disk_bytes: u64,
    /// Frame bytes appended and not yet confirmed.
    unconfirmed_bytes: u64,
    /// Measurements appended and not yet confirmed.
    unconfirmed_records: u64,
    /// When the unconfirmed measurements were received, for
    /// `collector_spool_oldest_record_age_seconds`; see [`ReceivedTimes`].
    received: ReceivedTimes,
}

/// When the unconfirmed part of the spool was received, coarsely: entries `(end, t)` in spool
/// order, where `t` is the earliest `received_at` (Unix seconds) of the records after the
/// previous entry's end and before `end`. The times strictly increase, so the front holds the
/// oldest unconfirmed measurement; appends within one second share an entry, so a backlog
/// of N seconds takes at most N entries (a week: about 10 MiB), whatever the request rate.
/// Rebuilt at start from the records after the cursor, so the age is right after a restart.
#[derive(Debug, Default)]
struct ReceivedTimes(VecDeque<(Position, u32)>);

impl ReceivedTimes {
    /// Records ending at `end`, the earliest received at `t`, were appended.
    fn appended(&mut self, end: Position, t: u32) {
        // Entries at least as late as `t` fold into this one (its time is their minimum).
        while self.0.back().is_some_and(|&(_, last)| last >= t) {
            self.0.pop_back();
        }
        self.0.push_back((end, t));
    }

    /// Everything before `upto` is confirmed. An entry partly confirmed stays, so the age may
    /// read up to about a second high until its last record is confirmed.
    fn confirmed(&mut self, upto: Position) {
        while self.0.front().is_some_and(|&(end, _)| end <= upto) {
            self.0.pop_front();
        }
    }

    /// `received_at` of the oldest unconfirmed measurement, if any.
    fn oldest(&self) -> Option<u32> {
        self.0.front().map(|&(_, t)| t)
    }
}

struct Shared {
    dir: PathBuf,
    /// 32 lowercase hex digits; see the module doc.
    identity: String,
    max_bytes: u64,
    segment_target: u64,
    state: Mutex<State>,
    committed: watch::Sender<Position>,
    metrics: Arc<Metrics>,
    /// 0 while the spool can write; else why not ([`UNWRITABLE_DISK_FULL`] or
    /// [`UNWRITABLE_IO`]).
    unwritable: AtomicU8,
    _lock: File,
}

const UNWRITABLE_DISK_FULL: u8 = 1;
const UNWRITABLE_IO: u8 = 2;

impl Shared {
    fn segment_path(&self, n: u64) -> PathBuf {
        segment_path(&self.dir, n)
    }

    fn unwritable(&self) -> u8 {
        self.unwritable.load(Ordering::Acquire)
    }

    fn set_unwritable(&self, why: u8) {
        self.unwritable.store(why, Ordering::Release);
        self.metrics.spool_disk_full.set(i64::from(why != 0));
    }

    fn publish(&self, st: &State) {
        self.metrics.spool_bytes.set(st.unconfirmed_bytes as i64);
        self.metrics
            .spool_records
            .set(st.unconfirmed_records as i64);
        self.metrics.spool_disk_bytes.set(st.disk_bytes as i64);
        self.metrics.spool_max_bytes.set(self.max_bytes as i64);
        self.metrics
            .spool_oldest_received_at
            .store(st.received.oldest().map_or(0, i64::from), Ordering::Relaxed);
    }
}

/// The appending side, held by intake. Cheap to clone.
#[derive(Clone)]
pub struct Spool {
    shared: Arc<Shared>,
    appender: Arc<AppenderHandle>,
}

/// Owns the appender thread: when the last [`Spool`] goes, the queue closes, the thread
/// commits what is queued and is joined, so the spool's lock is released deterministically.
struct AppenderHandle {
    tx: Option<SyncSender<AppendRequest>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for AppenderHandle {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The reading side, held by the writer.
pub struct SpoolReader {
    shared: Arc<Shared>,
    pos: Position,
    /// End of the batch that was in flight when the spool was last closed, if it starts here.
    replay_bound: Option<Position>,
    committed: watch::Receiver<Position>,
    open: Option<(u64, File)>,
    cursor: Cursor,
    /// The in-flight file; `None` while it is missing and cannot be made.
    in_flight: Option<SlotFile>,
}

/// Records read from the spool, in order.
#[derive(Debug)]
pub struct Record {
    /// Position just after this record.
    pub end: Position,
    /// The measurements it holds.
    pub measurements: Vec<Measurement>,
    /// Its size on disk, frame included.
    pub bytes: u64,
}

fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join("segments").join(format!("{n:020}.seg"))
}

/// Opens (creating if needed) the spool in `dir`, recovers it, and starts the appender thread.
///
/// Recovery cuts torn tails, deletes confirmed segments, and leaves every unconfirmed record
/// for the reader, which starts at the cursor. Opening an existing spool needs no free space:
/// when no new segment can be made (a full disk), the spool opens unwritable (see the module
/// doc) and the reader still delivers what it holds.
pub fn open(
    dir: &Path,
    max_bytes: u64,
    metrics: Arc<Metrics>,
) -> Result<(Spool, SpoolReader), OpenError> {
    let err = |e| OpenError::Io(dir.to_owned(), e);
    fs::create_dir_all(dir.join("segments")).map_err(err)?;
    fs::create_dir_all(dir.join("kept-aside")).map_err(err)?;
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("LOCK"))
        .map_err(err)?;
    match lock.try_lock_exclusive() {
        Ok(true) => {}
        Ok(false) => return Err(OpenError::Locked(dir.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            return Err(OpenError::Locked(dir.to_owned()))
        }
        Err(e) => return Err(err(e)),
    }

    let (mut cursor_file, cursor) = Cursor::open(dir).map_err(err)?;
    let mut state = State::default();
    let mut numbers: Vec<u64> = fs::read_dir(dir.join("segments"))
        .map_err(err)?
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_suffix(".seg")?
                .parse()
                .ok()
        })
        .collect();
    numbers.sort_unstable();
    // Numbering goes on past every segment seen, even one deleted below, and past the cursor:
    // a new segment numbered like an earlier one would repeat positions, and with them the
    // insert tokens of batches already sent.
    let last_seen = numbers.last().copied().unwrap_or(0);
    let mut cursor = cursor;
    let mut rewritten = false;
    for n in numbers {
        let path = segment_path(dir, n);
        if n < cursor.segment {
            // Everything in it was confirmed by ClickHouse before the cursor moved past it.
            tracing::info!(segment = %path.display(), "spool: deleting a confirmed segment");
            fs::remove_file(&path).map_err(err)?;
            continue;
        }
        let Some(recovered) = recover_segment(
            dir,
            n,
            &mut cursor,
            &mut cursor_file,
            &metrics,
            &mut state.received,
        )
        .map_err(err)?
        else {
            continue;
        };
        rewritten |= recovered.rewritten;
        state.segments.insert(n, recovered.len);
        state.disk_bytes += recovered.len;
        state.unconfirmed_bytes += recovered.bytes_after;
        state.unconfirmed_records += recovered.records_after;
    }
    if !state.segments.is_empty() {
        tracing::info!(
            segments = state.segments.len(),
            records = state.unconfirmed_records,
            bytes = state.unconfirmed_bytes,
            "spool: replaying what ClickHouse has not confirmed"
        );
    }

    let identity = identity(dir, rewritten).map_err(err)?;
    let (in_flight_file, in_flight) = match SlotFile::open(dir, INFLIGHT_FILE) {
        Ok((file, body)) => (Some(file), body),
        Err(e) => {
            tracing::debug!(error = %e, "spool: no in-flight file yet");
            (None, None)
        }
    };
    let replay_bound = in_flight.and_then(|body| parse_in_flight(&body, &identity));

    // The last segment made: the appender starts sealed on it and makes the next one below
    // (or, if it cannot, stays unwritable while the reader delivers what is here).
    let active = last_seen.max(cursor.segment);
    let active_len = state.segments.get(&active).copied().unwrap_or(HEADER_LEN);
    state.active = active;
    state.sealed = true;
    state.durable = cursor_file.durable;

    let start = match state.segments.range(cursor.segment..).next() {
        Some((&n, _)) if n == cursor.segment => Position {
            segment: n,
            offset: cursor.offset.max(HEADER_LEN),
        },
        Some((&n, _)) => Position {
            segment: n,
            offset: HEADER_LEN,
        },
        // Nothing to replay: reading starts in the segment the appender makes next.
        None => Position {
            segment: active + 1,
            offset: HEADER_LEN,
        },
    };
    let (committed, committed_rx) = watch::channel(Position {
        segment: active,
        offset: active_len,
    });
    // Only a bound that recovery left reachable: it starts where reading starts and ends on
    // a record boundary inside what was kept.
    let replay_bound = replay_bound
        .filter(|(from, to)| {
            *from == start
                && to > from
                && state
                    .segments
                    .get(&to.segment)
                    .is_some_and(|&len| to.offset <= len)
        })
        .map(|(_, to)| to);
    let shared = Arc::new(Shared {
        dir: dir.to_owned(),
        identity,
        max_bytes,
        segment_target: (max_bytes / 8).clamp(SEGMENT_MIN_BYTES, SEGMENT_TARGET_BYTES),
        state: Mutex::new(state),
        committed,
        metrics,
        unwritable: AtomicU8::new(0),
        _lock: lock,
    });
    shared.set_unwritable(0);
    shared.publish(&shared.state.lock().unwrap());

    let mut appender = Appender {
        shared: shared.clone(),
        file: None,
        size: active_len,
        last_probe: Instant::now(),
        unwritable_since: None,
    };
    // A fresh segment with room reserved; on a full disk the spool opens unwritable.
    if let Err(e) = appender.resume() {
        appender.enter_unwritable(&e, "cannot start a segment at open");
    }
    let (tx, rx) = mpsc::sync_channel(APPEND_QUEUE);
    let thread = std::thread::Builder::new()
        .name("spool-appender".into())
        .spawn(move || appender.run(rx))
        .map_err(err)?;
    let appender = Arc::new(AppenderHandle {
        tx: Some(tx),
        thread: Some(thread),
    });

    let reader = SpoolReader {
        shared: shared.clone(),
        pos: start,
        replay_bound,
        committed: committed_rx,
        open: None,
        cursor: cursor_file,
        in_flight: in_flight_file,
    };
    Ok((Spool { shared, appender }, reader))
}

/// The spool's identity: read from [`IDENTITY_FILE`], or made (a UUID v4) and stored durably
/// when the file is missing or unreadable, or when `renew` (recovery rewrote a segment, so
/// ranges of earlier tokens may now hold other records).
///
/// Only made at open. When a new identity cannot be stored (a full disk), it is used in memory
/// all the same, which is safe: the next start makes another, never an earlier one (a stale
/// file is removed first, since removing needs no space).
fn identity(dir: &Path, renew: bool) -> io::Result<String> {
    let path = dir.join(IDENTITY_FILE);
    if !renew {
        match fs::read_to_string(&path) {
            Ok(text) if is_identity(text.trim()) => return Ok(text.trim().to_owned()),
            Ok(_) => {
                tracing::warn!(file = %path.display(), "spool: unreadable identity; making a new one")
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    let id = uuid::Uuid::new_v4().simple().to_string();
    let stored = (|| {
        let tmp = dir.join("IDENTITY.tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(format!("{id}\n").as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        File::open(dir)?.sync_all()
    })();
    if let Err(e) = stored {
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(gone) if gone.kind() == io::ErrorKind::NotFound => {}
            // Neither stored nor removed: the old identity would come back with moved ranges.
            Err(_) => return Err(e),
        }
        let _ = fs::remove_file(dir.join("IDENTITY.tmp"));
        tracing::warn!(error = %e, "spool: cannot store the spool identity; using it unstored (the next start makes a new one)");
    }
    Ok(id)
}

fn is_identity(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The range in an [`INFLIGHT_FILE`] body, if it was written by a spool of this identity.
fn parse_in_flight(body: &str, identity: &str) -> Option<(Position, Position)> {
    let mut parts = body.split_whitespace();
    if parts.next()? != identity {
        return None;
    }
    let mut n = || parts.next()?.parse::<u64>().ok();
    let (a, b, c, d) = (n()?, n()?, n()?, n()?);
    Some((
        Position {
            segment: a,
            offset: b,
        },
        Position {
            segment: c,
            offset: d,
        },
    ))
}

/// A [`CURSOR_FILE`] body: `<segment> <offset>`.
fn parse_cursor(body: &str) -> Option<Position> {
    let mut parts = body.split_whitespace().map(str::parse::<u64>);
    match (parts.next(), parts.next()) {
        (Some(Ok(segment)), Some(Ok(offset))) => Some(Position { segment, offset }),
        _ => None,
    }
}

/// A small file of the spool rewritten in place (see the module doc): two fixed slots written
/// in turn, each `<seq> <body> <crc32c of "<seq> <body>", 8 hex digits>` padded with spaces to
/// [`SLOT_BYTES`] and ended by a newline. Made in full once, so a rewrite needs no free space
/// (the blocks or pages are already allocated) and no rename.
struct SlotFile {
    file: File,
    /// Sequence number of the newest valid slot (0 when none).
    seq: u64,
}

impl SlotFile {
    /// Opens `dir/name` as it is when it exists (needing no space) and returns the body of its
    /// newest valid slot (or, for a file of the earlier one-line format, its first line); makes
    /// it when it is missing (which needs space).
    fn open(dir: &Path, name: &str) -> io::Result<(SlotFile, Option<String>)> {
        let path = dir.join(name);
        match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(mut file) => {
                let mut data = Vec::new();
                io::Read::read_to_end(&mut file, &mut data)?;
                let (seq, body) = if data.len() == 2 * SLOT_BYTES {
                    parse_slots(&data).map_or((0, None), |(seq, body)| (seq, Some(body)))
                } else {
                    // The one-line format of earlier versions, written by rename (never torn).
                    let text = String::from_utf8_lossy(&data);
                    (0, text.lines().next().map(|l| l.trim().to_owned()))
                };
                Ok((SlotFile { file, seq }, body))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let tmp = dir.join(format!("{name}.tmp"));
                let made = (|| {
                    let mut file = OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .open(&tmp)?;
                    // Written bytes, not a sparse hole: a rewrite must find its blocks there.
                    let mut data = vec![b' '; 2 * SLOT_BYTES];
                    data[SLOT_BYTES - 1] = b'\n';
                    data[2 * SLOT_BYTES - 1] = b'\n';
                    file.write_all(&data)?;
                    file.sync_all()?;
                    fs::rename(&tmp, &path)?;
                    File::open(dir)?.sync_all()?;
                    Ok(SlotFile { file, seq: 0 })
                })();
                if made.is_err() {
                    let _ = fs::remove_file(&tmp);
                }
                made.map(|f| (f, None))
            }
            Err(e) => Err(e),
        }
    }

    /// Writes `body` (one line, at most about 200 bytes) into the older slot, then
    /// `fdatasync`s when `sync`.
    fn write(&mut self, body: &str, sync: bool) -> io::Result<()> {
        let seq = self.seq + 1;
        let slot = slot_line(seq, body);
        let at = (seq % 2) * SLOT_BYTES as u64;
        self.file.write_all_at(&slot, at)?;
        if sync {
            self.file.sync_data()?;
        }
        self.seq = seq;
        Ok(())
    }
}

fn slot_line(seq: u64, body: &str) -> Vec<u8> {
    let text = format!("{seq} {body}");
    let mut line = format!("{text} {:08x}", crc32c::crc32c(text.as_bytes())).into_bytes();
    assert!(line.len() < SLOT_BYTES, "slot body too long: {body:?}");
    line.resize(SLOT_BYTES - 1, b' ');
    line.push(b'\n');
    line
}

/// The newest valid slot of a slot file's bytes: its sequence number and body.
fn parse_slots(data: &[u8]) -> Option<(u64, String)> {
    data.chunks(SLOT_BYTES)
        .filter_map(|slot| {
            let text = std::str::from_utf8(slot).ok()?.trim_end();
            let (covered, crc) = text.rsplit_once(' ')?;
            if u32::from_str_radix(crc, 16).ok()? != crc32c::crc32c(covered.as_bytes()) {
                return None;
            }
            let (seq, body) = covered.split_once(' ')?;
            Some((seq.parse().ok()?, body.to_owned()))
        })
        .max_by_key(|(seq, _)| *seq)
}

/// The cursor file and the position it durably holds.
struct Cursor {
    dir: PathBuf,
    /// `None` while the file is missing and cannot be made (a full disk at a spool's first
    /// start): made at the next [`Cursor::persist`].
    file: Option<SlotFile>,
    /// What the file holds, synced (the default position when nothing was recorded yet).
    durable: Position,
}

impl Cursor {
    /// Opens (or makes) the cursor file; returns it and the position it holds. A cursor file
    /// that cannot be read or made counts as none (everything is replayed; storage folds it)
    /// and is tried again at the next [`Cursor::persist`].
    fn open(dir: &Path) -> io::Result<(Cursor, Position)> {
        let (file, at) = match SlotFile::open(dir, CURSOR_FILE) {
            Ok((file, body)) => (Some(file), body.as_deref().and_then(parse_cursor)),
            Err(e) => {
                if !is_no_space(&e) {
                    tracing::warn!(error = %e, "spool: cannot open the cursor file; replaying from the first segment");
                }
                (None, None)
            }
        };
        let at = at.unwrap_or_default();
        let cursor = Cursor {
            dir: dir.to_owned(),
            file,
            durable: at,
        };
        Ok((cursor, at))
    }

    /// Records `at` durably (in place: needs no free space once the file exists).
    fn persist(&mut self, at: Position) -> io::Result<()> {
        if self.file.is_none() {
            self.file = Some(SlotFile::open(&self.dir, CURSOR_FILE)?.0);
        }
        let file = self.file.as_mut().expect("just made");
        file.write(&format!("{} {}", at.segment, at.offset), true)?;
        self.durable = at;
        Ok(())
    }
}

/// Whether `e` means no space is left for this process: a full filesystem or a quota.
fn is_no_space(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}

/// Spool folders whose writes fail with `ENOSPC`, for unit tests of the full disk.
#[cfg(test)]
static FULL_DISKS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// `Err(ENOSPC)` when a unit test made `dir` full.
fn fault(dir: &Path) -> io::Result<()> {
    #[cfg(test)]
    if FULL_DISKS
        .lock()
        .unwrap()
        .iter()
        .any(|d| dir.starts_with(d))
    {
        return Err(io::Error::from(io::ErrorKind::StorageFull));
    }
    let _ = dir;
    Ok(())
}

fn create_segment(dir: &Path, n: u64) -> io::Result<File> {
    let path = segment_path(dir, n);
    let mut f = OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(&path)?;
    // A segment that was made but could not be written is removed, so that the next attempt
    // can make it again.
    let written = fault(dir)
        .and_then(|()| f.write_all(MAGIC))
        .and_then(|()| f.sync_all())
        .and_then(|()| File::open(dir.join("segments"))?.sync_all());
    if let Err(e) = written {
        drop(f);
        let _ = fs::remove_file(&path);
        return Err(e);
    }
    Ok(f)
}

/// What recovery kept of one segment.
struct Recovered {
    /// Length of the segment after recovery.
    len: u64,
    /// Measurements at or after the cursor.
    records_after: u64,
    /// Frame bytes at or after the cursor.
    bytes_after: u64,
    /// Whether the segment was rewritten without damaged records (positions moved).
    rewritten: bool,
}

/// Checks segment `n` frame by frame and repairs it so that it holds only whole, checksummed
/// records; returns `None` when nothing of it is left (it is then removed).
///
/// - A record cut short at the end (a torn write) is cut off.
/// - A damaged record in the middle is skipped: the scan resynchronises on the next offset
///   that holds a whole, checksummed record, the original file is copied to
///   `kept-aside/damaged-<n>.seg` for inspection, and the segment is rewritten without the
///   damage (the cursor is moved to the same record in the rewritten file).
/// - A damaged magic does not lose the records after it: they carry their own checksums.
fn recover_segment(
    dir: &Path,
    n: u64,
    cursor: &mut Position,
    cursor_file: &mut Cursor,
    metrics: &Metrics,
    received: &mut ReceivedTimes,
) -> io::Result<Option<Recovered>> {
    let path = segment_path(dir, n);
    let data = fs::read(&path)?;
    if data.len() <= MAGIC.len() {
        // Just the magic is an empty segment, what a clean stop leaves: normal. Less than the
        // magic is a torn segment start.
        if data.len() == MAGIC.len() {
            tracing::debug!(segment = %path.display(), "spool: removing an empty segment");
        } else if !data.is_empty() {
            tracing::warn!(segment = %path.display(), bytes = data.len(), "spool: removing a segment too short to hold a record");
        }
        fs::remove_file(&path)?;
        return Ok(None);
    }
    if &data[..MAGIC.len()] != MAGIC {
        tracing::error!(segment = %path.display(), "spool: damaged segment header; reading its records anyway");
    }
    // Whole records as (start, end) offsets, skipping damage.
    let mut frames = Vec::new();
    let (mut off, mut skipped) = (HEADER_LEN as usize, 0usize);
    while off < data.len() {
        if let Some((_, next)) = frame_at(&data, off) {
            frames.push((off, next));
            off = next;
            continue;
        }
        match (off + 1..data.len()).find(|&p| frame_at(&data, p).is_some()) {
            Some(p) => {
                skipped += p - off;
                off = p;
            }
            None => break,
        }
    }
    let valid_end = frames.last().map_or(HEADER_LEN as usize, |f| f.1);
    let cut = data.len() - valid_end;
    let mut result = if skipped > 0 || &data[..MAGIC.len()] != MAGIC {
        let aside = dir.join("kept-aside").join(format!("damaged-{n:020}.seg"));
        fs::write(&aside, &data)?;
        tracing::error!(segment = %path.display(), skipped_bytes = skipped, kept = %aside.display(), "spool: skipped damaged records; the original is kept aside");
        metrics.spool_damaged_bytes.inc_by((skipped + cut) as u64);
        // Rewrite with the whole records only, remapping the cursor if it points in here.
        let mut out = Vec::with_capacity(data.len());
        out.extend_from_slice(MAGIC);
        let mut new_cursor = None;
        for &(start, end) in &frames {
            if n == cursor.segment && new_cursor.is_none() && start as u64 >= cursor.offset {
                new_cursor = Some(out.len() as u64);
            }
            out.extend_from_slice(&data[start..end]);
        }
        if n == cursor.segment {
            cursor.offset = new_cursor.unwrap_or(out.len() as u64);
            cursor_file.persist(*cursor)?;
        }
        let tmp = path.with_extension("seg.tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(&out)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        File::open(dir.join("segments"))?.sync_all()?;
        Recovered {
            len: out.len() as u64,
            records_after: 0,
            bytes_after: 0,
            rewritten: true,
        }
    } else {
        if cut > 0 {
            tracing::warn!(segment = %path.display(), cut_bytes = cut, "spool: cut a torn or corrupt tail");
            metrics.spool_damaged_bytes.inc_by(cut as u64);
            let f = OpenOptions::new().write(true).open(&path)?;
            f.set_len(valid_end as u64)?;
            f.sync_all()?;
        }
        Recovered {
            len: valid_end as u64,
            records_after: 0,
            bytes_after: 0,
            rewritten: false,
        }
    };
    // Count what is still to be written, in the (possibly rewritten) file.
    let data = if result.len as usize == valid_end && skipped == 0 {
        data
    } else {
        fs::read(&path)?
    };
    let mut off = HEADER_LEN as usize;
    while let Some((payload, next)) = frame_at(&data, off) {
        if (Position {
            segment: n,
            offset: off as u64,
        }) >= *cursor
        {
            let (count, earliest) = scan_measurements(payload);
            result.records_after += count;
            result.bytes_after += (next - off) as u64;
            if let Some(t) = earliest {
                let end = Position {
                    segment: n,
                    offset: next as u64,
                };
                received.appended(end, t);
            }
        }
        off = next;
    }
    Ok(Some(result))
}

/// The payload of the whole, checksummed record at `off`, and the offset after it.
fn frame_at(data: &[u8], off: usize) -> Option<(&[u8], usize)> {
    let header = data.get(off..off + FRAME_LEN as usize)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?);
    let crc = u32::from_le_bytes(header[4..].try_into().ok()?);
    if len == 0 || len > MAX_RECORD_BYTES {
        return None;
    }
    let start = off + FRAME_LEN as usize;
    let payload = data.get(start..start + len as usize)?;
    // Every payload is a JSON array: a cheap check before the checksum, which keeps the
    // resynchronising scan of a damaged segment fast.
    if payload.first() != Some(&b'[') {
        return None;
    }
    (crc32c::crc32c(payload) == crc).then_some((payload, start + len as usize))
}

/// The number of measurements in a record's payload and the earliest `received_at` among
/// them (0 and `None` for a payload that is not an array of measurements).
fn scan_measurements(payload: &[u8]) -> (u64, Option<u32>) {
    #[derive(serde::Deserialize)]
    struct ReceivedAt {
        received_at: u32,
    }
    serde_json::from_slice::<Vec<ReceivedAt>>(payload).map_or((0, None), |v| {
        (v.len() as u64, v.iter().map(|m| m.received_at).min())
    })
}

fn frame(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

struct Appender {
    shared: Arc<Shared>,
    /// The active segment, open for appending; `None` while sealed (see [`State::sealed`]).
    file: Option<File>,
    /// Length of the active segment.
    size: u64,
    /// When the appender last tried to leave the unwritable state.
    last_probe: Instant,
    /// Since when the spool has been unwritable.
    unwritable_since: Option<Instant>,
}

impl Appender {
    fn run(mut self, rx: Receiver<AppendRequest>) {
        let mut buf = Vec::with_capacity(1 << 20);
        let mut group = Vec::with_capacity(256);
        loop {
            // While unwritable, wake up every probe interval to try again: no request may come
            // (load balancers follow /readyz), and readiness must return by itself.
            let first = if self.unwritable_since.is_some() {
                match rx.recv_timeout(PROBE_INTERVAL) {
                    Ok(req) => Some(req),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match rx.recv() {
                    Ok(req) => Some(req),
                    Err(_) => break,
                }
            };
            if self.unwritable_since.is_some() && self.last_probe.elapsed() >= PROBE_INTERVAL {
                self.probe();
            }
            let Some(first) = first else { continue };
            group.push(first);
            let mut bytes = group[0].payload.len();
            while bytes < GROUP_MAX_BYTES {
                match rx.try_recv() {
                    Ok(req) => {
                        bytes += req.payload.len();
                        group.push(req);
                    }
                    Err(_) => break,
                }
            }
            self.commit_group(&mut group, &mut buf);
            group.clear();
            buf.clear();
        }
        tracing::debug!("spool: appender stopped");
    }

    /// The error an append gets while the spool is unwritable.
    fn refusal(&self) -> AppendError {
        match self.shared.unwritable() {
            UNWRITABLE_DISK_FULL => AppendError::DiskFull,
            _ => AppendError::Io,
        }
    }

    fn commit_group(&mut self, group: &mut Vec<AppendRequest>, buf: &mut Vec<u8>) {
        if self.unwritable_since.is_some() {
            let refusal = self.refusal();
            for req in group.drain(..) {
                let _ = req.ack.send(Err(refusal));
            }
            return;
        }
        if self.file.is_none() || self.size >= self.shared.segment_target {
            if let Err(e) = self.rotate() {
                // No new segment: the full one takes no more either.
                self.seal();
                self.enter_unwritable(&e, "cannot start a new segment");
                let refusal = self.refusal();
                for req in group.drain(..) {
                    let _ = req.ack.send(Err(refusal));
                }
                return;
            }
        }
        let held = self.shared.state.lock().unwrap().unconfirmed_bytes;
        let mut accepted = Vec::with_capacity(group.len());
        let mut records = 0;
        let mut earliest: Option<u32> = None;
        for req in group.drain(..) {
            let framed = FRAME_LEN + req.payload.len() as u64;
            if held + buf.len() as u64 + framed > self.shared.max_bytes {
                let _ = req.ack.send(Err(AppendError::Full));
                continue;
            }
            frame(buf, &req.payload);
            records += req.records;
            earliest = match (earliest, req.received_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            accepted.push(req.ack);
        }
        if accepted.is_empty() {
            return;
        }
        let file = self.file.as_mut().expect("rotated above");
        let result = fault(&self.shared.dir)
            .and_then(|()| file.write_all(buf))
            .and_then(|()| file.sync_data());
        match result {
            Ok(()) => {
                self.size += buf.len() as u64;
                {
                    let mut st = self.shared.state.lock().unwrap();
                    let active = st.active;
                    st.segments.insert(active, self.size);
                    st.disk_bytes += buf.len() as u64;
                    st.unconfirmed_bytes += buf.len() as u64;
                    st.unconfirmed_records += records;
                    if let Some(t) = earliest {
                        let end = Position {
                            segment: active,
                            offset: self.size,
                        };
                        st.received.appended(end, t);
                    }
                    self.shared.publish(&st);
                }
                let active = self.shared.state.lock().unwrap().active;
                self.shared.committed.send_replace(Position {
                    segment: active,
                    offset: self.size,
                });
                for ack in accepted {
                    let _ = ack.send(Ok(()));
                }
            }
            Err(e) => {
                // Back to the last durable length; after a failed sync the page cache cannot
                // be trusted, so this segment takes no more and the next write starts a new one.
                let _ = file.set_len(self.size);
                self.seal();
                self.enter_unwritable(&e, "write or sync failed");
                let refusal = self.refusal();
                for ack in accepted {
                    let _ = ack.send(Err(refusal));
                }
            }
        }
    }

    /// Closes the active segment for good: it is deleted once confirmed, even if no new one
    /// can be made (see [`State::sealed`]).
    fn seal(&mut self) {
        self.file = None;
        self.shared.state.lock().unwrap().sealed = true;
    }

    /// Turns the spool unwritable (appends refused, `/readyz` 503) after `e`; one warning.
    fn enter_unwritable(&mut self, e: &io::Error, what: &str) {
        let why = if is_no_space(e) {
            UNWRITABLE_DISK_FULL
        } else {
            UNWRITABLE_IO
        };
        self.last_probe = Instant::now();
        if self.unwritable_since.is_some() {
            self.shared.set_unwritable(why);
            return;
        }
        self.unwritable_since = Some(Instant::now());
        self.shared.set_unwritable(why);
        let error = crate::logging::chain(e);
        let dir = self.shared.dir.display();
        crate::logging::warn_limited(
            "spool_unwritable",
            || tracing::warn!(%error, spool = %dir, "spool: {what}; intake and /readyz answer 503 until it can write again (free space on the spool's filesystem, or let the spool drain to ClickHouse)"),
        );
    }

    /// One attempt to leave the unwritable state.
    fn probe(&mut self) {
        match self.resume() {
            Ok(()) => {
                let since = self.unwritable_since.take();
                self.shared.set_unwritable(0);
                let dir = self.shared.dir.display();
                let after = since.map(|t| t.elapsed()).unwrap_or_default();
                crate::logging::warn_limited(
                    "spool_writable",
                    || tracing::info!(spool = %dir, after = ?after, "spool: writing again; intake and /readyz accept traffic"),
                );
            }
            Err(e) => {
                // Stays unwritable; the reason may have changed (space back, another error).
                self.enter_unwritable(&e, "still cannot write");
            }
        }
    }

    /// Makes the spool writable: a new segment if the active one is sealed, and
    /// [`RESUME_ROOM_BYTES`] reserved after its end, so that a disk with a few KiB free does
    /// not count as writable.
    fn resume(&mut self) -> io::Result<()> {
        self.last_probe = Instant::now();
        if self.file.is_none() {
            self.delete_confirmed_active();
            self.rotate()?;
        }
        let file = self.file.as_ref().expect("rotated above");
        fault(&self.shared.dir)?;
        match rustix::fs::fallocate(
            file,
            rustix::fs::FallocateFlags::KEEP_SIZE,
            self.size,
            RESUME_ROOM_BYTES,
        ) {
            Ok(()) => Ok(()),
            // A filesystem without fallocate: the new segment's header was written, take that.
            Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the sealed active segment if the durable cursor has passed it: on a full disk
    /// its confirmed records may be what holds the space a new segment needs.
    fn delete_confirmed_active(&mut self) {
        let mut st = self.shared.state.lock().unwrap();
        let active = st.active;
        let Some(&len) = st.segments.get(&active) else {
            return;
        };
        let end = Position {
            segment: active,
            offset: len,
        };
        if !st.sealed || st.durable < end {
            return;
        }
        match fs::remove_file(self.shared.segment_path(active)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::debug!(segment = active, error = %e, "spool: cannot delete a confirmed segment");
                return;
            }
        }
        st.segments.remove(&active);
        st.disk_bytes -= len;
        self.shared.publish(&st);
    }

    fn rotate(&mut self) -> io::Result<()> {
        let next = self.shared.state.lock().unwrap().active + 1;
        let file = create_segment(&self.shared.dir, next)?;
        {
            let mut st = self.shared.state.lock().unwrap();
            st.segments.insert(next, HEADER_LEN);
            st.disk_bytes += HEADER_LEN;
            st.active = next;
            st.sealed = false;
            self.shared.publish(&st);
        }
        self.file = Some(file);
        self.size = HEADER_LEN;
        self.shared.committed.send_replace(Position {
            segment: next,
            offset: HEADER_LEN,
        });
        Ok(())
    }
}

impl Spool {
    /// Appends one request's measurements and waits until they are durable, at most `limit`.
    ///
    /// Errors: [`AppendError::Full`] at the bound, [`AppendError::Overloaded`] when the queue
    /// is full or the sync takes longer than `limit`, [`AppendError::Io`] on a disk error.
    /// After `Overloaded` from a timeout the data may still become durable; a client retry is
    /// then folded as a duplicate.
    pub async fn append(
        &self,
        measurements: &[Measurement],
        limit: Duration,
    ) -> Result<(), AppendError> {
        let payload = serde_json::to_vec(measurements).map_err(|_| AppendError::Io)?;
        let (ack, done) = oneshot::channel();
        let req = AppendRequest {
            payload,
            records: measurements.len() as u64,
            received_at: measurements.iter().map(|m| m.received_at).min(),
            ack,
        };
        match self
            .appender
            .tx
            .as_ref()
            .expect("open until dropped")
            .try_send(req)
        {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(AppendError::Overloaded),
            Err(TrySendError::Disconnected(_)) => return Err(AppendError::Io),
        }
        match tokio::time::timeout(limit, done).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(AppendError::Io),
            Err(_) => Err(AppendError::Overloaded),
        }
    }

    /// Whether the spool has room for at least `headroom` more unconfirmed bytes.
    pub fn has_room(&self, headroom: u64) -> bool {
        self.shared.state.lock().unwrap().unconfirmed_bytes + headroom <= self.shared.max_bytes
    }

    /// Why the spool cannot write now (see the module doc), or `None` while it can: the text
    /// `/readyz` answers with.
    pub fn unwritable(&self) -> Option<&'static str> {
        match self.shared.unwritable() {
            0 => None,
            UNWRITABLE_DISK_FULL => Some("spool cannot write: disk full"),
            _ => Some("spool cannot write: write error (the log names it)"),
        }
    }

    /// The spool's bound in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.shared.max_bytes
    }

    /// The spool folder.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }
}

impl SpoolReader {
    /// Position of the next record to read.
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

    /// Reads durable records in order until about `max_bytes` are read or none is left.
    /// Blocking file I/O from the page cache; call it from a blocking context.
    pub fn read_available(&mut self, max_bytes: u64, out: &mut Vec<Record>) {
        let mut read = 0;
        while read < max_bytes {
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
                let st = self.shared.state.lock().unwrap();
                match st.segments.get(&self.pos.segment) {
                    Some(&len) => len,
                    None => {
                        // The segment is gone or never existed: go on with the next one.
                        let next = st
                            .segments
                            .range(self.pos.segment + 1..)
                            .next()
                            .map(|(&n, _)| n);
                        drop(st);
                        match next {
                            Some(n) => {
                                self.pos = Position {
                                    segment: n,
                                    offset: HEADER_LEN,
                                }
                            }
                            None => return,
                        }
                        continue;
                    }
                }
            };
            if self.pos.offset >= end {
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
                        continue;
                    }
                    None => return,
                }
            }
            match self.read_record(end) {
                Ok(record) => {
                    read += record.bytes;
                    self.pos = record.end;
                    out.push(record);
                }
                Err(e) => {
                    // Checked at start and written by us since; only a disk fault gets here.
                    tracing::error!(segment = self.pos.segment, offset = self.pos.offset, error = %e, "spool: unreadable record; skipping the rest of the segment");
                    self.pos.offset = end;
                }
            }
        }
    }

    fn read_record(&mut self, end: u64) -> io::Result<Record> {
        if self.open.as_ref().map(|(n, _)| *n) != Some(self.pos.segment) {
            self.open = Some((
                self.pos.segment,
                File::open(self.shared.segment_path(self.pos.segment))?,
            ));
        }
        let file = &self.open.as_ref().expect("just opened").1;
        let mut header = [0u8; FRAME_LEN as usize];
        file.read_exact_at(&mut header, self.pos.offset)?;
        let len = u32::from_le_bytes(header[..4].try_into().unwrap());
        let crc = u32::from_le_bytes(header[4..].try_into().unwrap());
        let next = self.pos.offset + FRAME_LEN + len as u64;
        if len == 0 || len > MAX_RECORD_BYTES || next > end {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bad record length",
            ));
        }
        let mut payload = vec![0u8; len as usize];
        file.read_exact_at(&mut payload, self.pos.offset + FRAME_LEN)?;
        if crc32c::crc32c(&payload) != crc {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "checksum mismatch",
            ));
        }
        let measurements = serde_json::from_slice(&payload)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(Record {
            end: Position {
                segment: self.pos.segment,
                offset: next,
            },
            measurements,
            bytes: next - self.pos.offset,
        })
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
    /// too when `with_sealed` and it is sealed; whether any was deleted.
    fn delete_confirmed(&mut self, upto: Position, with_sealed: bool) -> bool {
        let mut st = self.shared.state.lock().unwrap();
        let (active, sealed) = (st.active, st.sealed);
        let done: Vec<(u64, u64)> = st
            .segments
            .iter()
            .filter(|(&n, &len)| {
                n < upto.segment
                    || (n == upto.segment
                        && upto.offset >= len
                        && (n != active || (with_sealed && sealed)))
            })
            .map(|(&n, &len)| (n, len))
            .collect();
        let mut deleted = false;
        for (n, len) in done {
            if self.open.as_ref().is_some_and(|(o, _)| *o == n) {
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
            st.segments.remove(&n);
            st.disk_bytes -= len;
            deleted = true;
        }
        self.shared.publish(&st);
        deleted
    }

    /// Writes a batch ClickHouse refused as bad data to `kept-aside/` for inspection.
    /// Returns the file written.
    pub fn keep_aside(
        &self,
        start: Position,
        measurements: &[Measurement],
        reason: &str,
    ) -> io::Result<PathBuf> {
        let path = self
            .shared
            .dir
            .join("kept-aside")
            .join(format!("{:020}-{:012}.json", start.segment, start.offset));
        let body = serde_json::json!({ "reason": reason, "measurements": measurements });
        let mut f = File::create(&path)?;
        f.write_all(
            serde_json::to_string_pretty(&body)
                .unwrap_or_default()
                .as_bytes(),
        )?;
        f.sync_all()?;
        self.shared
            .metrics
            .kept_aside_rows
            .inc_by(measurements.len() as u64);
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn m(n: u128) -> Measurement {
        Measurement {
            id: Uuid::from_u128(n),
            site: "s".into(),
            received_at: 1,
            url: "https://a.b/".into(),
            ts: None,
            referrer: None,
            navigation_type: None,
            ttfb_ms: Some(n as f64),
            fcp_ms: None,
            lcp_ms: None,
            inp_ms: None,
            dom_content_loaded_ms: None,
            load_ms: None,
            cls: None,
            viewport_width: None,
            effective_connection_type: None,
            user_agent: String::new(),
            sample_rate: 1.0,
        }
    }

    fn ids(records: &[Record]) -> Vec<u128> {
        records
            .iter()
            .flat_map(|r| r.measurements.iter().map(|m| m.id.as_u128()))
            .collect()
    }

    fn read_all(r: &mut SpoolReader) -> Vec<Record> {
        let mut out = Vec::new();
        r.read_available(u64::MAX, &mut out);
        out
    }

    #[tokio::test]
    async fn append_read_confirm_and_replay() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        {
            let (spool, mut reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
            spool
                .append(&[m(1), m(2)], Duration::from_secs(5))
                .await
                .unwrap();
            spool.append(&[m(3)], Duration::from_secs(5)).await.unwrap();
            let recs = read_all(&mut reader);
            assert_eq!(ids(&recs), [1, 2, 3]);
            assert_eq!(metrics.spool_records.get(), 3);
            reader.confirm(recs[0].end, 2, recs[0].bytes);
            assert_eq!(metrics.spool_records.get(), 1);
        }
        // Reopen: only the unconfirmed record comes back.
        let (_spool, mut reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
        assert_eq!(ids(&read_all(&mut reader)), [3]);
        assert_eq!(metrics.spool_records.get(), 1);
    }

    #[tokio::test]
    async fn torn_tail_is_cut_to_the_last_whole_record() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        {
            let (spool, _reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
            for n in 1..=3 {
                spool.append(&[m(n)], Duration::from_secs(5)).await.unwrap();
            }
        }
        let seg = segment_path(dir.path(), 1);
        let len = fs::metadata(&seg).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&seg)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let (_spool, mut reader) = open(dir.path(), 1 << 20, metrics).unwrap();
        assert_eq!(ids(&read_all(&mut reader)), [1, 2]);
        assert!(
            fs::metadata(&seg).unwrap().len() < len - 5,
            "the torn record was cut off"
        );
    }

    #[tokio::test]
    async fn corrupt_record_ends_the_segment() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        {
            let (spool, _reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
            for n in 1..=3 {
                spool.append(&[m(n)], Duration::from_secs(5)).await.unwrap();
            }
        }
        let seg = segment_path(dir.path(), 1);
        let mut data = fs::read(&seg).unwrap();
        let last = data.len() - 3;
        data[last] ^= 0xff;
        fs::write(&seg, data).unwrap();
        let (_spool, mut reader) = open(dir.path(), 1 << 20, metrics).unwrap();
        assert_eq!(ids(&read_all(&mut reader)), [1, 2]);
    }

    #[tokio::test]
    async fn full_spool_refuses_and_keeps_what_it_has() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let (spool, mut reader) = open(dir.path(), 2048, metrics).unwrap();
        let mut ok = 0;
        let mut full = false;
        for n in 0..100 {
            match spool.append(&[m(n)], Duration::from_secs(5)).await {
                Ok(()) => ok += 1,
                Err(AppendError::Full) => {
                    full = true;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(full && ok > 0);
        assert!(!spool.has_room(400));
        let recs = read_all(&mut reader);
        assert_eq!(recs.len(), ok);
        let (end, bytes) = (recs.last().unwrap().end, recs.iter().map(|r| r.bytes).sum());
        reader.confirm(end, ok as u64, bytes);
        // Confirming frees the bound: the spool accepts again (the confirmed bytes may stay
        // on disk in the active segment, but they no longer count against the bound).
        assert!(spool.has_room(400), "confirmed records still count");
        spool
            .append(&[m(1000)], Duration::from_secs(5))
            .await
            .expect("an append after confirming everything");
        let after = read_all(&mut reader);
        assert_eq!(after.len(), 1);
        assert_eq!(after[0].measurements, [m(1000)]);
    }

    #[tokio::test]
    async fn segments_rotate_and_confirmed_ones_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let (spool, mut reader) = open(dir.path(), 1 << 30, metrics.clone()).unwrap();
        let big: Vec<Measurement> = (0..50)
            .map(|n| Measurement {
                user_agent: "x".repeat(8000),
                ..m(n)
            })
            .collect();
        let mut appended = 0;
        assert_eq!(spool.shared.segment_target, SEGMENT_TARGET_BYTES);
        while spool.shared.state.lock().unwrap().active == 1 {
            spool.append(&big, Duration::from_secs(5)).await.unwrap();
            appended += 1;
        }
        spool.append(&big, Duration::from_secs(5)).await.unwrap();
        let recs = read_all(&mut reader);
        assert_eq!(recs.len(), appended + 1);
        let bytes = recs.iter().map(|r| r.bytes).sum();
        reader.confirm(recs.last().unwrap().end, 50 * recs.len() as u64, bytes);
        assert!(
            !segment_path(dir.path(), 1).exists(),
            "sealed, confirmed segment deleted"
        );
        assert!(segment_path(dir.path(), 2).exists(), "active segment kept");
        assert_eq!(metrics.spool_records.get(), 0);
        assert_eq!(metrics.spool_bytes.get(), 0);
    }

    async fn spool_with(dir: &Path, n: u128) {
        let (spool, _reader) = open(dir, 1 << 20, Arc::new(Metrics::new())).unwrap();
        for i in 1..=n {
            spool.append(&[m(i)], Duration::from_secs(5)).await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_damaged_record_in_the_middle_costs_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        spool_with(dir.path(), 5).await;
        let seg = segment_path(dir.path(), 1);
        let mut data = fs::read(&seg).unwrap();
        // Damage the second record's payload and its length field alike.
        let second = {
            let (_, next) = frame_at(&data, HEADER_LEN as usize).unwrap();
            next
        };
        data[second + 12] ^= 0xff;
        data[second] ^= 0x7f;
        fs::write(&seg, &data).unwrap();
        let metrics = Arc::new(Metrics::new());
        let (_spool, mut reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
        assert_eq!(ids(&read_all(&mut reader)), [1, 3, 4, 5]);
        assert!(dir
            .path()
            .join("kept-aside/damaged-00000000000000000001.seg")
            .exists());
        assert!(metrics.spool_damaged_bytes.get() > 0);
        assert_eq!(metrics.spool_records.get(), 4);
    }

    #[tokio::test]
    async fn a_damaged_magic_loses_no_record() {
        let dir = tempfile::tempdir().unwrap();
        spool_with(dir.path(), 3).await;
        let seg = segment_path(dir.path(), 1);
        let mut data = fs::read(&seg).unwrap();
        data[0] ^= 0xff;
        fs::write(&seg, &data).unwrap();
        let (_spool, mut reader) = open(dir.path(), 1 << 20, Arc::new(Metrics::new())).unwrap();
        assert_eq!(ids(&read_all(&mut reader)), [1, 2, 3]);
    }

    #[tokio::test]
    async fn numbering_goes_on_past_the_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        {
            let (spool, mut reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
            spool.append(&[m(1)], Duration::from_secs(5)).await.unwrap();
            let recs = read_all(&mut reader);
            reader.confirm(recs[0].end, 1, recs[0].bytes);
        }
        for e in fs::read_dir(dir.path().join("segments")).unwrap() {
            fs::remove_file(e.unwrap().path()).unwrap();
        }
        {
            let (spool, _reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
            spool.append(&[m(2)], Duration::from_secs(5)).await.unwrap();
        }
        let (_spool, mut reader) = open(dir.path(), 1 << 20, metrics).unwrap();
        assert_eq!(
            ids(&read_all(&mut reader)),
            [2],
            "acknowledged after the files vanished: kept"
        );
    }

    #[tokio::test]
    async fn a_failed_cursor_write_still_frees_the_room() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let (spool, mut reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
        spool.append(&[m(1)], Duration::from_secs(5)).await.unwrap();
        // A cursor that cannot be written (here: a folder where its file should be).
        let cursor = dir.path().join(CURSOR_FILE);
        fs::remove_file(&cursor).unwrap();
        fs::create_dir(&cursor).unwrap();
        reader.cursor.file = None;
        let recs = read_all(&mut reader);
        reader.confirm(recs[0].end, 1, recs[0].bytes);
        assert_eq!(metrics.spool_records.get(), 0);
        assert_eq!(metrics.spool_bytes.get(), 0);
    }

    #[tokio::test]
    async fn identity_survives_restarts_and_no_two_spools_share_one() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let metrics = Arc::new(Metrics::new());
        let first = open(a.path(), 1 << 20, metrics.clone())
            .unwrap()
            .1
            .identity()
            .to_owned();
        let again = open(a.path(), 1 << 20, metrics.clone())
            .unwrap()
            .1
            .identity()
            .to_owned();
        let other = open(b.path(), 1 << 20, metrics)
            .unwrap()
            .1
            .identity()
            .to_owned();
        assert!(is_identity(&first), "{first}");
        assert_eq!(first, again, "kept across a restart");
        assert_ne!(first, other, "a fresh spool gets its own");
    }

    #[tokio::test]
    async fn the_batch_in_flight_at_a_crash_is_read_again_with_the_same_range() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let (start, end) = {
            let (spool, mut reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
            for n in 1..=2 {
                spool.append(&[m(n)], Duration::from_secs(5)).await.unwrap();
            }
            let start = reader.position();
            let recs = read_all(&mut reader);
            assert_eq!(recs.len(), 2);
            reader.record_in_flight(start, recs[1].end);
            // More arrives while the batch is in flight; then the process dies unconfirmed.
            spool.append(&[m(3)], Duration::from_secs(5)).await.unwrap();
            (start, recs[1].end)
        };
        let (_spool, mut reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
        assert_eq!(reader.position(), start);
        assert_eq!(reader.replay_bound(), Some(end));
        let recs = read_all(&mut reader);
        assert_eq!(
            ids(&recs),
            [1, 2],
            "cut at the recorded end, not at what is there"
        );
        assert_eq!(recs.last().unwrap().end, end);
        reader.confirm(end, 2, recs.iter().map(|r| r.bytes).sum());
        assert_eq!(reader.replay_bound(), None);
        assert_eq!(ids(&read_all(&mut reader)), [3], "then reading goes on");
    }

    #[tokio::test]
    async fn an_in_flight_record_of_another_identity_or_start_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        {
            let (spool, _reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
            spool.append(&[m(1)], Duration::from_secs(5)).await.unwrap();
        }
        fs::write(
            dir.path().join(INFLIGHT_FILE),
            format!("{} 1 8 1 9\n", "0".repeat(32)),
        )
        .unwrap();
        let (_spool, reader) = open(dir.path(), 1 << 20, metrics).unwrap();
        assert_eq!(reader.replay_bound(), None);
    }

    #[tokio::test]
    async fn rewriting_a_damaged_segment_renews_the_identity() {
        let dir = tempfile::tempdir().unwrap();
        spool_with(dir.path(), 3).await;
        let before = fs::read_to_string(dir.path().join(IDENTITY_FILE)).unwrap();
        let seg = segment_path(dir.path(), 1);
        let mut data = fs::read(&seg).unwrap();
        let second = frame_at(&data, HEADER_LEN as usize).unwrap().1;
        data[second + 12] ^= 0xff;
        fs::write(&seg, &data).unwrap();
        let (_spool, reader) = open(dir.path(), 1 << 20, Arc::new(Metrics::new())).unwrap();
        assert_ne!(
            reader.identity(),
            before.trim(),
            "positions moved: new tokens"
        );
    }

    #[test]
    fn second_open_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let metrics = Arc::new(Metrics::new());
        let _first = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
        assert!(matches!(
            open(dir.path(), 1 << 20, metrics),
            Err(OpenError::Locked(_))
        ));
    }

    fn received(n: u128, at: u32) -> Measurement {
        Measurement {
            received_at: at,
            ..m(n)
        }
    }

    fn unix_now() -> u32 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as u32
    }

    /// The exported value of `collector_spool_oldest_record_age_seconds`.
    fn exported_age(metrics: &Metrics) -> f64 {
        let text = metrics.encode();
        text.lines()
            .find_map(|l| l.strip_prefix("collector_spool_oldest_record_age_seconds "))
            .unwrap_or_else(|| panic!("no collector_spool_oldest_record_age_seconds in\n{text}"))
            .parse()
            .unwrap()
    }

    #[tokio::test]
    async fn oldest_unconfirmed_age_follows_confirmations_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let oldest = |m: &Metrics| {
            m.spool_oldest_received_at
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let now = unix_now();
        {
            let (spool, mut reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
            assert_eq!(exported_age(&metrics), 0.0, "nothing unconfirmed");
            let limit = Duration::from_secs(5);
            spool
                .append(&[received(1, now - 300)], limit)
                .await
                .unwrap();
            // Several records in one second share an entry; the earliest of a record counts.
            spool
                .append(&[received(2, now - 100), received(3, now - 120)], limit)
                .await
                .unwrap();
            spool
                .append(&[received(4, now - 100)], limit)
                .await
                .unwrap();
            assert_eq!(oldest(&metrics), i64::from(now - 300));
            let age = exported_age(&metrics);
            assert!((300.0..305.0).contains(&age), "age {age}");
            let recs = read_all(&mut reader);
            reader.confirm(recs[0].end, 1, recs[0].bytes);
            assert_eq!(oldest(&metrics), i64::from(now - 120));
        }
        // After a restart the age comes from what the spool holds.
        metrics
            .spool_oldest_received_at
            .store(0, std::sync::atomic::Ordering::Relaxed);
        let (_spool, mut reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
        assert_eq!(oldest(&metrics), i64::from(now - 120));
        let age = exported_age(&metrics);
        assert!((120.0..125.0).contains(&age), "age after restart {age}");
        let recs = read_all(&mut reader);
        let last = recs.last().unwrap();
        reader.confirm(last.end, 3, recs.iter().map(|r| r.bytes).sum());
        assert_eq!(oldest(&metrics), 0);
        assert_eq!(exported_age(&metrics), 0.0, "everything confirmed");
    }

    #[test]
    fn received_times_stay_increasing_and_bounded() {
        let at = |offset| Position { segment: 1, offset };
        let mut t = ReceivedTimes::default();
        for (i, second) in [10, 10, 10, 11, 11, 12].into_iter().enumerate() {
            t.appended(at(100 + i as u64), second);
        }
        assert_eq!(t.0.len(), 3, "one entry per second: {:?}", t.0);
        // A late record received earlier than the last entries folds them into itself.
        t.appended(at(200), 9);
        assert_eq!(t.oldest(), Some(9));
        assert_eq!(t.0.len(), 1, "{:?}", t.0);
        t.appended(at(300), 20);
        t.confirmed(at(199));
        assert_eq!(t.oldest(), Some(9), "a partly confirmed entry stays");
        t.confirmed(at(200));
        assert_eq!(t.oldest(), Some(20));
        t.confirmed(at(300));
        assert_eq!(t.oldest(), None);
    }

    /// Makes writes under `dir` fail with `ENOSPC` (or succeed again).
    fn set_full(dir: &Path, full: bool) {
        let mut disks = FULL_DISKS.lock().unwrap();
        disks.retain(|d| d != dir);
        if full {
            disks.push(dir.to_owned());
        }
    }

    /// Waits until the spool can write again; panics after 10 s.
    async fn wait_writable(spool: &Spool) {
        let start = Instant::now();
        while let Some(why) = spool.unwritable() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "still unwritable after 10 s: {why}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn segment_numbers(dir: &Path) -> Vec<u64> {
        let mut n: Vec<u64> = fs::read_dir(dir.join("segments"))
            .unwrap()
            .map(|e| {
                let name = e.unwrap().file_name();
                name.to_str()
                    .unwrap()
                    .strip_suffix(".seg")
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        n.sort_unstable();
        n
    }

    #[tokio::test]
    async fn a_full_disk_refuses_appends_until_space_returns() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let (spool, mut reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
        let limit = Duration::from_secs(5);
        spool.append(&[m(1)], limit).await.unwrap();
        assert_eq!(spool.unwritable(), None);
        assert_eq!(metrics.spool_disk_full.get(), 0);

        set_full(dir.path(), true);
        assert_eq!(
            spool.append(&[m(2)], limit).await,
            Err(AppendError::DiskFull)
        );
        assert_eq!(spool.unwritable(), Some("spool cannot write: disk full"));
        assert_eq!(metrics.spool_disk_full.get(), 1);
        // Refused at once while the state lasts, and it lasts past several probes.
        tokio::time::sleep(PROBE_INTERVAL * 3).await;
        assert_eq!(
            spool.append(&[m(3)], limit).await,
            Err(AppendError::DiskFull)
        );
        assert_eq!(metrics.spool_disk_full.get(), 1);

        set_full(dir.path(), false);
        wait_writable(&spool).await;
        assert_eq!(metrics.spool_disk_full.get(), 0);
        spool.append(&[m(4)], limit).await.unwrap();
        let recs = read_all(&mut reader);
        assert_eq!(ids(&recs), [1, 4], "nothing refused was kept");
        assert_eq!(recs[0].end.segment, 1);
        assert_eq!(
            recs[1].end.segment, 2,
            "the segment whose write failed takes no more: a new one"
        );
        assert_eq!(metrics.spool_records.get(), 2);
    }

    #[tokio::test]
    async fn a_sealed_segment_goes_once_confirmed_and_numbering_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let limit = Duration::from_secs(5);
        {
            let (spool, mut reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
            spool.append(&[m(1)], limit).await.unwrap();
            set_full(dir.path(), true);
            assert!(spool.append(&[m(2)], limit).await.is_err());
            let recs = read_all(&mut reader);
            assert_eq!(ids(&recs), [1]);
            // Still full: confirming needs no space and deletes the sealed, newest segment.
            reader.confirm(recs[0].end, 1, recs[0].bytes);
            assert_eq!(segment_numbers(dir.path()), [] as [u64; 0]);
            assert_eq!(metrics.spool_disk_bytes.get(), 0);
            assert!(spool.unwritable().is_some());
        }
        // Reopened on the still full disk: opens, unwritable, then writes after the cursor.
        let (spool, mut reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
        assert_eq!(spool.unwritable(), Some("spool cannot write: disk full"));
        assert_eq!(metrics.spool_disk_full.get(), 1);
        set_full(dir.path(), false);
        wait_writable(&spool).await;
        spool.append(&[m(3)], limit).await.unwrap();
        assert_eq!(
            segment_numbers(dir.path()),
            [2],
            "a new number, never one whose ranges were sent"
        );
        assert_eq!(ids(&read_all(&mut reader)), [3]);
    }

    #[tokio::test]
    async fn opening_on_a_full_disk_delivers_what_the_spool_holds() {
        let dir = tempfile::tempdir().unwrap();
        spool_with(dir.path(), 3).await;
        set_full(dir.path(), true);
        let metrics = Arc::new(Metrics::new());
        let (spool, mut reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
        assert_eq!(spool.unwritable(), Some("spool cannot write: disk full"));
        assert_eq!(
            spool.append(&[m(9)], Duration::from_secs(5)).await,
            Err(AppendError::DiskFull)
        );
        let recs = read_all(&mut reader);
        assert_eq!(ids(&recs), [1, 2, 3]);
        reader.confirm(recs[2].end, 3, recs.iter().map(|r| r.bytes).sum());
        assert_eq!(metrics.spool_records.get(), 0);
        assert_eq!(
            segment_numbers(dir.path()),
            [] as [u64; 0],
            "delivered and deleted"
        );
        set_full(dir.path(), false);
        wait_writable(&spool).await;
        spool.append(&[m(4)], Duration::from_secs(5)).await.unwrap();
        assert_eq!(ids(&read_all(&mut reader)), [4]);
        assert_eq!(segment_numbers(dir.path()), [2]);
    }

    #[tokio::test]
    async fn cursor_and_in_flight_are_rewritten_in_place() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let (spool, mut reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
        let cursor = dir.path().join(CURSOR_FILE);
        let in_flight = dir.path().join(INFLIGHT_FILE);
        let inodes = || {
            (
                fs::metadata(&cursor).unwrap().ino(),
                fs::metadata(&in_flight).unwrap().ino(),
            )
        };
        let before = inodes();
        for n in 1..=3 {
            spool.append(&[m(n)], Duration::from_secs(5)).await.unwrap();
            let start = reader.position();
            let recs = read_all(&mut reader);
            reader.record_in_flight(start, recs[0].end);
            reader.confirm(recs[0].end, 1, recs[0].bytes);
        }
        assert_eq!(inodes(), before, "no new file, no rename");
        assert_eq!(fs::metadata(&cursor).unwrap().len(), 2 * SLOT_BYTES as u64);
        let end = reader.position();
        drop((spool, reader));
        // A write torn by a crash: the newest slot damaged, the one before it holds.
        let mut data = fs::read(&cursor).unwrap();
        let (seq, body) = parse_slots(&data).unwrap();
        assert_eq!(parse_cursor(&body), Some(end));
        let newest = (seq % 2) as usize * SLOT_BYTES;
        data[newest + 2] ^= 0x55;
        fs::write(&cursor, &data).unwrap();
        let (older_seq, older) = parse_slots(&data).unwrap();
        assert_eq!(older_seq, seq - 1);
        assert!(parse_cursor(&older).unwrap() < end);
        let (_spool, mut reader) = open(dir.path(), 1 << 20, metrics).unwrap();
        assert_eq!(
            ids(&read_all(&mut reader)),
            [3],
            "replayed from the older slot"
        );
    }

    #[tokio::test]
    async fn a_cursor_of_the_one_line_format_is_read_and_turned_into_slots() {
        let dir = tempfile::tempdir().unwrap();
        spool_with(dir.path(), 3).await;
        let data = fs::read(segment_path(dir.path(), 1)).unwrap();
        let first_end = frame_at(&data, HEADER_LEN as usize).unwrap().1;
        let cursor = dir.path().join(CURSOR_FILE);
        fs::write(&cursor, format!("1 {first_end}\n")).unwrap();
        let (_spool, mut reader) = open(dir.path(), 1 << 20, Arc::new(Metrics::new())).unwrap();
        let recs = read_all(&mut reader);
        assert_eq!(ids(&recs), [2, 3]);
        reader.confirm(recs[0].end, 1, recs[0].bytes);
        let data = fs::read(&cursor).unwrap();
        assert_eq!(data.len(), 2 * SLOT_BYTES);
        assert_eq!(
            parse_cursor(&parse_slots(&data).unwrap().1),
            Some(recs[0].end)
        );
    }

    #[tokio::test]
    async fn kept_aside_rows_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let (_spool, reader) = open(dir.path(), 1 << 20, metrics.clone()).unwrap();
        let path = reader
            .keep_aside(reader.position(), &[m(1), m(2), m(3)], "Code: 117")
            .unwrap();
        assert!(path.exists());
        assert_eq!(metrics.kept_aside_rows.get(), 3);
    }
}

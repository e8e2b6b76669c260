//! The durable spool: where the request path ends and the write path begins.
//!
//! Intake appends the measurements of a request and answers 202 only once they are on disk
//! (fdatasync). The writer reads them back, inserts them into ClickHouse in batches and
//! confirms; confirmed segments are deleted. Neither side calls the other: they share only
//! this log.
//!
//! # Modules
//!
//! - [`format`]: the segment format and its one frame codec;
//! - [`files`]: `IDENTITY`, and `CURSOR` and `INFLIGHT` rewritten in place;
//! - [`mod@open`]: the folder locked, recovered and held to the rules, the threads started;
//! - [`recovery`]: each segment checked and repaired at open;
//! - [`group`]: the open group requests add their frames to, its completion, the watchdog;
//! - [`appender`]: the thread that commits groups (write, `fdatasync`) and the unwritable
//!   state;
//! - [`prepare`]: the thread that makes the next segment ahead of time;
//! - [`reader`]: frames read in order for the writer, confirmation, dead-letter files;
//! - [`dump`]: `collector spool dump`, the rows a folder holds, for people;
//! - [`at_rest`]: what an earlier release left (segments of an earlier layout, kept-aside
//!   files) held to the rows' owner's rules at open, and kept-aside files when a site is
//!   purged.
//!
//! # On disk
//!
//! ```text
//! SPOOL_DIR/
//!   LOCK                      advisory exclusive lock (fs4): one collector per folder
//!   IDENTITY                  this spool's random identity (32 hex digits) and the folder's
//!                             DEV:INO (a copied folder gets a new identity)
//!   settings-snapshot.json    the site settings last read (see docs/settings-store.md)
//!   CURSOR                    "<segment> <offset>": everything before it is confirmed
//!   INFLIGHT                  "<identity> <seg> <off> <seg> <off>": the batch last sent
//!   segments/<20 digits>.seg  the log, in order of the number (format: [`format`]); the
//!                             active one may end in zeros, its preallocated room
//!   PREPARED.seg.tmp          the next segment, made ahead (see "Group commit")
//!   kept-aside/*.json         rows ClickHouse refused as bad data, for an operator
//! ```
//!
//! A segment is a magic and frames; a frame holds one [`Record`]: one request's accepted rows as
//! their owner encoded them, tagged with their layout (see [`mod@format`]). The spool never
//! reads a row: the rows' owner hands it, at [`open`], the current layout and the one function
//! that makes a record of an earlier layout current ([`Layouts`]); a frame of the current
//! layout goes to the writer as its bytes are on disk (for the measurements, the RowBinary
//! rows of the INSERT, encoded once at intake). Segments of every earlier release's format,
//! back to the JSON one, are still read and replayed.
//!
//! `CURSOR` and `INFLIGHT` are slot files ([`files::SlotFile`]): 512 bytes written in full
//! once, when the file is made, then rewritten in place (`pwrite`, and `fdatasync` for the
//! cursor), never through a new file and a rename, so that recording progress never needs
//! free space. Each holds two 256-byte slots written in turn; a slot is one line,
//! `<seq> <body> <crc32c hex>` padded with spaces, and the valid slot with the higher sequence
//! number is the file's value, so a write torn by a crash leaves the previous value. (A
//! shorter file is the one-line format of earlier versions, read as it is and turned into
//! slots by its first rewrite.)
//!
//! CRC-32C (the `crc32c` crate, hardware-accelerated) detects torn and corrupted frames. At
//! start every segment is scanned; a frame that is cut short or fails its checksum ends the
//! segment there (the file is truncated to the last whole frame), so a torn tail after a
//! crash is never replayed as garbage. A write or sync error truncates the segment back to
//! its last durable length and seals it (after a failed fsync the page cache cannot be
//! trusted, so the data is never re-synced: the affected requests got 503); the spool is then
//! unwritable until a trial in a new segment writes and syncs (see "A full disk").
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
//! [`RETRY_WRITE_INTERVAL`] the appender tries to leave the state (a *trial*): start a new
//! segment if it has none, reserve [`RESUME_ROOM_BYTES`] in it (`fallocate` with
//! `FALLOC_FL_KEEP_SIZE`), and write a page of zeros after its end and `fdatasync` it, the
//! call every group commit makes; once all succeed, appends are taken again. A trial that
//! skipped the sync passed on a disk whose every `fdatasync` failed (`fsync` and `fallocate`
//! still working), so `/readyz` flapped to 200 between failed groups and each failed group
//! sealed a segment, a new file every half second. A failed trial keeps its segment for the
//! next one: a spell makes one new file. So the state ends by itself when space returns, when
//! the drain of the spool frees it, or when a real sync succeeds again. Opening needs no free space either when the spool's files exist:
//! if no new segment can be made, the spool opens unwritable and still delivers what it holds.
//!
//! # Group commit
//!
//! A request's append costs it no thread hand-over ([`group`]): it encodes its frame (header
//! and CRC computed before the lock) into the *open group*'s buffer under one short lock, and
//! awaits the group's one completion. The [`appender`] thread takes the whole open group
//! when its previous sync returns, writes it with one `pwrite` and makes it durable with one
//! `fdatasync`, while the next group fills; then it sets the group's outcome once and wakes
//! one waiter, which wakes the others from its runtime thread ([`group::Group::finish`]: the
//! appender wakes one task per group, not every request). The appender is woken by a
//! request only when it sleeps for lack of work (the first request of a group after a quiet
//! spell); under load it never sleeps between groups. No request arms a timer: a watchdog
//! thread ends a group past its deadline (the least limit of its requests, checked every
//! 100 ms) with [`AppendError::SyncTimeout`].
//!
//! **Commit policy.** The appender (and the preparer) run 10 nice levels below the request threads
//! ([`APPENDER_NICE`]). On an idle core that changes nothing: it runs as soon as it
//! is woken, so a lone request waits one sync. On a full core its wake-up after a sync no
//! longer preempts the request thread, so the next group keeps filling until the event loop
//! runs out of ready work or its time slice: the sync is submitted when the loop yields.
//! (Holding a free appender back until a request thread runs out of work, tokio's
//! `on_thread_park`, or 1 ms, made syncs 16-20 % fewer and the tail worse: docs/benchmarks.md,
//! "Reading (ablation, issue 53, the hand-off)".)
//!
//! **Preallocated segments** ([`prepare`]). A segment grows as it is written only until the
//! [`prepare`] thread has made the next one: at its full length (`max_bytes / 8`, at most
//! [`SEGMENT_TARGET_BYTES`]), the magic then zeros *written* (not `fallocate`d: ext4 marks
//! fallocated blocks unwritten, and the first write to each converts them, a metadata change
//! every `fdatasync` must then write) and synced, renamed into place at rotation. A sync then
//! writes data blocks only: no block allocation, no new size. (ext4 without a journal, as on
//! the machine below, still writes the inode block when the file's mtime moved, about once per
//! clock tick; with a journal, mtime alone never makes `fdatasync` write metadata.) The zeros
//! after the last frame are never read as frames (no frame is all zeros): recovery cuts them
//! without counting damage, and a clean stop trims them. Like PostgreSQL's WAL segments
//! (`wal_init_zero`), this writes each segment's bytes twice; it is skipped when the
//! filesystem has less than four segments free, so a near-full disk spends its last space on
//! measurements.
//!
//! **Why, in figures** (`scripts/bench.sh --ablation`, docs/benchmarks.md "The spool append's
//! share", on a 2-vCPU KVM guest with ext4 on virtio-blk): the cost of durability is per sync,
//! about 130-140 µs of the appender's system time (the virtio notifications, the data write,
//! the cache flush, the inode write), so the lever is requests per sync. A request thread that
//! hands each frame to the appender, or an appender whose wake-up preempts it, leaves 12-19
//! requests per sync; with the appender below the request threads a sync carries 33 at 64
//! connections and 57-59 at 256.
//!
//! # Bounds
//!
//! What the spool holds that ClickHouse has not confirmed never exceeds `max_bytes`
//! ([`crate::config::DEFAULT_SPOOL_MAX_BYTES`]): an append that would cross it is refused
//! ([`AppendError::Full`], a 503), and nothing already acknowledged is ever dropped. On disk
//! there may be, in addition, up to about one segment of confirmed records waiting for their
//! segment to be sealed and deleted, and up to two segments of preallocated room (the zeros
//! of the segment being written and the prepared next one); segments are sized
//! `max_bytes / 8` (between 64 KiB and [`SEGMENT_TARGET_BYTES`]) so that this stays small next
//! to the bound. The open group holds at most [`APPEND_QUEUE`] requests and
//! [`GROUP_MAX_BYTES`]; beyond that intake is shed at once ([`AppendError::QueueFull`]); an
//! append whose group is not durable by its deadline gets [`AppendError::SyncTimeout`].

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fs4::fs_std::FileExt as _;
use tokio::sync::watch;

use crate::metrics::Metrics;

mod appender;
pub mod at_rest;
pub mod dump;
pub mod files;
pub mod format;
mod group;
mod open;
mod prepare;
mod reader;
mod recovery;
#[cfg(test)]
mod tests;

use appender::Appender;
pub use at_rest::{hold_kept_aside, AtRest, Held, KeptAside};
use files::{identity, parse_in_flight, Cursor, SlotFile};
pub use format::{Layouts, Record, HEADER_LEN, MAGIC, MAX_RECORD_BYTES};
use group::Groups;
pub use open::{open, open_shard};
use prepare::Preparer;
pub use reader::{Frame, SpoolReader};
use recovery::recover_segment;

/// Largest segment: one is sealed and a new one started at `max_bytes / 8`, at most this.
pub const SEGMENT_TARGET_BYTES: u64 = 16 * 1024 * 1024;
/// Smallest segment target.
const SEGMENT_MIN_BYTES: u64 = 64 * 1024;
/// Requests in the open group at most (those waiting for the next sync); beyond this intake
/// is shed at once with 503. With the group being synced, which holds as many, this bounds
/// the requests waiting for a shard's syncs (they hold no place in flight: intake's
/// `COLLECTOR_MAX_IN_FLIGHT` bounds the work before the append).
pub const APPEND_QUEUE: usize = 4096;
/// Most frame bytes in the open group, so most written by one group commit; beyond this
/// intake is shed at once with 503.
const GROUP_MAX_BYTES: usize = 8 * 1024 * 1024;

/// How much higher the appender's (and the preparer's) thread's nice value is than the process's (see
/// [`crate::priority`]). On a full core its wake-up after a sync no longer preempts the
/// request thread: the next group keeps filling until the request thread runs out of ready
/// work or its time slice, so each sync carries more requests (measured on 2 vCPUs, collector
/// on one: 59 instead of 12 per sync at 256 connections, and about a third less CPU per
/// request; see the module doc of [`super`]). On an idle core it runs at once, so a lone
/// request waits no longer.
pub const APPENDER_NICE: i32 = 10;

/// File holding the spool's identity (see the module doc).
pub const IDENTITY_FILE: &str = "IDENTITY";
/// File recording the range of the batch last handed to ClickHouse.
pub const INFLIGHT_FILE: &str = "INFLIGHT";
/// File recording the cursor: everything before it is confirmed by ClickHouse.
pub const CURSOR_FILE: &str = "CURSOR";
/// While the spool is unwritable, how often it tries to write again.
pub const RETRY_WRITE_INTERVAL: Duration = Duration::from_millis(500);
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

/// Why an append was refused. No part of a refused append is acknowledged, apart from
/// [`AppendError::SyncTimeout`], after which it may still become durable (a client's retry is
/// then folded as a duplicate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// The spool is at its bound.
    #[error("spool full")]
    Full,
    /// The open group is full ([`APPEND_QUEUE`] requests or [`GROUP_MAX_BYTES`]): refused at
    /// once.
    #[error("spool open group full")]
    QueueFull,
    /// Queued, but not durable within the caller's limit (a slow disk).
    #[error("spool sync timed out")]
    SyncTimeout,
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
    /// Since when the unconfirmed measurements are held, for
    /// `collector_spool_oldest_record_age_seconds`; see [`HeldTimes`].
    received: HeldTimes,
}

/// Since when the unconfirmed part of the spool is held, coarsely, on the monotonic clock
/// ([`crate::metrics::monotonic_nanos`]), so that a wall-clock step changes no age: entries
/// `(end, t)` in spool order, where `t` is the earliest time at which a record after the
/// previous entry's end and before `end` was held. A record is held from its append; a record
/// recovered at start from the age its `received_at` gives then (the one wall-clock reading,
/// so that an outage across a restart still shows its age). The times increase by at least a
/// second from entry to entry, so the front holds the oldest and a backlog of N seconds takes
/// at most N entries (a week: about 10 MiB), whatever the request rate.
#[derive(Debug, Default)]
struct HeldTimes(VecDeque<(Position, i64)>);

/// Nanoseconds within which appends share an entry of [`HeldTimes`].
const HELD_TIMES_GRAIN: i64 = 1_000_000_000;

impl HeldTimes {
    /// Records ending at `end`, the earliest held since `t`, were appended.
    fn appended(&mut self, end: Position, t: i64) {
        // Entries at least as late as `t` fold into this one (its time is their minimum).
        while self.0.back().is_some_and(|&(_, last)| last >= t) {
            self.0.pop_back();
        }
        match self.0.back_mut() {
            Some(back) if t < back.1.saturating_add(HELD_TIMES_GRAIN) => back.0 = end,
            _ => self.0.push_back((end, t)),
        }
    }

    /// Everything before `upto` is confirmed. An entry partly confirmed stays, so the age may
    /// read up to about a second high until its last record is confirmed.
    fn confirmed(&mut self, upto: Position) {
        while self.0.front().is_some_and(|&(end, _)| end <= upto) {
            self.0.pop_front();
        }
    }

    /// Since when the oldest unconfirmed measurement is held, if any.
    fn oldest(&self) -> Option<i64> {
        self.0.front().map(|&(_, t)| t)
    }
}

/// The point on the monotonic clock from which a record received at `received_at` (Unix
/// seconds) and recovered now counts as held: now minus its age by the wall clock (0 when the
/// wall clock says it is from the future).
fn held_since_recovered(received_at: u32) -> i64 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let age_secs = wall.saturating_sub(u64::from(received_at)) as i64;
    crate::metrics::monotonic_nanos().saturating_sub(age_secs.saturating_mul(1_000_000_000))
}

struct Shared {
    dir: PathBuf,
    /// 32 lowercase hex digits; see the module doc.
    identity: String,
    max_bytes: u64,
    segment_target: u64,
    /// The rows' layouts: the current one and the upgrade of earlier ones.
    layouts: Layouts,
    state: Mutex<State>,
    committed: watch::Sender<Position>,
    metrics: Arc<Metrics>,
    /// This spool's own figures (its shard's), summed into the totals.
    gauges: Arc<crate::metrics::ShardSpool>,
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
        self.gauges.unwritable.store(why != 0, Ordering::Relaxed);
        self.metrics.spool.publish_totals();
    }

    /// Drops segment `n` (of `len` bytes), whose file was removed, from the state.
    fn forget_segment(&self, n: u64, len: u64) {
        let mut st = self.state.lock().unwrap();
        // The appender and the reader may both remove a sealed, confirmed segment.
        if st.segments.remove(&n).is_some() {
            st.disk_bytes -= len;
        }
        self.publish(&st);
    }

    fn publish(&self, st: &State) {
        let g = &self.gauges;
        let set = |a: &std::sync::atomic::AtomicI64, v: u64| a.store(v as i64, Ordering::Relaxed);
        set(&g.bytes, st.unconfirmed_bytes);
        set(&g.records, st.unconfirmed_records);
        set(&g.disk_bytes, st.disk_bytes);
        set(&g.max_bytes, self.max_bytes);
        g.oldest_held_since.store(
            st.received.oldest().unwrap_or(crate::metrics::NOTHING_HELD),
            Ordering::Relaxed,
        );
        self.metrics.spool.publish_totals();
    }
}

/// The appending side, held by intake. Cheap to clone.
#[derive(Clone)]
pub struct Spool {
    shared: Arc<Shared>,
    appender: Arc<AppenderHandle>,
}

/// Owns the spool's threads (the appender, the watchdog, the segment preparer): when the last
/// [`Spool`] goes, appends stop, the appender commits what is open, and every thread is
/// joined, so the spool's lock is released deterministically.
struct AppenderHandle {
    groups: Arc<Groups>,
    preparer: Arc<Preparer>,
    /// The appender first: it commits the last group before the others stop.
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for AppenderHandle {
    fn drop(&mut self) {
        self.groups.open.lock().unwrap().stopping = true;
        self.groups.work.notify_all();
        self.groups.tick.notify_all();
        let mut threads = self.threads.drain(..);
        if let Some(appender) = threads.next() {
            let _ = appender.join();
        }
        // The appender stops the preparer when it ends; again here in case it panicked.
        self.preparer.stop();
        for thread in threads {
            let _ = thread.join();
        }
    }
}

/// Deletes the files of `dir/kept-aside/` last modified more than `older_than` ago (the
/// retention of what ClickHouse refused); how many. A missing folder is nothing to do.
pub fn expire_kept_aside(dir: &Path, older_than: Duration) -> io::Result<usize> {
    let entries = match fs::read_dir(dir.join("kept-aside")) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut deleted = 0;
    for entry in entries {
        let entry = entry?;
        let age = entry.metadata()?.modified()?.elapsed().unwrap_or_default();
        if age > older_than {
            fs::remove_file(entry.path())?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// The numbers of the segment files in `dir/segments`, in order.
fn segment_numbers(dir: &Path) -> io::Result<Vec<u64>> {
    let mut numbers: Vec<u64> = fs::read_dir(dir.join("segments"))?
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
    Ok(numbers)
}

fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join("segments").join(format!("{n:020}.seg"))
}

/// A record in a group commit ([`Spool::join`]): wait on it for the group's outcome.
pub struct Joined(Arc<group::Group>);

impl Joined {
    /// Waits until the record's group is durable or refused: the outcomes of
    /// [`Spool::append`] that come after the join ([`AppendError::SyncTimeout`],
    /// [`AppendError::DiskFull`], [`AppendError::Io`]). Poll it to its end or drop it (see
    /// [`Spool::append`]).
    pub async fn wait(self) -> Result<(), AppendError> {
        self.0.wait().await
    }
}

impl Spool {
    /// Appends one request's record and waits until it is durable, at most about `limit`.
    ///
    /// Errors: [`AppendError::Full`] at the bound, [`AppendError::QueueFull`] when the open
    /// group is full (at once), [`AppendError::SyncTimeout`] when the group is not durable by
    /// its deadline (the rows may still become durable; a client retry is then folded as a
    /// duplicate), [`AppendError::DiskFull`] and [`AppendError::Io`] while the spool cannot
    /// write. A group's deadline is the earliest of its requests' (`limit` after each joined;
    /// checked every [`group::WATCHDOG_TICK`]), so a request that joined a group late may be
    /// answered up to that group's age before its own `limit`; intake gives every request the
    /// same limit, so this is at most the time the group stayed open.
    ///
    /// Poll the returned future to its end or drop it: the first request of a group woken
    /// wakes the others (a kept, never polled one holds them until the next group commits).
    pub async fn append(&self, record: Record, limit: Duration) -> Result<(), AppendError> {
        self.join(&record, limit)?.wait().await
    }

    /// The first half of [`Spool::append`]: adds the record to the open group at once, without
    /// waiting; [`Joined::wait`] is the second. Between the two the caller may let go of what
    /// it no longer needs while the group is written and synced (intake's place in flight:
    /// the wait is bounded by the group's own bounds, [`APPEND_QUEUE`] requests and
    /// [`GROUP_MAX_BYTES`]). Errors: those of [`Spool::append`] that come at once.
    pub fn join(&self, record: &Record, limit: Duration) -> Result<Joined, AppendError> {
        match self.shared.unwritable() {
            0 => {}
            UNWRITABLE_DISK_FULL => return Err(AppendError::DiskFull),
            _ => return Err(AppendError::Io),
        }
        // Lock order: the open group, then the state (the appender never holds both).
        let held = || self.shared.state.lock().unwrap().unconfirmed_bytes;
        let group = self
            .appender
            .groups
            .join(record, limit, held, self.shared.max_bytes)?;
        Ok(Joined(group))
    }

    /// Whether the open group has fewer than a `share`th of its room left, in requests
    /// ([`APPEND_QUEUE`]) or in bytes ([`GROUP_MAX_BYTES`]): requests pile up behind a slow
    /// sync, and intake sheds its loud sites before the group is full and sheds everyone
    /// ([`crate::limits::RESERVED_SHARE`], contract v4 §2).
    pub fn group_strained(&self, share: usize) -> bool {
        let open = self.appender.groups.open.lock().unwrap();
        group::strained(open.requests, open.buf.len(), share)
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

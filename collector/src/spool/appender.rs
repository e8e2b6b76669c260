//! The committer: one thread that takes the open group, writes it with one `pwrite` and makes
//! it durable with one `fdatasync` (group commit), releases the group's answers, and keeps the
//! unwritable state a failed write or sync puts the spool in.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::files::{fault, is_no_space, sync_segment};
use super::format::{HEADER_LEN, MAGIC};
use super::group::{Group, Groups, Taken};
use super::prepare::Preparer;
use super::{
    segment_path, AppendError, Position, Shared, APPENDER_NICE, RESUME_ROOM_BYTES,
    RETRY_WRITE_INTERVAL, UNWRITABLE_DISK_FULL, UNWRITABLE_IO,
};

/// Zeros a trial writes after the active segment's durable end and syncs, in bytes: one page,
/// so that the `fdatasync` has data to write (a sync with nothing dirty proves nothing).
const TRIAL_BYTES: usize = 4096;

pub(super) struct Appender {
    pub shared: Arc<Shared>,
    pub groups: Arc<Groups>,
    pub preparer: Arc<Preparer>,
    /// The active segment, open for writing; `None` while sealed (see [`State::sealed`]).
    pub file: Option<File>,
    /// Length of what the active segment holds (a prepared segment's file is longer: zeros).
    pub size: u64,
    /// When the appender last tried to leave the unwritable state.
    pub last_trial: Instant,
    /// Since when the spool has been unwritable.
    pub unwritable_since: Option<Instant>,
}

impl Appender {
    /// Commits groups until the spool closes, then commits what is open and returns. (Never
    /// inlined, so that a profile names the thread's work.)
    #[inline(never)]
    pub fn run(mut self) {
        crate::priority::lower_this_thread(APPENDER_NICE, "spool appender");
        let mut spare = Vec::with_capacity(1 << 16);
        let mut previous: Option<Arc<Group>> = None;
        loop {
            let taken = {
                let mut open = self.groups.open.lock().unwrap();
                loop {
                    if open.requests > 0 {
                        break Some(Groups::take(&mut open, std::mem::take(&mut spare)));
                    }
                    if open.stopping {
                        break None;
                    }
                    // While unwritable, wake up every retry interval to try again: no request
                    // may come (load balancers follow /readyz), and readiness must return by
                    // itself.
                    open.committer_idle = true;
                    open = if self.unwritable_since.is_some() {
                        let (open, _) = self
                            .groups
                            .work
                            .wait_timeout(open, RETRY_WRITE_INTERVAL)
                            .unwrap();
                        open
                    } else {
                        self.groups.work.wait(open).unwrap()
                    };
                    open.committer_idle = false;
                    if self.unwritable_since.is_some()
                        && self.last_trial.elapsed() >= RETRY_WRITE_INTERVAL
                    {
                        drop(open);
                        self.trial();
                        open = self.groups.open.lock().unwrap();
                    }
                }
            };
            let Some(mut taken) = taken else { break };
            let bytes = taken.buf.len() as u64;
            let outcome = self.commit(&taken);
            self.groups.done(bytes);
            taken.group.finish(outcome);
            if let Some(group) = previous.replace(taken.group.clone()) {
                group.wake_stragglers();
            }
            taken.buf.clear();
            spare = taken.buf;
        }
        self.trim_active();
        self.preparer.stop();
        tracing::debug!("spool: appender stopped");
    }

    /// The error an append gets while the spool is unwritable.
    fn refusal(&self) -> AppendError {
        match self.shared.unwritable() {
            UNWRITABLE_DISK_FULL => AppendError::DiskFull,
            _ => AppendError::Io,
        }
    }

    /// Writes and syncs one group; counts it in the spool's state once durable.
    #[inline(never)]
    fn commit(&mut self, taken: &Taken) -> Result<(), AppendError> {
        if self.unwritable_since.is_some() {
            return Err(self.refusal());
        }
        if self.file.is_none() || self.size >= self.shared.segment_target {
            if let Err(e) = self.rotate() {
                // No new segment: the full one takes no more either.
                self.seal();
                self.enter_unwritable(&e, "cannot start a new segment");
                return Err(self.refusal());
            }
        }
        let file = self.file.as_ref().expect("rotated above");
        // The group is held from here on (its records were received moments ago).
        let held_since = crate::metrics::monotonic_nanos();
        let began = Instant::now();
        let result = fault(&self.shared.dir)
            .and_then(|()| file.write_all_at(&taken.buf, self.size))
            .and_then(|()| sync_segment(&self.shared.dir, file));
        self.shared
            .metrics
            .spool
            .sync_duration
            .observe(began.elapsed().as_secs_f64());
        let len = taken.buf.len() as u64;
        match result {
            Ok(()) => {
                self.size += len;
                let end = {
                    let mut st = self.shared.state.lock().unwrap();
                    let active = st.active;
                    st.segments.insert(active, self.size);
                    st.disk_bytes += len;
                    st.unconfirmed_bytes += len;
                    st.unconfirmed_records += taken.records;
                    let end = Position {
                        segment: active,
                        offset: self.size,
                    };
                    if taken.records > 0 {
                        st.received.appended(end, held_since);
                    }
                    self.shared.publish(&st);
                    end
                };
                self.shared.committed.send_replace(end);
                Ok(())
            }
            Err(e) => {
                // Back to the last durable length; after a failed sync the page cache cannot
                // be trusted, so this segment takes no more and the next write starts a new one.
                let _ = file.set_len(self.size);
                self.seal();
                self.enter_unwritable(&e, "write or sync failed");
                Err(self.refusal())
            }
        }
    }

    /// Closes the active segment for good: it is deleted once confirmed, even if no new one
    /// can be made (see [`State::sealed`]).
    fn seal(&mut self) {
        self.trim_active();
        self.file = None;
        self.shared.state.lock().unwrap().sealed = true;
    }

    /// Cuts a prepared active segment's unused zeros, so that a segment no longer written
    /// holds only frames (recovery would cut them anyway).
    fn trim_active(&mut self) {
        if let Some(file) = &self.file {
            if file.metadata().is_ok_and(|m| m.len() > self.size) {
                let _ = file.set_len(self.size);
            }
        }
    }

    /// Turns the spool unwritable (appends refused, `/readyz` 503) after `e`; one warning.
    pub fn enter_unwritable(&mut self, e: &io::Error, what: &str) {
        let why = if is_no_space(e) {
            UNWRITABLE_DISK_FULL
        } else {
            UNWRITABLE_IO
        };
        self.last_trial = Instant::now();
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

    /// One trial: an attempt to leave the unwritable state.
    fn trial(&mut self) {
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

    /// Makes the spool writable, and proves it: a new segment if the active one is sealed,
    /// [`RESUME_ROOM_BYTES`] reserved after its end (so that a disk with a few KiB free does
    /// not count as writable), then [`TRIAL_BYTES`] of zeros written there and synced with
    /// `fdatasync`, the call a group commit makes. Without that sync a disk whose every
    /// `fdatasync` fails, while `fsync`, `fallocate` and writes work, passed every trial and
    /// turned ready between failed groups.
    ///
    /// A failed trial keeps its segment (only zeros past the durable end were written to it
    /// since its last good sync, and the next group's frames overwrite them), so the next trial
    /// tries the same file again: a spell of failures makes one new segment, not one per trial.
    /// Errors: the first step that failed.
    pub fn resume(&mut self) -> io::Result<()> {
        self.last_trial = Instant::now();
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
            Ok(()) => {}
            // A filesystem without fallocate: the zeros below claim their blocks instead.
            Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => {}
            Err(e) => return Err(e.into()),
        }
        // Zeros are never read as frames: recovery cuts them without counting damage, a seal
        // or a clean stop trims them (as a prepared segment's).
        file.write_all_at(&[0; TRIAL_BYTES], self.size)?;
        sync_segment(&self.shared.dir, file)
    }

    /// Deletes the sealed active segment if the durable cursor has passed it: on a full disk
    /// its confirmed records may be what holds the space a new segment needs.
    fn delete_confirmed_active(&mut self) {
        let (active, len) = {
            let st = self.shared.state.lock().unwrap();
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
            (active, len)
        };
        // The file is removed outside the lock that intake's `/readyz` and the reader take.
        match fs::remove_file(self.shared.segment_path(active)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::debug!(segment = active, error = %e, "spool: cannot delete a confirmed segment");
                return;
            }
        }
        self.shared.forget_segment(active, len);
    }

    /// Starts the next segment: the prepared one when it is ready, else a new file that grows
    /// as it is written.
    pub fn rotate(&mut self) -> io::Result<()> {
        let next = self.shared.state.lock().unwrap().active + 1;
        let dest = segment_path(&self.shared.dir, next);
        let file = match self.preparer.take(&dest) {
            Some(Ok(file)) => {
                let synced =
                    File::open(self.shared.dir.join("segments")).and_then(|d| d.sync_all());
                if let Err(e) = synced {
                    // Not durably named: removed, so that the next attempt can make it again.
                    drop(file);
                    let _ = fs::remove_file(&dest);
                    return Err(e);
                }
                file
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "spool: cannot move the prepared segment into place; making one");
                let _ = fs::remove_file(&dest);
                create_segment(&self.shared.dir, next)?
            }
            None => create_segment(&self.shared.dir, next)?,
        };
        self.trim_active();
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

fn create_segment(dir: &Path, n: u64) -> io::Result<File> {
    let path = segment_path(dir, n);
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .mode(super::files::FILE_MODE)
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

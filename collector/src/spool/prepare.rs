//! The segment preparer: one thread that makes the next segment ahead of time, its length and
//! blocks set and written (the magic, then zeros), so that the committer's `fdatasync` on it
//! writes data only, never the inode (see the module doc of [`super`], "Preallocated
//! segments"). Woken once per segment; a segment it could not make in time (or at all) is
//! made by the committer as before, growing as it is written.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

use super::files::fault;
use super::format::MAGIC;

/// The segment being prepared, in the spool folder (outside `segments/`: never read as a
/// segment; renamed into `segments/` when it is used, removed at open and at a clean stop).
pub(super) const PREPARED_FILE: &str = "PREPARED.seg.tmp";
/// Free space the filesystem must have, in segments, for one to be prepared: below it,
/// segments grow as written, so that a near-full disk spends its last space on measurements.
const FREE_SEGMENTS: u64 = 4;
/// Zeros written per `write` while preparing, in bytes.
const ZERO_CHUNK: usize = 1 << 20;

enum Slot {
    /// Nothing asked for, or the last attempt failed.
    Idle,
    /// The committer wants a prepared segment.
    Wanted,
    /// Made and synced: the file, open for reading and writing.
    Ready(File),
    /// The spool is closing.
    Stopping,
}

/// The hand-over between the committer and the preparer thread.
pub(super) struct Preparer {
    slot: Mutex<Slot>,
    wake: Condvar,
    dir: PathBuf,
    /// Length of a prepared segment, in bytes: the segment target.
    len: u64,
}

impl Preparer {
    pub(super) fn new(dir: &Path, len: u64) -> Preparer {
        Preparer {
            slot: Mutex::new(Slot::Idle),
            wake: Condvar::new(),
            dir: dir.to_owned(),
            len,
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.join(PREPARED_FILE)
    }

    /// The prepared segment renamed to `dest`, when one is ready (the caller syncs the
    /// folder); asks for the next one either way.
    pub(super) fn take(&self, dest: &Path) -> Option<io::Result<File>> {
        let mut slot = self.slot.lock().unwrap();
        let taken = match std::mem::replace(&mut *slot, Slot::Wanted) {
            Slot::Ready(file) => Some(fs::rename(self.path(), dest).map(|()| file)),
            Slot::Stopping => {
                *slot = Slot::Stopping;
                return None;
            }
            Slot::Idle | Slot::Wanted => None,
        };
        self.wake.notify_one();
        taken
    }

    /// Stops the thread; the prepared file, if any, is removed.
    pub(super) fn stop(&self) {
        *self.slot.lock().unwrap() = Slot::Stopping;
        self.wake.notify_one();
    }

    /// The thread's loop: prepares a segment each time one is wanted, until [`Self::stop`].
    pub(super) fn run(&self) {
        // Background work, like the appender's: request threads first.
        crate::priority::lower_this_thread(super::APPENDER_NICE, "spool preparer");
        let _ = fs::remove_file(self.path());
        loop {
            {
                let mut slot = self.slot.lock().unwrap();
                loop {
                    match *slot {
                        Slot::Wanted => break,
                        Slot::Stopping => {
                            drop(slot);
                            let _ = fs::remove_file(self.path());
                            return;
                        }
                        Slot::Idle | Slot::Ready(_) => slot = self.wake.wait(slot).unwrap(),
                    }
                }
            }
            let made = self.prepare();
            let mut slot = self.slot.lock().unwrap();
            match (made, &*slot) {
                (_, Slot::Stopping) => {}
                (Ok(file), _) => *slot = Slot::Ready(file),
                (Err(e), _) => {
                    tracing::debug!(error = %e, "spool: no segment prepared; the next one grows as written");
                    let _ = fs::remove_file(self.path());
                    *slot = Slot::Idle;
                }
            }
        }
    }

    /// Makes the prepared file: the magic, zeros up to the segment length, synced.
    fn prepare(&self) -> io::Result<File> {
        fault(&self.dir)?;
        let stat = rustix::fs::statvfs(&self.dir)?;
        let free = stat.f_bavail.saturating_mul(stat.f_frsize);
        if free < FREE_SEGMENTS.saturating_mul(self.len) {
            return Err(io::Error::other(format!(
                "{free} bytes free, fewer than {FREE_SEGMENTS} segments"
            )));
        }
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(super::files::FILE_MODE)
            .open(self.path())?;
        file.write_all(MAGIC)?;
        let zeros = vec![0u8; ZERO_CHUNK];
        let mut left = self.len.saturating_sub(MAGIC.len() as u64);
        while left > 0 {
            let n = left.min(ZERO_CHUNK as u64) as usize;
            file.write_all(&zeros[..n])?;
            left -= n as u64;
        }
        file.sync_all()?;
        Ok(file)
    }
}

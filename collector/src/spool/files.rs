//! The spool's small files: `IDENTITY` (made once), and `CURSOR` and `INFLIGHT`, which are
//! slot files rewritten in place ([`SlotFile`]) so that recording progress never needs free
//! space; plus the test hooks that make a folder's writes fail as on a full disk and its
//! segments' syncs fail as on a failing one.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
#[cfg(test)]
use std::sync::Mutex;

use super::{Position, CURSOR_FILE, IDENTITY_FILE};

/// Size of one slot of a [`SlotFile`], in bytes; the file holds two.
pub(super) const SLOT_BYTES: usize = 256;

/// The spool's identity: read from [`IDENTITY_FILE`], or made (a UUID v4) and stored durably
/// when the file is missing or unreadable, or when `renew` (recovery rewrote a segment, so
/// ranges of earlier tokens may now hold other records).
///
/// Only made at open. When a new identity cannot be stored (a full disk), it is used in memory
/// all the same, which is safe: the next start makes another, never an earlier one (a stale
/// file is removed first, since removing needs no space).
///
/// **A copied folder gets a new identity.** The file also records the folder it was made in
/// (device and inode of the spool folder, `DEV:INO`). A copy of the folder (a restored backup,
/// a cloned volume, an rsync to a new host) is another folder: its identity is renewed at
/// open, so that the copy and the original, both running, never send two batches with one
/// token (the server would drop the second as already seen). A restart, or a move within one
/// file system, keeps the folder and the identity. A file without the line (written by an
/// earlier release) is taken as it is and gets the line.
pub(super) fn identity(dir: &Path, renew: bool) -> io::Result<String> {
    let path = dir.join(IDENTITY_FILE);
    let here = folder_id(dir)?;
    if !renew {
        match fs::read_to_string(&path) {
            Ok(text) => {
                let mut lines = text.lines().map(str::trim);
                let id = lines.next().unwrap_or("");
                let made_in = lines.next();
                match made_in {
                    _ if !is_identity(id) => {
                        tracing::warn!(file = %path.display(), "spool: unreadable identity; making a new one")
                    }
                    Some(folder) if folder == here => return Ok(id.to_owned()),
                    Some(folder) => {
                        tracing::warn!(file = %path.display(), made_in = folder, here = %here, "spool: this folder is a copy of the one its identity was made in; making a new identity so that the two never share a batch token")
                    }
                    None => {
                        if let Err(e) = store_identity(dir, id, &here) {
                            tracing::warn!(error = %e, "spool: cannot record the folder of the spool identity; trying again at the next start");
                        }
                        return Ok(id.to_owned());
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    let id = uuid::Uuid::new_v4().simple().to_string();
    let stored = store_identity(dir, &id, &here);
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

/// `DEV:INO` of the folder `dir`.
fn folder_id(dir: &Path) -> io::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(dir)?;
    Ok(format!("{}:{}", m.dev(), m.ino()))
}

/// Permissions of every file of a spool folder: the collector's user alone reads and writes
/// them (contract v4 §5: they hold what visitors sent).
pub const FILE_MODE: u32 = 0o600;
/// Permissions of the spool folder and its folders.
pub const DIR_MODE: u32 = 0o700;

/// Creates (or truncates) `path` for writing, readable by the collector's user alone.
pub fn create_private(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(path)
}

/// Makes the spool folder `dir` and its sub-folders private ([`DIR_MODE`], files
/// [`FILE_MODE`]): what an earlier release made with the process's umask (usually 0755 and
/// 0644) is narrowed at open.
pub fn make_private(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for folder in [dir.to_owned(), dir.join("segments"), dir.join("kept-aside")] {
        fs::set_permissions(&folder, fs::Permissions::from_mode(DIR_MODE))?;
        for entry in fs::read_dir(&folder)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                fs::set_permissions(entry.path(), fs::Permissions::from_mode(FILE_MODE))?;
            }
        }
    }
    Ok(())
}

/// Stores `id` and the folder it belongs to durably in [`IDENTITY_FILE`].
fn store_identity(dir: &Path, id: &str, folder: &str) -> io::Result<()> {
    let path = dir.join(IDENTITY_FILE);
    (|| {
        let tmp = dir.join("IDENTITY.tmp");
        let mut f = create_private(&tmp)?;
        f.write_all(format!("{id}\n{folder}\n").as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        File::open(dir)?.sync_all()
    })()
}

pub(super) fn is_identity(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The range in an [`INFLIGHT_FILE`] body, if it was written by a spool of this identity.
pub(super) fn parse_in_flight(body: &str, identity: &str) -> Option<(Position, Position)> {
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
pub(super) fn parse_cursor(body: &str) -> Option<Position> {
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
pub(super) struct SlotFile {
    file: File,
    /// Sequence number of the newest valid slot (0 when none).
    seq: u64,
}

impl SlotFile {
    /// Opens `dir/name` as it is when it exists (needing no space) and returns the body of its
    /// newest valid slot (or, for a file of the earlier one-line format, its first line); makes
    /// it when it is missing (which needs space).
    pub(super) fn open(dir: &Path, name: &str) -> io::Result<(SlotFile, Option<String>)> {
        let path = dir.join(name);
        match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(mut file) => {
                let mut data = Vec::new();
                io::Read::read_to_end(&mut file, &mut data)?;
                let (seq, body) = slot_value(&data);
                Ok((SlotFile { file, seq }, body))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let tmp = dir.join(format!("{name}.tmp"));
                let made = (|| {
                    use std::os::unix::fs::OpenOptionsExt;
                    let mut file = OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .mode(FILE_MODE)
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
    pub(super) fn write(&mut self, body: &str, sync: bool) -> io::Result<()> {
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

/// The sequence number and body a slot file's bytes hold (see [`SlotFile`]).
fn slot_value(data: &[u8]) -> (u64, Option<String>) {
    if data.len() == 2 * SLOT_BYTES {
        parse_slots(data).map_or((0, None), |(seq, body)| (seq, Some(body)))
    } else {
        // The one-line format of earlier versions, written by rename (never torn).
        let text = String::from_utf8_lossy(data);
        (0, text.lines().next().map(|l| l.trim().to_owned()))
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
pub(super) fn parse_slots(data: &[u8]) -> Option<(u64, String)> {
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
pub(super) struct Cursor {
    dir: PathBuf,
    /// `None` while the file is missing and cannot be made (a full disk at a spool's first
    /// start): made at the next [`Cursor::persist`].
    pub(super) file: Option<SlotFile>,
    /// What the file holds, synced (the default position when nothing was recorded yet).
    pub(super) durable: Position,
}

impl Cursor {
    /// Opens (or makes) the cursor file; returns it and the position it holds. A cursor file
    /// that cannot be read or made counts as none (everything is replayed; storage folds it)
    /// and is tried again at the next [`Cursor::persist`].
    pub(super) fn open(dir: &Path) -> io::Result<(Cursor, Position)> {
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

    /// The position the cursor file of `dir` holds, read only (the start of the spool when
    /// there is none or it is unreadable): for `collector spool dump`.
    pub(super) fn read(dir: &Path) -> io::Result<Position> {
        match fs::read(dir.join(CURSOR_FILE)) {
            Ok(data) => Ok(slot_value(&data)
                .1
                .as_deref()
                .and_then(parse_cursor)
                .unwrap_or_default()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Position::default()),
            Err(e) => Err(e),
        }
    }

    /// Records `at` durably (in place: needs no free space once the file exists).
    pub(super) fn persist(&mut self, at: Position) -> io::Result<()> {
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
pub(super) fn is_no_space(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}

/// Spool folders whose writes fail with `ENOSPC`, for unit tests of the full disk.
#[cfg(test)]
pub(super) static FULL_DISKS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Spool folders whose segments' `fdatasync` fails with `EIO`, for unit tests of a disk whose
/// every sync fails (the real-server test does it with libfiu: `tests/tests/sync_fails.rs`).
#[cfg(test)]
pub(super) static FAILING_SYNCS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// `fdatasync` of `file`, a segment of the spool in `dir`: where group commits and trials
/// sync, so that a unit test can make it fail ([`FAILING_SYNCS`]).
pub(super) fn sync_segment(dir: &Path, file: &File) -> io::Result<()> {
    #[cfg(test)]
    if FAILING_SYNCS
        .lock()
        .unwrap()
        .iter()
        .any(|d| dir.starts_with(d))
    {
        return Err(io::Error::from_raw_os_error(
            rustix::io::Errno::IO.raw_os_error(),
        ));
    }
    let _ = dir;
    file.sync_data()
}

/// Spool folders whose writes take this long, for unit tests of a slow or hung disk.
#[cfg(test)]
pub(super) static SLOW_DISKS: Mutex<Vec<(PathBuf, std::time::Duration)>> = Mutex::new(Vec::new());

/// `Err(ENOSPC)` when a unit test made `dir` full; a sleep first when one made it slow.
pub(super) fn fault(dir: &Path) -> io::Result<()> {
    #[cfg(test)]
    {
        let slow = SLOW_DISKS
            .lock()
            .unwrap()
            .iter()
            .find(|(d, _)| dir.starts_with(d))
            .map(|&(_, t)| t);
        if let Some(t) = slow {
            std::thread::sleep(t);
        }
    }
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

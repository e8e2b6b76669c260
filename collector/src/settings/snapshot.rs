//! The settings snapshot: the last full load of the store, kept beside the spool so that a
//! collector started while the store is down serves the last known state.
//!
//! Format: `settings-snapshot.json`, `{"version":1,"written_at":<unix seconds>,"sites":[Site]}`.
//! Written atomically (temporary file, fsync, rename, fsync of the folder), so a crash leaves
//! either the old or the new snapshot, never a torn one.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::Site;

/// File name inside the spool folder.
pub const FILE_NAME: &str = "settings-snapshot.json";

#[derive(Serialize, Deserialize)]
struct Snapshot {
    version: u32,
    written_at: u64,
    sites: Vec<Site>,
}

/// Path of the snapshot in `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Writes `sites` atomically to `path`.
pub fn write(path: &Path, sites: &[Site]) -> io::Result<()> {
    let written_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let body = serde_json::to_vec(&Snapshot {
        version: 1,
        written_at,
        sites: sites.to_vec(),
    })?;
    let tmp = path.with_extension("json.tmp");
    let mut f = crate::spool::files::create_private(&tmp)?;
    f.write_all(&body)?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Reads a snapshot: its sites and when it was written (Unix seconds).
pub fn read(path: &Path) -> io::Result<(Vec<Site>, u64)> {
    let snapshot: Snapshot = serde_json::from_slice(&fs::read(path)?)?;
    if snapshot.version != 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unknown snapshot version {}", snapshot.version),
        ));
    }
    Ok((snapshot.sites, snapshot.written_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path());
        let sites = vec![Site {
            allowed_origins: vec!["https://a.example".into()],
            sample_rate: 0.5,
            enabled: false,
            keep_query: vec!["utm_*".into(), "q".into()],
            page_groups: vec!["product=/p/*".into()],
            dimensions: vec!["variant".into()],
            ..Site::new("a")
        }];
        write(&p, &sites).unwrap();
        let (back, at) = read(&p).unwrap();
        assert_eq!(back, sites);
        assert!(at > 0);
        fs::write(&p, b"{\"version\":1,").unwrap();
        assert!(
            read(&p).is_err(),
            "a broken snapshot is an error, not an empty list"
        );
    }
}

//! What an earlier release, a damaged segment or a refused batch left at rest in a spool
//! folder, held to the rows' owner's rules (contract v5 §5): the spool hands the owner's
//! [`AtRest`] each record it finds and writes back what comes out; it never reads a row.
//!
//! - **Segments of an earlier layout** (an earlier release's spool, `CSPOOL01` to `CSPOOL04`,
//!   or `CSPOOL05` frames of an earlier layout) are rewritten at open, before anything is read
//!   from them ([`rewrite_earlier`]): each frame as the owner makes it today (the current
//!   layout, minimised, without the rows of purged sites), through a synced temporary file and
//!   a rename. What the cursor had passed is left out, so no byte of it stays either. The
//!   records move, so the spool takes a new identity first (see the module doc of
//!   [`super`]): no later batch can carry the token of one sent before.
//! - **Kept-aside files** ([`hold_kept_aside`]): each `*.json` as the owner rewrites it
//!   ([`AtRest::kept_aside`]; deleted when no row is left), and each `damaged-*.seg` rewritten
//!   as a segment of this release holding its whole frames as the owner makes them (the
//!   damaged bytes, which no rule can read, are left out; deleted when no frame is left). At
//!   open, and whenever a site is purged.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use super::files::Cursor;
use super::format::{encode_frame, Record, Version, HEADER_LEN, MAGIC};
use super::{segment_numbers, segment_path, Position};

/// A kept-aside file's body as the rows' owner holds it to its rules.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeptAside {
    /// The new body, or `None` to leave the file as it is (nothing to change, or not a body
    /// the owner reads).
    pub body: Option<Vec<u8>>,
    /// Rows the new body holds: with a new body and none left, the file is deleted.
    pub rows_left: usize,
    /// Rows left out (of purged sites).
    pub rows_dropped: usize,
}

impl KeptAside {
    /// A body the owner does not read: left as it is.
    pub fn unread() -> KeptAside {
        KeptAside::default()
    }
}

/// The rows' owner's rules for records at rest (for the measurements,
/// [`crate::measurement::stored::SiteRules`]).
pub trait AtRest: Sync {
    /// The rows of a frame of `layout` as a record of the current layout held to the rules (a
    /// record of 0 rows when none is left); `None` when `payload` does not hold whole rows of
    /// `layout`.
    fn frame(&self, layout: u16, payload: &[u8]) -> Option<Record>;
    /// A kept-aside file's body held to the rules.
    fn kept_aside(&self, body: &[u8]) -> KeptAside;
}

/// What [`hold_kept_aside`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Files rewritten.
    pub rewritten: usize,
    /// Files deleted (no row left).
    pub deleted: usize,
    /// Rows left out (of purged sites).
    pub rows_dropped: usize,
}

/// Rewrites every segment of `dir` at or after the cursor that holds a frame of a layout other
/// than `current` or is of an earlier format (see the module doc); before the first, renews
/// the spool's identity. The segments are whole (recovery ran). Whether any was rewritten.
pub(super) fn rewrite_earlier(
    dir: &Path,
    current: u16,
    rules: &dyn AtRest,
    cursor: &mut Position,
    cursor_file: &mut Cursor,
) -> io::Result<bool> {
    let mut renewed = false;
    for n in segment_numbers(dir)? {
        if n < cursor.segment {
            continue;
        }
        let path = segment_path(dir, n);
        let data = fs::read(&path)?;
        let Some(version) = data.get(..MAGIC.len()).and_then(Version::of) else {
            continue;
        };
        if version == Version::V5 && frames(&data, version).all(|(_, layout, _)| layout == current)
        {
            continue;
        }
        if !renewed {
            // Before any record moves: a crash after a rename must not leave the old identity.
            super::files::identity(dir, true)?;
            renewed = true;
        }
        let from = if n == cursor.segment {
            cursor.offset
        } else {
            HEADER_LEN
        };
        let (out, unread) = remade(&data, version, from, rules);
        if unread > 0 {
            tracing::error!(segment = %path.display(), frames = unread, "spool: frames of an earlier release that do not hold whole rows left out of the rewritten segment");
        }
        if n == cursor.segment {
            // The cursor first: a crash before the rename replays confirmed records (folded),
            // never skips one.
            cursor.offset = HEADER_LEN;
            cursor_file.persist(*cursor)?;
        }
        replace(&path, &out)?;
        tracing::info!(segment = %path.display(), format = %String::from_utf8_lossy(version.magic()), "spool: a segment of an earlier release rewritten in this release's format, its records minimised");
    }
    Ok(renewed)
}

/// The whole frames of a segment's bytes from its first frame: `(offset, layout, frame)`.
fn frames(data: &[u8], version: Version) -> impl Iterator<Item = (usize, u16, &[u8])> {
    let mut off = HEADER_LEN as usize;
    std::iter::from_fn(move || {
        let f = version.frame_at(data, off)?;
        let at = off;
        off = f.next;
        Some((at, f.layout, f.payload))
    })
}

/// A segment of this release holding the whole frames of `data` from offset `from` as `rules`
/// makes them, frames left without rows left out; and how many frames did not read.
fn remade(data: &[u8], version: Version, from: u64, rules: &dyn AtRest) -> (Vec<u8>, usize) {
    let mut out = MAGIC.to_vec();
    let mut unread = 0;
    for (at, layout, payload) in frames(data, version) {
        if (at as u64) < from {
            continue;
        }
        match rules.frame(layout, payload) {
            Some(record) if record.rows > 0 => encode_frame(&mut out, &record),
            Some(_) => {}
            None => unread += 1,
        }
    }
    (out, unread)
}

/// Holds every file of `dir/kept-aside/` to `rules` (see the module doc). A file that cannot
/// be read or written is said (a warning) and left; the others are still done.
pub fn hold_kept_aside(dir: &Path, rules: &dyn AtRest) -> io::Result<Held> {
    let folder = dir.join("kept-aside");
    let entries = match fs::read_dir(&folder) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Held::default()),
        Err(e) => return Err(e),
    };
    let mut held = Held::default();
    for entry in entries {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let done = if name.ends_with(".json") {
            hold_json(&path, rules)
        } else if name.starts_with("damaged-") && name.ends_with(".seg") {
            hold_damaged(&path, rules)
        } else {
            continue;
        };
        match done {
            Ok(Some((left, dropped))) => {
                held.rows_dropped += dropped;
                if left {
                    held.rewritten += 1;
                } else {
                    held.deleted += 1;
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "spool: cannot hold a kept-aside file to the rules; tried again at the next start or purge")
            }
        }
    }
    Ok(held)
}

/// One kept-aside JSON file: `Some((whether a row is left, rows dropped))` when it changed.
fn hold_json(path: &Path, rules: &dyn AtRest) -> io::Result<Option<(bool, usize)>> {
    let held = rules.kept_aside(&fs::read(path)?);
    let Some(body) = held.body else {
        return Ok(None);
    };
    if held.rows_left == 0 {
        fs::remove_file(path)?;
    } else {
        replace_kept(path, &body)?;
    }
    Ok(Some((held.rows_left > 0, held.rows_dropped)))
}

/// One `damaged-*.seg` copy: `Some((whether a frame is left, rows dropped))` when it changed.
fn hold_damaged(path: &Path, rules: &dyn AtRest) -> io::Result<Option<(bool, usize)>> {
    let data = fs::read(path)?;
    let version = data
        .get(..MAGIC.len())
        .and_then(Version::of)
        .unwrap_or_else(|| guess(&data, rules));
    let (frames, _skipped) = super::recovery::whole_frames(&data, version);
    let mut out = MAGIC.to_vec();
    let (mut before, mut after) = (0usize, 0usize);
    for (start, _) in frames {
        let Some(f) = version.frame_at(&data, start) else {
            continue;
        };
        let Some(record) = rules.frame(f.layout, f.payload) else {
            continue;
        };
        let all = if f.rows > 0 {
            f.rows
        } else {
            // A frame of the JSON release does not say: its rows as the owner reads them,
            // purged ones included, are at least those kept.
            record.rows
        };
        before += all as usize;
        after += record.rows as usize;
        if record.rows > 0 {
            encode_frame(&mut out, &record);
        }
    }
    if out == data {
        return Ok(None);
    }
    if out.len() == MAGIC.len() {
        fs::remove_file(path)?;
        return Ok(Some((false, before.saturating_sub(after))));
    }
    replace_kept(path, &out)?;
    Ok(Some((true, before.saturating_sub(after))))
}

/// The format of a damaged copy whose magic is damaged: the first whose first frame the owner
/// reads; this release's when none does.
fn guess(data: &[u8], rules: &dyn AtRest) -> Version {
    Version::ALL
        .into_iter()
        .find(|v| {
            v.frame_at(data, HEADER_LEN as usize)
                .is_some_and(|f| rules.frame(f.layout, f.payload).is_some())
        })
        .unwrap_or(Version::V5)
}

/// Replaces the file at `path` with `bytes` (private, synced, through a temporary file and a
/// rename, the folder synced), so that a crash leaves the old file or the new one.
fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace_as_of(path, bytes, None)
}

/// [`replace`] for a kept-aside file: the new file keeps the old one's modification time, which
/// the retention counts from (rewriting a file does not make it younger).
fn replace_kept(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let modified = fs::metadata(path)?.modified()?;
    replace_as_of(path, bytes, Some(modified))
}

/// [`replace`], the new file's modification time set to `modified` when given.
fn replace_as_of(
    path: &Path,
    bytes: &[u8],
    modified: Option<std::time::SystemTime>,
) -> io::Result<()> {
    // Named by the process: `sites purge` may rewrite a file a collector on this host rewrites.
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = path.with_file_name(format!("{name}.{}.rewrite.tmp", std::process::id()));
    let mut f = super::files::create_private(&tmp)?;
    f.write_all(bytes)?;
    if let Some(modified) = modified {
        f.set_modified(modified)?;
    }
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    if let Some(folder) = path.parent() {
        File::open(folder)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::time::Duration;

    use super::super::format::{encode_earlier_frame, MAGIC_V1, MAGIC_V3};
    use super::super::tests::m;
    use super::super::{open_shard, Frame};
    use super::*;
    use crate::measurement::stored::{Keeps, SiteRules};
    use crate::measurement::{decode_all, encode, kept_aside_json, Measurement, LAYOUTS};
    use crate::metrics::Metrics;

    const SECRET: &str = "Ab3dE5f9Gh2JkL2mN0pQ7rS";

    /// Row `n` as a release before v4 stored it: a token in its path and query, an address in
    /// its user agent.
    fn leaky(n: u128) -> Measurement<'static> {
        let mut row = m(n);
        row.url = format!("https://a.b/reset/{SECRET}?token={SECRET}&utm_source=x").into();
        row.user_agent = "Mozilla/5.0 jane@example.com".into();
        row
    }

    fn rules() -> SiteRules {
        SiteRules::new([("s".to_owned(), Keeps::default(), false)])
    }

    /// A `CSPOOL01` segment: one JSON frame per slice of `ids`.
    fn v1_segment(ids: &[&[u128]]) -> Vec<u8> {
        let mut data = MAGIC_V1.to_vec();
        for ids in ids {
            let rows: Vec<_> = ids.iter().map(|&n| leaky(n)).collect();
            let record = Record {
                layout: 1,
                payload: serde_json::to_vec(&rows).unwrap(),
                ..Record::default()
            };
            encode_earlier_frame(&mut data, Version::V1, &record);
        }
        data
    }

    /// Every file under `dir` that holds `needle`.
    fn holding(dir: &Path, needle: &str) -> Vec<String> {
        let mut found = Vec::new();
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                found.extend(holding(&path, needle));
            } else if String::from_utf8_lossy(&fs::read(&path).unwrap()).contains(needle) {
                found.push(path.display().to_string());
            }
        }
        found
    }

    fn read_all(reader: &mut super::super::SpoolReader) -> Vec<Frame> {
        let mut out = Vec::new();
        reader.read_available(u64::MAX, u64::MAX, &mut out);
        out
    }

    /// Opens the spool in `dir` under [`rules`] (which rewrites what it holds) and returns
    /// every row it then gives the writer, in order.
    fn rows_at_open(dir: &Path) -> Vec<Measurement<'static>> {
        let metrics = Arc::new(Metrics::new());
        let opened = open_shard(dir, "default", 1 << 20, LAYOUTS, Some(&rules()), metrics);
        let (_spool, mut reader) = opened.unwrap();
        read_all(&mut reader)
            .iter()
            .flat_map(|f| decode_all(&f.payload).unwrap())
            .collect()
    }

    #[test]
    fn an_earlier_spool_and_its_kept_aside_files_are_minimised_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let segment = v1_segment(&[&[1, 2], &[3]]);
        fs::create_dir_all(dir.path().join("segments")).unwrap();
        fs::create_dir_all(dir.path().join("kept-aside")).unwrap();
        fs::write(segment_path(dir.path(), 1), &segment).unwrap();
        let mut damaged = segment.clone();
        damaged.splice(8..8, b"garbage".iter().copied());
        let aside = dir.path().join("kept-aside");
        fs::write(aside.join("damaged-00000000000000000007.seg"), &damaged).unwrap();
        let (json, _) = kept_aside_json(&encode(&[leaky(4)]).payload, "refused");
        fs::write(aside.join("x.json"), &json).unwrap();
        let written = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        File::options()
            .write(true)
            .open(aside.join("x.json"))
            .unwrap()
            .set_modified(written)
            .unwrap();
        assert_eq!(holding(dir.path(), SECRET).len(), 3);

        let rows = rows_at_open(dir.path());
        let ids: Vec<_> = rows.iter().map(|r| r.id.as_u128()).collect();
        assert_eq!(ids, [1, 2, 3], "every record once, in order");
        assert!(
            rows.iter().all(|r| r.url == "https://a.b/reset/*"),
            "{rows:?}"
        );
        assert_eq!(rows[0].user_agent, "Mozilla/5.0 *");
        assert_eq!(holding(dir.path(), SECRET), Vec::<String>::new());
        assert_eq!(holding(dir.path(), "jane@"), Vec::<String>::new());
        let modified = fs::metadata(aside.join("x.json"))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(
            modified, written,
            "the retention counts from the file's first writing"
        );
        let copy = fs::read(aside.join("damaged-00000000000000000007.seg")).unwrap();
        assert_eq!(
            &copy[..8],
            MAGIC,
            "the damaged copy in this release's format"
        );
    }

    /// The cursor inside a rewritten segment: what it had passed is left out, the rest read.
    #[test]
    fn what_the_cursor_passed_in_an_earlier_segment_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("segments")).unwrap();
        let mut data = MAGIC_V3.to_vec();
        let mut second = 0;
        for n in [1u128, 2] {
            second = data.len();
            let row = crate::measurement::tests::encoded_in(&leaky(n), 3);
            let record = Record {
                layout: 3,
                rows: 1,
                earliest_received_at: 1,
                payload: row,
            };
            encode_earlier_frame(&mut data, Version::V3, &record);
        }
        fs::write(segment_path(dir.path(), 1), &data).unwrap();
        fs::write(dir.path().join("CURSOR"), format!("1 {second}\n")).unwrap();
        let rows = rows_at_open(dir.path());
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].id.as_u128(), 2);
        assert_eq!(holding(dir.path(), SECRET), Vec::<String>::new());
    }

    /// Records of this release are left as they are at open, a purged site's too (the
    /// writer drops those, counting them).
    #[tokio::test]
    async fn records_of_this_release_are_not_rewritten_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        {
            let (spool, _reader) =
                super::super::open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
            spool
                .append(encode(&[m(1), m(2)]), Duration::from_secs(5))
                .await
                .unwrap();
        }
        let rules = SiteRules::new([("s".to_owned(), Keeps::default(), true)]);
        let (_spool, _reader) = open_shard(
            dir.path(),
            "default",
            1 << 20,
            LAYOUTS,
            Some(&rules),
            metrics.clone(),
        )
        .unwrap();
        assert_eq!(metrics.spool.records.get(), 2);
    }

    /// The cost of the rewrite at open (docs/privacy.md): 20,000 rows of the JSON release in
    /// 2,000 frames, each with a token and an address. Run by hand; a speed figure is not a test.
    #[test]
    #[ignore]
    fn rewrite_cost() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("segments")).unwrap();
        let frames: Vec<Vec<u128>> = (0..2_000u128)
            .map(|f| (f * 10..f * 10 + 10).collect())
            .collect();
        let slices: Vec<&[u128]> = frames.iter().map(Vec::as_slice).collect();
        let segment = v1_segment(&slices);
        fs::write(segment_path(dir.path(), 1), &segment).unwrap();
        let started = std::time::Instant::now();
        let metrics = Arc::new(Metrics::new());
        let opened = open_shard(
            dir.path(),
            "default",
            1 << 30,
            LAYOUTS,
            Some(&rules()),
            metrics,
        );
        let elapsed = started.elapsed();
        let (_spool, mut reader) = opened.unwrap();
        assert_eq!(
            read_all(&mut reader).iter().map(|f| f.rows).sum::<u32>(),
            20_000
        );
        println!(
            "{} bytes of CSPOOL01, 20,000 rows: opened and rewritten in {elapsed:?}",
            segment.len()
        );
    }
}

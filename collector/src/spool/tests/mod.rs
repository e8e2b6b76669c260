//! Unit tests of the spool: format, recovery, group commit, full disk, confirmation.

mod age;
mod damage;
mod disk_faults;
mod earlier_releases;
mod group_commit;
mod identity;
mod prepared;
mod privacy;
mod reading;
mod room;

use std::fs::{self, OpenOptions};
use std::path::Path;

use super::files::*;
use super::format::{encode_earlier_frame, Version, MAGIC_V1};
use super::*;
use crate::measurement::{decode_all, encode, DateTime, Label, Measurement, LAYOUTS};
use uuid::Uuid;

/// A small row whose id and `ttfb_ms` are `n`.
pub(super) fn m(n: u128) -> Measurement<'static> {
    Measurement {
        id: Uuid::from_u128(n),
        site: "s".into(),
        received_at: DateTime(1),
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
        user_agent: "".into(),
        sample_rate: 1.0,
        // What intake derives from no `ts` and an empty user agent.
        page_view_at: DateTime(1),
        device_type: Label("unknown".into()),
        browser: Label("Other".into()),
        browser_version: Label("".into()),
        os: Label("Other".into()),
        // Not empty: a row's last column, so that a frame never ends in a zero byte, which
        // recovery would count with a prepared segment's zeros (the damage tests need the
        // written end to be the frame's end).
        country: Label("ZZ".into()),
        page_group: Label("/".into()),
        ..Default::default()
    }
}

/// One request's rows, encoded as intake encodes them.
fn rows(ms: &[Measurement<'_>]) -> Record {
    encode(ms)
}

/// The whole frame at `off` of a segment of this release: its payload and the offset after it.
fn frame_at(data: &[u8], off: usize) -> Option<(&[u8], usize)> {
    Version::V5.frame_at(data, off).map(|f| (f.payload, f.next))
}

fn measurements(frame: &Frame) -> Vec<Measurement<'static>> {
    decode_all(&frame.payload).unwrap()
}

fn ids(records: &[Frame]) -> Vec<u128> {
    records
        .iter()
        .flat_map(|r| measurements(r).into_iter().map(|m| m.id.as_u128()))
        .collect()
}

/// Appends a frame of the JSON release (`CSPOOL01`): the rows as a JSON array.
fn v1_frame(data: &mut Vec<u8>, ms: &[Measurement<'_>]) {
    let record = Record {
        layout: 1,
        rows: 0,
        earliest_received_at: 0,
        payload: serde_json::to_vec(ms).unwrap(),
    };
    encode_earlier_frame(data, Version::V1, &record);
}

fn read_all(r: &mut SpoolReader) -> Vec<Frame> {
    let mut out = Vec::new();
    r.read_available(u64::MAX, u64::MAX, &mut out);
    out
}

/// Leaves in `dir` a closed spool holding rows 1 to `n`, one request each.
async fn spool_with(dir: &Path, n: u128) {
    let (spool, _reader) = open(dir, 1 << 20, LAYOUTS, Arc::new(Metrics::new())).unwrap();
    for i in 1..=n {
        spool
            .append(rows(&[m(i)]), Duration::from_secs(5))
            .await
            .unwrap();
    }
}

/// Makes writes under `dir` fail with `ENOSPC` (or succeed again).
fn set_full(dir: &Path, full: bool) {
    let mut disks = FULL_DISKS.lock().unwrap();
    disks.retain(|d| d != dir);
    if full {
        disks.push(dir.to_owned());
    }
}

/// Makes writes under `dir` take `t` each (or none).
fn set_slow(dir: &Path, t: Option<Duration>) {
    let mut disks = SLOW_DISKS.lock().unwrap();
    disks.retain(|(d, _)| d != dir);
    if let Some(t) = t {
        disks.push((dir.to_owned(), t));
    }
}

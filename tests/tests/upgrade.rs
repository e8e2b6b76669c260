//! An upgrade over a spool of the release before RowBinary spools (issue 14).
//!
//! `tests/fixtures/spool-v1/` is a spool folder written by that release (git 819a3b7): 40
//! measurements in 12 requests, never delivered (its ClickHouse was unreachable), in the JSON
//! format behind the `CSPOOL01` magic. `tests/fixtures/make-spool-v1.sh` says how it was
//! made. This release must deliver every one of them, with its values, and go on in its own
//! format; `collector spool dump` must list them before that.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;

/// The ids in the fixture's segments, read from the JSON text (independently of the
/// collector's decoder).
fn fixture_ids(dir: &Path) -> Vec<String> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir.join("segments")).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        let text = String::from_utf8_lossy(&data);
        for part in text.split("\"id\":\"").skip(1) {
            ids.push(part[..36].to_owned());
        }
    }
    assert_eq!(ids.len(), 40, "the fixture holds 40 measurements");
    ids
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_of_the_previous_release_is_delivered_after_the_upgrade() {
    let stack = Stack::shared();
    let env = TestEnv::new(stack).await;
    let fixture = root().join("tests/fixtures/spool-v1");
    let ids = fixture_ids(&fixture);
    let spool = tempfile::tempdir().unwrap();
    copy_dir(&fixture, spool.path());
    let spool_dir = spool.path().to_str().unwrap();

    // The dump lists every measurement the old spool holds, without taking its lock.
    let dump = env.cli_with(&[("COLLECTOR_SPOOL_DIR", spool_dir)], &["spool", "dump"]);
    dump.success();
    let mut listed: Vec<String> = dump
        .stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["row"]["id"].as_str().unwrap().to_owned()
        })
        .collect();
    listed.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(listed, expected, "{}", dump.stderr);
    assert!(dump.stderr.contains("40 rows"), "{}", dump.stderr);

    let c = env.collector(&[("COLLECTOR_SPOOL_DIR", spool_dir)]).await;
    let rows = env.wait_rows(&ids, Duration::from_secs(60)).await;
    assert_eq!(rows.len(), 40);
    for r in &rows {
        assert_eq!(r["site"], "upgrade-fixture", "{r}");
        assert!(
            r["url"].as_str().unwrap().ends_with("?q=%C3%BC"),
            "the URL as stored then: {r}"
        );
        assert_eq!(r["user_agent"], "fixture/1", "{r}");
        assert_eq!(r["navigation_type"], "navigate", "{r}");
        assert_eq!(r["viewport_width"], 390, "{r}");
        assert_eq!(r["sample_rate"], 1.0, "{r}");
        let lcp = r["lcp_ms"].as_f64().unwrap();
        assert!(lcp > 1000.0 && lcp.fract() == 0.5, "{r}");
    }
    env.assert_stored_once(&ids, Duration::from_secs(60)).await;

    // New beacons go on in this release's format, after the old segment.
    let (id, m) = measurement(&env.site);
    let (status, body) = c.post_json(&m).await;
    assert_eq!(status, 202, "{body}");
    env.wait_rows(&[id], Duration::from_secs(60)).await;
    c.wait_metric("collector_spool_records 0", Duration::from_secs(60))
        .await;
    // Every append waited for a group commit, and the histogram of their durations says so.
    assert!(
        c.metric("collector_spool_sync_duration_seconds_count")
            .await
            >= 1.0,
        "no group commit timed"
    );
    let mut magics = Vec::new();
    for entry in std::fs::read_dir(spool.path().join("segments")).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        magics.push(String::from_utf8_lossy(&data[..8]).into_owned());
    }
    assert!(
        magics.iter().all(|m| m == "CSPOOL03"),
        "the delivered old segment is gone and new ones are this release's RowBinary (v3): {magics:?}"
    );
}

//! A full disk below the spool bound (issue 12): the spool folder on a 256 KiB tmpfs that this
//! test mounts, `COLLECTOR_SPOOL_MAX_BYTES` far above it, the collector's only ClickHouse
//! replica stopped. Real PostgreSQL, ZooKeeper and ClickHouse (the failover stack, whose
//! replica 1 this test stops and starts, so it takes its turn like `failover.rs`).
//!
//! Proves: the disk fills → `/readyz` 503 naming the full disk, intake 503 with `Retry-After`,
//! `collector_spool_disk_full 1`; ClickHouse back → the spool drains, its full segment is
//! deleted, `/readyz` 200 and intake 202 again without a restart; every acknowledged id
//! stored once; then full again, `kill -9`, a restart on the full disk → `/healthz` 200,
//! `/readyz` 503, what the spool held delivered, then ready. Needs root (to mount the tmpfs):
//! without it the test fails, saying so (a test that cannot run here does not pass).

use collector_tests::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// Size of the tmpfs under the spool.
const TMPFS_SIZE: &str = "256k";
/// Generous limit on every wait: a loaded 2-core machine, a ClickHouse 18.16 restart.
const WAIT: Duration = Duration::from_secs(120);
/// Most beacons sent while filling the disk before the test gives up (a 256 KiB disk holds
/// a few hundred).
const FILL_MAX: usize = 20_000;

/// A tmpfs mounted for this test; unmounted when dropped, also when the test panics.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size`; fails the test when it cannot (not root: a test that cannot
    /// run here fails, it does not pass).
    fn mount(size: &str) -> Tmpfs {
        let uid = Command::new("id").arg("-u").output().expect("run id -u");
        assert_eq!(
            String::from_utf8_lossy(&uid.stdout).trim(),
            "0",
            "disk_full needs root to mount a tmpfs: the full-disk promise cannot be tested as this user"
        );
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mount -t tmpfs {}: {}",
            dir.path().display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(self.dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Still busy (a process being killed): detach it now, freed when it goes.
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}

/// POSTs one fresh measurement; its id, the status and the `Retry-After` header.
async fn post_one(c: &Collector, site: &str) -> (String, u16, Option<String>, String) {
    let (id, m) = measurement(site);
    let (status, body, headers) = c
        .post(
            m.to_string(),
            // With an Origin, as a browser sends it: requests without one draw on a tenth of
            // the site's budget (contract v4), which a fill at full speed would exceed.
            &[
                ("content-type", "application/json"),
                ("origin", "https://shop.example"),
            ],
        )
        .await;
    let retry_after = headers
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (id, status, retry_after, body.to_string())
}

/// Sends beacons one at a time until one is refused; returns the ids acknowledged before.
/// Panics unless the refusal is a 503 with `Retry-After`.
async fn fill(c: &Collector, site: &str) -> Vec<String> {
    let mut acked = Vec::new();
    for _ in 0..FILL_MAX {
        let (id, status, retry_after, body) = post_one(c, site).await;
        match status {
            202 => acked.push(id),
            503 => {
                assert!(
                    retry_after.is_some(),
                    "503 without Retry-After while filling: {body}"
                );
                assert!(
                    body.contains("disk full"),
                    "the refusal names the full disk: {body}"
                );
                return acked;
            }
            other => panic!("{other} while filling the disk: {body}"),
        }
    }
    panic!(
        "{FILL_MAX} beacons acknowledged and the 256 KiB disk never filled:\n{}",
        c.logs()
    );
}

/// `GET /readyz`: status and body.
async fn readyz(c: &Collector) -> (u16, String) {
    match http().get(format!("{}/readyz", c.admin_url)).send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            let body = r
                .text()
                .await
                .unwrap_or_else(|e| format!("(the body cannot be read: {e})"));
            (status, body)
        }
        Err(e) => (0, e.to_string()),
    }
}

/// Waits until `/readyz` answers `status` (with `body_has` in its body); how long it took.
async fn wait_readyz(c: &Collector, status: u16, body_has: &str) -> Duration {
    let start = Instant::now();
    loop {
        let (s, body) = readyz(c).await;
        if s == status && body.contains(body_has) {
            return start.elapsed();
        }
        if start.elapsed() >= WAIT {
            c.diag.give_up(format!("/readyz never answered {status} with {body_has:?} in {WAIT:?}; last {s}: {body}\n\
             metrics spool_disk_full={:?}\nlog:\n{}",
            c.metric_if_present("collector_spool_disk_full").await,
            c.logs())).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Segment files in the spool and their sizes.
fn segments(spool: &Path) -> Vec<(PathBuf, u64)> {
    let mut out: Vec<(PathBuf, u64)> = std::fs::read_dir(spool.join("segments"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.path(), e.metadata().unwrap().len())
        })
        .collect();
    out.sort();
    out
}

fn assert_not_full(c: &Collector, spool: &Path, before: &[(PathBuf, u64)]) {
    let now = segments(spool);
    for (path, _) in before {
        assert!(
            !now.iter().any(|(p, _)| p == path),
            "the drained segment {} is still there: {now:?}\nlog:\n{}",
            path.display(),
            c.logs()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_turns_not_ready_and_recovers_by_itself_also_across_a_restart() {
    let _turn = FAILOVER_TURN.lock().await;
    let tmpfs = Tmpfs::mount(TMPFS_SIZE);
    let stack = Stack::failover();
    stack.restore().await;
    let env = TestEnv::new(stack).await;
    let url = stack.clickhouse_urls()[0].clone();
    let spool = tmpfs.path().join("spool");
    stack.replica(1).stop().unwrap();
    let mut c = env
        .collector(&[
            ("COLLECTOR_SPOOL_DIR", spool.to_str().unwrap()),
            ("COLLECTOR_SPOOL_MAX_BYTES", "1073741824"),
            ("COLLECTOR_CLICKHOUSE_URLS", &url),
        ])
        .await;
    wait_readyz(&c, 200, "ready").await;

    // 1. Fill the disk while ClickHouse is away.
    let mut acked = fill(&c, &env.site).await;
    assert!(
        !acked.is_empty(),
        "nothing acknowledged before the disk was full"
    );
    let first_fill = acked.len();
    full_disk_refuses(&c, &env.site).await;
    let full_segments = segments(&spool);
    assert!(!full_segments.is_empty());

    // 2. ClickHouse returns: the spool drains, frees the disk and is ready again by itself.
    stack.replica(1).start().unwrap();
    let back = Instant::now();
    wait_readyz(&c, 200, "ready").await;
    let recovered = back.elapsed();
    assert_eq!(c.metric("collector_spool_disk_full").await, 0.0);
    assert_not_full(&c, &spool, &full_segments);
    let (id, status, _, body) = post_one(&c, &env.site).await;
    assert_eq!(status, 202, "intake after the disk drained: {body}");
    acked.push(id);
    env.assert_stored_once(&acked, WAIT).await;
    c.wait_metric("collector_spool_records 0", WAIT).await;

    // 3. Full again, killed, restarted on the full disk: alive, not ready, delivers, ready.
    stack.replica(1).stop().unwrap();
    let second = fill(&c, &env.site).await;
    assert!(
        !second.is_empty(),
        "nothing acknowledged at the second fill"
    );
    let second_fill = second.len();
    acked.extend(second);
    wait_readyz(&c, 503, "disk full").await;
    let held = segments(&spool);
    c.restart().await; // SIGKILL, then start; waits for /healthz 200 (panics if it exits)
    alive_and_not_ready_on_a_full_disk(&c).await;
    stack.replica(1).start().unwrap();
    let back = Instant::now();
    wait_readyz(&c, 200, "ready").await;
    let recovered_after_restart = back.elapsed();
    assert_not_full(&c, &spool, &held);
    env.assert_stored_once(&acked, WAIT).await;
    let (id, status, _, body) = post_one(&c, &env.site).await;
    assert_eq!(status, 202, "intake after the restart drained: {body}");
    acked.push(id);
    env.assert_stored_once(&acked, WAIT).await;

    // One warning per entry into the state, not one per refused beacon.
    let log = c.logs();
    let warnings = log
        .lines()
        .filter(|l| l.contains("intake and /readyz answer 503 until it can write again"))
        .count();
    assert!(
        (3..=6).contains(&warnings),
        "{warnings} disk-full warnings for three entries:\n{log}"
    );
    eprintln!(
        "disk_full: {first_fill} beacons acknowledged before the 256 KiB disk was full \
         ({second_fill} at the second fill); ready again {recovered:.1?} after ClickHouse \
         returned, {recovered_after_restart:.1?} after it returned following the restart"
    );
    drop(c);
    drop(tmpfs);
}

/// While the disk is full: `/readyz` of `c` is 503 naming the cause, the metric says so, and a
/// beacon of `site` is answered 503 with `Retry-After`.
async fn full_disk_refuses(c: &Collector, site: &str) {
    let (status, body) = readyz(c).await;
    assert_eq!(status, 503, "/readyz while the disk is full: {body}");
    assert!(
        body.contains("disk full"),
        "/readyz names the cause: {body}"
    );
    assert_eq!(c.metric("collector_spool_disk_full").await, 1.0);
    let (_, status, retry_after, body) = post_one(c, site).await;
    assert_eq!(status, 503, "intake while the disk is full: {body}");
    assert!(retry_after.is_some(), "503 without Retry-After: {body}");
}

/// After a start on a full disk: `c` is alive (`/healthz` 200), not ready (503, "disk full"),
/// says so in its metric and logs the start.
async fn alive_and_not_ready_on_a_full_disk(c: &Collector) {
    assert_eq!(c.status_of("/healthz").await, 200);
    let (status, body) = readyz(c).await;
    assert_eq!(status, 503, "/readyz after a start on a full disk: {body}");
    assert!(body.contains("disk full"), "{body}");
    assert_eq!(c.metric("collector_spool_disk_full").await, 1.0);
    assert!(
        c.logs().contains("spool: cannot start a segment at open"),
        "the start on a full disk is logged"
    );
}

//! A disk whose every `fdatasync` fails for 10 s (issue 39; cf. nats-server #7654), under a
//! real collector on the real spool: libfiu's POSIX preload (Debian's `fiu-utils`, installed by
//! `scripts/stack.sh install`) fails `fdatasync` with `EIO`, switched on and off with
//! `fiu-ctrl` while the process runs; writes, `fsync` and `fallocate` keep working, which is
//! what let the spool's trial pass while every group commit failed.
//!
//! Proves, for the whole spell: every `/readyz` sample 503 and every beacon 503 with
//! `Retry-After`; one warning when the spell starts; at most one new segment file; then, once
//! syncs work, one line when a real sync succeeds, `/readyz` 200 and 202 again without a restart,
//! and every acknowledged id (before and after) stored once.

use collector_tests::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// What `fiu-run -x` preloads: the remote control (the FIFO `fiu-ctrl` writes to) and the
/// POSIX wrappers.
const FIU_PRELOAD: &str = "/usr/lib/fiu/fiu_run_preload.so /usr/lib/fiu/fiu_posix_preload.so";
/// libfiu's failure point for `fdatasync`; `failinfo=5` makes it fail with `EIO` (else a
/// random errno of the call's list).
const FDATASYNC_FAILS: &str = "enable name=posix/io/sync/fdatasync,failinfo=5";
/// How long every sync fails: the spell.
const SPELL: Duration = Duration::from_secs(10);
/// Between two `/readyz` samples in the spell; a beacon is sent every third sample.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Generous limit on every wait: a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(60);
/// Beacons acknowledged before and after the spell, each.
const OUTSIDE: usize = 20;

/// Runs `fiu-ctrl -c COMMAND PID` against the collector's control FIFOs at `prefix`; panics
/// with its output when it fails or complains (it exits 0 on an unknown pid).
fn fiu_ctrl(prefix: &Path, pid: u32, command: &str) {
    let out = Command::new("fiu-ctrl")
        .arg("-f")
        .arg(prefix)
        .args(["-c", command])
        .arg(pid.to_string())
        .output()
        .expect("run fiu-ctrl (scripts/stack.sh install: Debian package fiu-utils)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "fiu-ctrl -c {command:?} {pid}: {}: {said}",
        out.status
    );
}

/// The numbers of the segment files in the spool folder.
fn segment_numbers(spool: &Path) -> Vec<u64> {
    let dir = spool.join("segments");
    let mut numbers: Vec<u64> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".seg")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("a file in segments/ that is no segment: {name}"))
        })
        .collect();
    numbers.sort_unstable();
    numbers
}

/// `GET /readyz`: status and body; panics when there is no answer.
async fn readyz(c: &Collector) -> (u16, String) {
    let url = format!("{}/readyz", c.admin_url);
    let r = http()
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: no answer: {e}"));
    let status = r.status().as_u16();
    (status, r.text().await.expect("the /readyz body"))
}

/// Sends `n` fresh beacons, each of which must be acknowledged; their ids.
async fn send_acked(c: &Collector, site: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        let (id, m) = measurement(site);
        let (status, body) = c.post_json(&m).await;
        assert_eq!(
            status,
            202,
            "a beacon while syncs work: {body}\n{}",
            c.logs()
        );
        ids.push(id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sync_failing_for_10_s_keeps_the_collector_unready_in_one_new_segment() {
    let env = TestEnv::new(Stack::shared()).await;
    let fifo = tempfile::tempdir().unwrap();
    let prefix = fifo.path().join("fiu-ctrl");
    let c = collector_under_fiu(&env, &prefix).await;
    let spool = c.spool.path().to_owned();

    let mut acked = send_acked(&c, &env.site, OUTSIDE).await;
    // Delivered first, so that no confirmation's cursor sync fails inside the spell.
    c.wait_metric("collector_spool_records 0", WAIT).await;
    let before = segment_numbers(&spool);
    let last_before = *before.last().expect("a segment is open");
    let log_before = c.logs().len();

    fiu_ctrl(&prefix, c.pid(), FDATASYNC_FAILS);
    let spell = Instant::now();
    let Spell {
        samples,
        not_ready,
        refused,
        ready_samples,
        last_seen,
    } = sample_the_spell(&c, &env.site, &spool, last_before, spell).await;
    fiu_ctrl(&prefix, c.pid(), "disable name=posix/io/sync/fdatasync");
    let back = Instant::now();
    assert!(
        ready_samples.is_empty(),
        "/readyz was not 503 in {} of {samples} samples while every fdatasync failed: {ready_samples:?}\n{}",
        ready_samples.len(),
        c.logs()
    );
    assert!(
        last_seen - last_before <= 1,
        "{} new segment files in the spell (at most one: the trials share it); numbers before \
         {before:?}, now {:?}",
        last_seen - last_before,
        segment_numbers(&spool)
    );

    // Syncs work again: ready within a few trials (one every 0.5 s; 10 s is the tolerance of
    // a loaded machine), and 202 again.
    ready_again_within_10_s(&c, back).await;
    let ready_after = back.elapsed();
    acked.extend(send_acked(&c, &env.site, OUTSIDE).await);
    env.assert_stored_once(&acked, WAIT).await;
    let after = segment_numbers(&spool);
    assert!(
        after.last().is_some_and(|&n| n - last_before <= 1),
        "the first writes after the spell go to the trials' segment: before {before:?}, after {after:?}"
    );

    // The spool's one warning when the spell starts, one line when a real sync succeeds
    // again. (Intake's own line per refused beacon, limited to one a second, is not the
    // spool's; a confirmation that landed as the spell began may fail its cursor sync, as it
    // should.)
    spool_logs_the_spell_once(&c.logs()[log_before..]);
    eprintln!(
        "sync_fails: {samples} /readyz samples in the {SPELL:?} spell, {not_ready} answered 503; \
         {refused} beacons refused with 503; {} new segment file(s); ready {ready_after:.1?} \
         after fdatasync worked again; {} acknowledged ids stored once",
        last_seen - last_before,
        acked.len()
    );
}

/// A collector on `env` run as `fiu-run -x -f PREFIX collector serve` runs it (libfiu
/// preloaded, its control FIFO under `prefix`); panics when the FIFO is missing.
async fn collector_under_fiu(env: &TestEnv<'_>, prefix: &std::path::Path) -> Collector {
    // What `fiu-run -x -f PREFIX collector serve` exports before it execs the collector.
    let c = env
        .collector(&[
            ("LD_PRELOAD", FIU_PRELOAD),
            ("FIU_CTRL_FIFO", prefix.to_str().unwrap()),
            ("FIU_ENABLE", ""),
        ])
        .await;
    let control = prefix.with_file_name(format!("fiu-ctrl-{}.in", c.pid()));
    assert!(
        control.exists(),
        "libfiu's control FIFO {} is missing: the preload did not load (scripts/stack.sh \
         install: Debian package fiu-utils)\n{}",
        control.display(),
        c.logs()
    );
    c
}

/// What the spell's samples saw.
struct Spell {
    /// `/readyz` samples taken.
    samples: usize,
    /// Of them, answered 503.
    not_ready: usize,
    /// Beacons refused with 503 (each asserted so, with `Retry-After`).
    refused: usize,
    /// The samples not answered 503: status, time into the spell and body.
    ready_samples: Vec<String>,
    /// The highest segment number seen.
    last_seen: u64,
}

/// Samples `c` for [`SPELL`] from `spell` on, while every fdatasync fails: `/readyz` every
/// [`SAMPLE_EVERY`], a beacon of `site` every third sample (each must be 503 with
/// `Retry-After`), and the segment numbers of `spool` (from `last_before`).
async fn sample_the_spell(
    c: &Collector,
    site: &str,
    spool: &std::path::Path,
    last_before: u64,
    spell: Instant,
) -> Spell {
    let (mut samples, mut not_ready, mut refused) = (0, 0, 0);
    let mut ready_samples = Vec::new();
    let mut last_seen = last_before;
    while spell.elapsed() < SPELL {
        if samples % 3 == 0 {
            let (id, m) = measurement(site);
            let (status, body, headers) = c
                .post(m.to_string(), &[("content-type", "application/json")])
                .await;
            assert_eq!(
                status,
                503,
                "beacon {id} at {:.1?} into the spell, while every fdatasync fails: {body}\n{}",
                spell.elapsed(),
                c.logs()
            );
            assert!(
                headers.contains_key("retry-after"),
                "503 without Retry-After: {body}"
            );
            refused += 1;
        }
        let (status, body) = readyz(c).await;
        samples += 1;
        if status == 503 {
            not_ready += 1;
        } else {
            ready_samples.push(format!("{status} at {:.1?}: {body}", spell.elapsed()));
        }
        last_seen = last_seen.max(*segment_numbers(spool).last().unwrap_or(&0));
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    Spell {
        samples,
        not_ready,
        refused,
        ready_samples,
        last_seen,
    }
}

/// Syncs work again since `back`: `c` is ready within a few trials (one every 0.5 s; 10 s is
/// the tolerance of a loaded machine).
async fn ready_again_within_10_s(c: &Collector, back: Instant) {
    loop {
        let (status, body) = readyz(c).await;
        if status == 200 {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "/readyz still {status} 10 s after fdatasync works again: {body}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The spool's one warning in `spell_log` (the collector's log since the spell began) when the
/// spell starts, and one line when a real sync succeeds again.
fn spool_logs_the_spell_once(spell_log: &str) {
    let warnings: Vec<&str> = warning_lines(spell_log)
        .into_iter()
        .filter(|l| {
            l.contains(" collector::spool") && !l.contains("spool: cannot record the cursor")
        })
        .collect();
    assert!(
        warnings.len() == 1
            && warnings[0].contains("spool: write or sync failed")
            && warnings[0].contains("until it can write again"),
        "the spool's one warning for the spell, the failed sync's: {warnings:#?}\n{spell_log}"
    );
    let writing_again = spell_log
        .lines()
        .filter(|l| l.contains("spool: writing again"))
        .count();
    assert_eq!(
        writing_again, 1,
        "one line when a sync succeeds again:\n{spell_log}"
    );
}

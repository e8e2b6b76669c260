//! The writer against in-memory ClickHouse servers: batching, bisection of a refused batch,
//! replica choice and failover, catch-up gating, a hanging replica, the drain deadline and a
//! refusal storm. Bounds are derived from the writer's own constants.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use collector::writer::probe::{PROBE_INTERVAL, PROBE_TIMEOUT};
use collector::writer::replicas::{FAILURES_TO_DOWN, PASSES_TO_HEALTHY, PROBE_FAILURES_TO_DOWN};
use collector::writer::{BACKOFF_MAX, BACKOFF_MIN, DRAIN_DEADLINE};
use serde_json::Value;
use uuid::Uuid;

use crate::common::clickhouse::InsertRecord;
use crate::common::{beacon, wait_until, App, ClickHouse, Fault, Sites};

const SITE: &str = "shop";

/// `n` fresh beacons as one request body (a JSON array), and their ids.
fn array(n: usize) -> (Vec<Uuid>, Value) {
    let (ids, items): (Vec<Uuid>, Vec<Value>) = (0..n).map(|_| beacon(SITE)).unzip();
    (ids, Value::Array(items))
}

/// Sends `body` and asserts the 202 (durable in the spool).
async fn accepted(app: &App, body: &Value) {
    let answer = app.send(body).await;
    assert_eq!(answer.status, 202, "{}", answer.text());
}

/// Sends one row and waits until `ch` holds it: the writer's first probe round is then over
/// and found a server that knows `insert_deduplication_token` (a round that fails leaves
/// tokens off until one passes). Returns the row's id.
async fn one_row_stored(app: &App, ch: &ClickHouse) -> Vec<Uuid> {
    let (sent, body) = array(1);
    accepted(app, &body).await;
    holds(ch, &sent, Duration::from_secs(5)).await;
    sent
}

/// Ids stored in `ch`, in insert order.
fn ids(ch: &ClickHouse) -> Vec<Uuid> {
    ch.rows().iter().map(|r| r.id).collect()
}

/// How often each id is stored, over `servers`.
fn counts(servers: &[&ClickHouse]) -> HashMap<Uuid, usize> {
    let mut counts = HashMap::new();
    for ch in servers {
        for id in ids(ch) {
            *counts.entry(id).or_insert(0) += 1;
        }
    }
    counts
}

/// Asserts that `servers` together hold exactly `expected`, each id once.
fn stored_once(servers: &[&ClickHouse], expected: &[Uuid]) {
    let counts = counts(servers);
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "stored more than once: {twice:?}");
    let mut got: Vec<Uuid> = counts.into_keys().collect();
    let mut want = expected.to_vec();
    got.sort();
    want.sort();
    assert_eq!(
        got, want,
        "stored ids (left) against acknowledged ids (right)"
    );
}

/// Waits until `ch` holds every id of `want`.
async fn holds(ch: &ClickHouse, want: &[Uuid], timeout: Duration) {
    let what = format!("{} given rows in {}", want.len(), ch.url());
    wait_until(&what, timeout, || async {
        let got = ids(ch);
        want.iter().all(|id| got.contains(id))
    })
    .await;
}

/// `collector_clickhouse_replica_state` of `ch`: 0 down, 1 catching up, 2 healthy.
async fn state(app: &App, ch: &ClickHouse) -> f64 {
    let series = format!(
        "collector_clickhouse_replica_state{{replica=\"{}\",shard=\"default\"}}",
        ch.url()
    );
    app.metric(&series).await
}

/// `collector_clickhouse_active_replica` of `ch`: 1 when written to.
async fn active(app: &App, ch: &ClickHouse) -> f64 {
    let series = format!(
        "collector_clickhouse_active_replica{{replica=\"{}\",shard=\"default\"}}",
        ch.url()
    );
    app.metric(&series).await
}

/// `collector_clickhouse_insert_errors_total` of `ch` and `kind`.
async fn insert_errors(app: &App, ch: &ClickHouse, kind: &str) -> f64 {
    let series = format!(
        "collector_clickhouse_insert_errors_total{{replica=\"{}\",shard=\"default\",kind=\"{kind}\"}}",
        ch.url()
    );
    app.metric(&series).await
}

/// Waits until `ch` has answered `n` more probes than `from` (each counted when its first
/// query is answered; a round's results are recorded before the next round begins, so `n`
/// more counted means `n - 1` whole probes recorded).
async fn probes_after(ch: &ClickHouse, from: u64, n: u64) {
    let what = format!("{n} more probes of {}", ch.url());
    let timeout = PROBE_INTERVAL * (n as u32 + 2);
    wait_until(&what, timeout, || async { ch.probes() >= from + n }).await;
}

#[tokio::test]
async fn batches_hold_at_most_max_rows_and_a_partial_one_waits_for_max_age() {
    const MAX_AGE: Duration = Duration::from_secs(3);
    let ch = ClickHouse::start().await;
    let app = App::start(
        Sites::with(&[SITE]),
        &[&ch],
        &[("--batch-max-rows", "10"), ("--batch-max-age", "3s")],
    )
    .await;
    let first_sent = Instant::now();
    let mut sent = Vec::new();
    let mut last_batch_sent = first_sent;
    for i in 0..25 {
        if i == 20 {
            last_batch_sent = Instant::now();
        }
        let (id, body) = beacon(SITE);
        accepted(&app, &body).await;
        sent.push(id);
    }
    // Two full batches go at once, long before their age.
    wait_until("20 rows stored", MAX_AGE, || async {
        ch.rows().len() >= 20
    })
    .await;
    assert!(
        first_sent.elapsed() < MAX_AGE,
        "the full batches waited for their age: {:?}",
        first_sent.elapsed()
    );
    // The last five wait for the age of their oldest frame (read no earlier than it was sent).
    wait_until(
        "25 rows stored",
        MAX_AGE + Duration::from_secs(3),
        || async { ch.rows().len() >= 25 },
    )
    .await;
    let waited = last_batch_sent.elapsed();
    assert!(
        waited >= MAX_AGE,
        "the partial batch went after {waited:?}, before --batch-max-age"
    );
    let log = ch.insert_log();
    let sizes: Vec<usize> = log.iter().map(|r| r.rows).collect();
    assert_eq!(sizes, [10, 10, 5], "rows per INSERT: {log:?}");
    assert!(log.iter().all(|r| !r.folded && !r.answer_lost), "{log:?}");
    assert_eq!(ids(&ch), sent, "each id once, in the order sent");
    assert_eq!(ch.inserts(), 3);
    app.stop(false).await;
}

#[tokio::test]
async fn a_refused_batch_is_bisected_and_only_the_refused_row_is_kept_aside() {
    let ch = ClickHouse::start().await;
    ch.poison("poison");
    let app = App::start(Sites::with(&[SITE]), &[&ch], &[]).await;
    // One request, one frame, one batch: 16 good rows and, at index 5, a refused one.
    let (mut good, mut body) = array(16);
    let (bad, mut bad_body) = beacon(SITE);
    bad_body["url"] = "https://shop.example/poison/1".into();
    body.as_array_mut().unwrap().insert(5, bad_body);
    accepted(&app, &body).await;

    holds(&ch, &good, Duration::from_secs(10)).await;
    wait_until("one kept-aside row", Duration::from_secs(5), || async {
        app.metric("collector_spool_kept_aside_rows_total").await >= 1.0
    })
    .await;
    stored_once(&[&ch], &good);
    assert!(!ids(&ch).contains(&bad), "the refused row is not stored");
    assert_eq!(
        app.metric("collector_spool_kept_aside_rows_total").await,
        1.0
    );
    assert_eq!(app.metric("collector_spool_kept_aside_total").await, 1.0);
    // Halving 17 rows with the bad one at index 5 (refused.rs): 0..17 refused, 0..8 refused,
    // 8..17 stored, 0..4 stored, 4..8 refused, 4..6 refused, 6..8 stored, 4..5 stored, 5..6
    // refused and kept aside: 5 refusals, 4 stored pieces of 9, 4, 2 and 1 rows.
    assert_eq!(ch.refused_inserts(), 5);
    assert_eq!(insert_errors(&app, &ch, "permanent").await, 5.0);
    let sizes: Vec<usize> = ch.insert_log().iter().map(|r| r.rows).collect();
    assert_eq!(sizes, [9, 4, 2, 1]);

    // The dead-letter file: kept-aside/<segment>-<offset>-<first row>.json, the row's id in it.
    let dir = app.spool.path().join("kept-aside");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_str().unwrap().to_owned();
    assert!(name.ends_with("-000005.json"), "{name}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let kept: Value = serde_json::from_str(&text).unwrap();
    let rows = kept["measurements"].as_array().expect("measurements");
    assert_eq!(rows.len(), 1, "{text}");
    assert_eq!(rows[0]["id"], bad.to_string(), "{text}");
    assert!(
        kept["reason"].as_str().unwrap().contains("Code: 27"),
        "{text}"
    );

    // The batch is done: the next beacon is stored, nothing is resent or refused again.
    let (id, body) = beacon(SITE);
    accepted(&app, &body).await;
    holds(&ch, &[id], Duration::from_secs(5)).await;
    good.push(id);
    stored_once(&[&ch], &good);
    assert_eq!(ch.refused_inserts(), 5);
    app.stop(false).await;
}

/// Rows go to the preferred replica `ch0`; once it refuses every request, the next rows go to
/// `ch1` after [`FAILURES_TO_DOWN`] failed attempts, and `ch0` is down (taken down by its
/// inserts: it then needs a trial insert to return). Returns the ids stored so far.
async fn fail_over(app: &App, ch0: &ClickHouse, ch1: &ClickHouse) -> Vec<Uuid> {
    let (mut sent, body) = array(5);
    accepted(app, &body).await;
    holds(ch0, &sent, Duration::from_secs(5)).await;
    assert!(
        ch1.rows().is_empty(),
        "the preferred replica takes the rows"
    );
    assert_eq!(state(app, ch0).await, 2.0);
    assert_eq!(active(app, ch0).await, 1.0);

    ch0.set_fault(Fault::Refuse);
    let (next, body) = array(5);
    accepted(app, &body).await;
    // Three failed attempts with backoffs of at most 100 ms and 200 ms, then replica 1.
    holds(ch1, &next, Duration::from_secs(5)).await;
    sent.extend(&next);
    assert_eq!(ids(ch0), sent[..5], "nothing more on the refusing replica");
    stored_once(&[ch0, ch1], &sent);
    assert_eq!(state(app, ch0).await, 0.0, "down");
    assert_eq!(state(app, ch1).await, 2.0);
    assert_eq!(active(app, ch0).await, 0.0);
    assert_eq!(active(app, ch1).await, 1.0);
    assert_eq!(
        insert_errors(app, ch0, "transient").await,
        FAILURES_TO_DOWN as f64,
        "down after exactly FAILURES_TO_DOWN failed inserts"
    );
    assert_eq!(app.metric("collector_batches_retried_total").await, 3.0);
    assert_eq!(
        app.metric("collector_clickhouse_failovers_total").await,
        1.0
    );
    sent
}

#[tokio::test]
async fn the_preferred_replica_is_written_to_and_a_refusing_one_is_failed_over() {
    let (ch0, ch1) = (ClickHouse::start().await, ClickHouse::start().await);
    let app = App::start(Sites::with(&[SITE]), &[&ch0, &ch1], &[]).await;
    let mut sent = fail_over(&app, &ch0, &ch1).await;
    // Later beacons stay on replica 1 while replica 0 refuses.
    let (next, body) = array(3);
    accepted(&app, &body).await;
    holds(&ch1, &next, Duration::from_secs(5)).await;
    sent.extend(&next);
    assert_eq!(ch0.rows().len(), 5);
    stored_once(&[&ch0, &ch1], &sent);
    app.stop(false).await;
}

#[tokio::test]
async fn a_returning_replica_is_gated_on_catching_up_then_on_a_trial_insert() {
    let (ch0, ch1) = (ClickHouse::start().await, ClickHouse::start().await);
    let app = App::start(Sites::with(&[SITE]), &[&ch0, &ch1], &[]).await;
    let mut sent = fail_over(&app, &ch0, &ch1).await;

    // Replica 0 answers again but lags. Taken down by inserts, it stays down (0) while its
    // probes lag: lagging probes do not count as passes (replicas.rs module doc).
    ch0.set_lagging(true);
    ch0.set_fault(Fault::None);
    let from = ch0.probes();
    let (a, body) = array(3);
    accepted(&app, &body).await;
    probes_after(&ch0, from, PASSES_TO_HEALTHY as u64 + 1).await;
    let (b, body) = array(3);
    accepted(&app, &body).await;
    holds(&ch1, &a, Duration::from_secs(5)).await;
    holds(&ch1, &b, Duration::from_secs(5)).await;
    sent.extend(a.iter().chain(&b));
    assert_eq!(ch0.rows().len(), 5, "nothing written to a lagging replica");
    assert_eq!(state(&app, &ch0).await, 0.0, "down while it lags");
    assert_eq!(active(&app, &ch1).await, 1.0);

    // Caught up: after PASSES_TO_HEALTHY passing probes it is ready for a trial, but stays down
    // until a batch comes (no trial without traffic).
    ch0.set_lagging(false);
    let from = ch0.probes();
    probes_after(&ch0, from, PASSES_TO_HEALTHY as u64 + 1).await;
    assert_eq!(state(&app, &ch0).await, 0.0, "down until a trial insert");
    assert_eq!(active(&app, &ch1).await, 1.0);
    assert_eq!(ch0.rows().len(), 5);

    // The next batch is the trial: it lands on replica 0, which is healthy and active at once.
    let (trial, body) = array(2);
    accepted(&app, &body).await;
    holds(&ch0, &trial, Duration::from_secs(5)).await;
    sent.extend(&trial);
    wait_until("replica 0 healthy", Duration::from_secs(2), || async {
        state(&app, &ch0).await == 2.0
    })
    .await;
    assert_eq!(active(&app, &ch0).await, 1.0);
    assert_eq!(active(&app, &ch1).await, 0.0);

    // And later beacons land on replica 0 again.
    let ch1_rows = ch1.rows().len();
    let (later, body) = array(4);
    accepted(&app, &body).await;
    holds(&ch0, &later, Duration::from_secs(5)).await;
    sent.extend(&later);
    assert_eq!(ch1.rows().len(), ch1_rows, "nothing more on replica 1");
    stored_once(&[&ch0, &ch1], &sent);
    app.stop(false).await;
}

#[tokio::test]
async fn a_hanging_replica_is_failed_over_once_its_probes_mark_it_down() {
    let (ch0, ch1) = (ClickHouse::start().await, ClickHouse::start().await);
    let app = App::start(Sites::with(&[SITE]), &[&ch0, &ch1], &[]).await;
    let mut sent = one_row_stored(&app, &ch0).await;

    // Replica 0 takes requests and never answers. The insert into it waits for its answer
    // (END_TIMEOUT, 20 s, per attempt) unless the replica is marked down meanwhile: failed
    // probes do that, PROBE_FAILURES_TO_DOWN in a row, each failing after PROBE_TIMEOUT, the
    // first starting within PROBE_INTERVAL; then one backoff and the batch goes to replica 1.
    ch0.set_fault(Fault::Hang);
    let hung = Instant::now();
    let (next, body) = array(5);
    accepted(&app, &body).await;
    let bound = PROBE_INTERVAL
        + PROBE_TIMEOUT * PROBE_FAILURES_TO_DOWN
        + BACKOFF_MIN
        + Duration::from_secs(3);
    holds(&ch1, &next, bound).await;
    let took = hung.elapsed();
    eprintln!("a hanging replica: rows on replica 1 after {took:?} (bound {bound:?})");
    sent.extend(&next);
    stored_once(&[&ch0, &ch1], &sent);
    assert_eq!(ch0.rows().len(), 1);
    assert_eq!(state(&app, &ch0).await, 0.0, "down by its probes");
    assert_eq!(active(&app, &ch1).await, 1.0);
    assert_eq!(
        insert_errors(&app, &ch0, "transient").await,
        1.0,
        "one insert, cut when the replica was marked down"
    );
    app.stop(false).await;
}

#[tokio::test]
async fn the_drain_ends_at_its_deadline_and_the_restart_stores_every_acknowledged_row_once() {
    let ch = ClickHouse::start().await;
    let sites = Sites::with(&[SITE]);
    let app = App::start(sites.clone(), &[&ch], &[]).await;
    // One row stored first: the writer runs (its first probe round, which precedes it, is
    // over), so the drain deadline starts when the drain does.
    let mut sent = one_row_stored(&app, &ch).await;
    ch.set_fault(Fault::Hang);
    let mut held = Vec::new();
    for _ in 0..3 {
        let (ids, body) = array(2);
        accepted(&app, &body).await;
        held.extend(ids);
    }
    // The harness's drain grace (100 ms), then the writer tries until DRAIN_DEADLINE and
    // leaves the batch in the spool (the only replica hangs: nothing to fail over to).
    // Margin: one probe timeout and a second.
    let grace = Duration::from_millis(100);
    let (took, spool) = app.stop(true).await;
    let bound = grace + DRAIN_DEADLINE + PROBE_TIMEOUT + Duration::from_secs(1);
    assert!(
        took >= DRAIN_DEADLINE && took <= bound,
        "the drain took {took:?}: the writer should try until its deadline ({DRAIN_DEADLINE:?}) \
         and the collector end by {bound:?} (beyond it: see \
         an_idle_collector_stops_within_one_probe_round_when_a_replica_hangs)"
    );
    assert_eq!(ids(&ch), sent, "nothing stored by the hanging replica");

    ch.set_fault(Fault::None);
    let app = App::start_on(spool, sites, &[&ch], &[]).await;
    holds(&ch, &held, Duration::from_secs(10)).await;
    sent.extend(&held);
    stored_once(&[&ch], &sent);
    app.stop(false).await;
}

/// Found while writing the drain test: `probe::run` selects between its interval's tick and
/// `shutdown.changed()` without bias, and a probe round of a hanging replica takes
/// PROBE_TIMEOUT, after which the tick is overdue: both branches are ready and either may
/// win, so after a shutdown the prober runs another whole round with probability 1/2 each
/// time, and the writer's thread (which joins the prober) ends after a geometric number of
/// rounds. Measured (8 idle collectors, SIGINT): 1.9, 2.0, 2.0, 3.9, 4.0, 6.0, 8.0 and 14.0 s.
/// Eight collectors all stop within one round only with probability 1/256 until it is fixed.
#[tokio::test]
async fn an_idle_collector_stops_within_one_probe_round_when_a_replica_hangs() {
    let runs = (0..8).map(|_| async {
        let ch = ClickHouse::start().await;
        let app = App::start(Sites::with(&[SITE]), &[&ch], &[]).await;
        ch.set_fault(Fault::Hang);
        wait_until(
            "the hanging replica down by its probes",
            PROBE_INTERVAL + PROBE_TIMEOUT * PROBE_FAILURES_TO_DOWN + Duration::from_secs(3),
            || async { state(&app, &ch).await == 0.0 },
        )
        .await;
        // Nothing to flush: the writer ends at once; the prober's round under way may finish.
        let (took, _) = app.stop(false).await;
        took
    });
    let took = futures_util::future::join_all(runs).await;
    let bound = PROBE_TIMEOUT + Duration::from_secs(1);
    assert!(
        took.iter().all(|t| *t <= bound),
        "stops took {took:?}; each should end within {bound:?}"
    );
}

#[tokio::test]
async fn after_a_refusal_storm_every_acknowledged_row_is_stored_once() {
    let ch = ClickHouse::start().await;
    let app = App::start(Sites::with(&[SITE]), &[&ch], &[]).await;
    let mut sent = one_row_stored(&app, &ch).await;
    ch.set_fault(Fault::Refuse);
    let (first, body) = array(3);
    accepted(&app, &body).await;
    sent.extend(&first);
    // The storm: the only replica is down by its inserts and retried in rotation.
    wait_until("five failed inserts", Duration::from_secs(5), || async {
        insert_errors(&app, &ch, "transient").await >= 5.0
    })
    .await;
    assert_eq!(state(&app, &ch).await, 0.0);
    for _ in 0..2 {
        let (ids, body) = array(2);
        accepted(&app, &body).await;
        sent.extend(ids);
    }
    assert_eq!(ch.rows().len(), 1, "nothing stored during the storm");
    assert_eq!(ch.insert_log().len(), 1);

    // It recovers, and the first insert it takes is stored but its answer is lost: the
    // resend carries the same token and is folded.
    ch.lose_answers(1);
    ch.set_fault(Fault::None);
    // Ready for a trial after PASSES_TO_HEALTHY probes; a backoff of up to BACKOFF_MAX under
    // way, and one more after the lost answer.
    let bound = PROBE_INTERVAL * (PASSES_TO_HEALTHY + 1) + BACKOFF_MAX * 2 + Duration::from_secs(3);
    holds(&ch, &sent, bound).await;
    stored_once(&[&ch], &sent);
    let log = ch.insert_log();
    let lost: Vec<usize> = (0..log.len()).filter(|&i| log[i].answer_lost).collect();
    assert_eq!(lost.len(), 1, "{log:?}");
    let i = lost[0];
    assert_eq!(log[i].rows, first.len(), "{log:?}");
    // The resends of that batch (the trial; and inserts abandoned at once as the replica was
    // down that reached it nonetheless, see
    // with_every_replica_down_the_writer_delivers_in_rotation) are all folded.
    let resends = &log[i + 1..log.len() - 1];
    assert!(
        !resends.is_empty()
            && resends
                .iter()
                .all(|r| r.folded && r.rows == first.len() && !r.answer_lost),
        "after the lost answer, folded resends then the next batch: {log:?}"
    );
    assert_eq!(
        log.last(),
        Some(&InsertRecord {
            rows: 4,
            folded: false,
            answer_lost: false
        }),
        "{log:?}"
    );
    // Healthy once its probes pass (the rows may have gone in by the rotation before them):
    // PASSES_TO_HEALTHY probe intervals and one more under way, with 2 s for a busy machine
    // (2 s alone failed twice beside builds).
    let healthy = PROBE_INTERVAL * (PASSES_TO_HEALTHY + 1) + Duration::from_secs(2);
    wait_until("the replica healthy", healthy, || async {
        state(&app, &ch).await == 2.0
    })
    .await;
    app.stop(false).await;
}

/// With every replica down the writer writes to the next in rotation (`Replicas::pick` and
/// the module doc of `writer/replicas`: "so that whichever replica comes back first gets the
/// spool's backlog"). Found while writing the refusal-storm test and fixed since: an insert
/// into a replica already down was abandoned at once (`wait_down`), so an insert in rotation
/// never succeeded, while the abandoned request could still reach the server. Such an insert
/// now runs, bounded by `TRIAL_TIMEOUT`. Here the only replica is down by its inserts and
/// answers again: the batch is delivered by the rotation, once.
#[tokio::test]
async fn with_every_replica_down_the_writer_delivers_in_rotation() {
    let ch = ClickHouse::start().await;
    let app = App::start(Sites::with(&[SITE]), &[&ch], &[]).await;
    let mut sent = one_row_stored(&app, &ch).await;
    ch.set_fault(Fault::Refuse);
    let (next, body) = array(3);
    accepted(&app, &body).await;
    sent.extend(&next);
    wait_until("down by its inserts", Duration::from_secs(5), || async {
        insert_errors(&app, &ch, "transient").await >= FAILURES_TO_DOWN as f64
    })
    .await;
    // Answering, but lagging: down until its probes pass (it awaits a trial), so every
    // replica is down and the writer rotates over the only one.
    ch.set_lagging(true);
    ch.set_fault(Fault::None);
    let bound = BACKOFF_MAX + Duration::from_secs(3);
    let until = Instant::now() + bound;
    let mut held = app.metric("collector_spool_records").await;
    while held > 0.0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
        held = app.metric("collector_spool_records").await;
    }
    assert_eq!(
        held,
        0.0,
        "after {bound:?} the spool still holds {held} rows; the server holds {} of them, \
         from these INSERTs: {:?}; {} failed insert attempts",
        ch.rows().iter().filter(|r| next.contains(&r.id)).count(),
        &ch.insert_log()[1..],
        insert_errors(&app, &ch, "transient").await
    );
    stored_once(&[&ch], &sent);
    app.stop(false).await;
}

/// A preferred replica that hangs as the drain begins: the prober goes on during the drain,
/// its failed probes mark the replica down within PROBE_INTERVAL + 3 × PROBE_TIMEOUT (7 s),
/// which ends the insert waiting on it, and the batch fails over to replica 1 before the
/// drain deadline (found by review: the prober stopped with the drain's start, so the
/// batch waited in the spool until the restart).
#[tokio::test]
async fn a_replica_hanging_during_the_drain_is_failed_over() {
    let (ch0, ch1) = (ClickHouse::start().await, ClickHouse::start().await);
    let app = App::start(Sites::with(&[SITE]), &[&ch0, &ch1], &[]).await;
    one_row_stored(&app, &ch0).await;
    ch0.set_fault(Fault::Hang);
    let (next, body) = array(5);
    let answer = app.send(&body).await;
    assert_eq!(answer.status, 202, "{}", answer.text());
    let (took, _spool) = app.stop(false).await;
    assert!(
        next.iter().all(|id| ids(&ch1).contains(id)),
        "failed over during the drain (it took {took:?}); replica 1 holds {:?}, replica 0 {:?}; \
         the 202 said {}",
        ids(&ch1),
        ids(&ch0),
        answer.text()
    );
    assert!(
        took < DRAIN_DEADLINE + PROBE_TIMEOUT,
        "the drain took {took:?}"
    );
}

/// A batch whose every row is refused: bisecting it alone would take about 2 n inserts; the
/// budget (`64 + rows / 32` inserts after the first refusal, `writer/refused.rs`) ends it, the
/// pieces still unresolved are kept aside whole, nothing is stored, and the writer goes on.
#[tokio::test]
async fn a_batch_refused_row_by_row_spends_at_most_its_bisect_budget() {
    let ch = ClickHouse::start().await;
    ch.poison("refused-everywhere");
    let app = App::start(Sites::with(&[SITE]), &[&ch], &[]).await;
    let (bad, mut body) = array(50);
    for row in body.as_array_mut().unwrap() {
        row["url"] = "https://shop.example/refused-everywhere".into();
    }
    accepted(&app, &body).await;
    wait_until("50 kept-aside rows", Duration::from_secs(20), || async {
        app.metric("collector_spool_kept_aside_rows_total").await >= 50.0
    })
    .await;
    assert_eq!(
        app.metric("collector_spool_kept_aside_rows_total").await,
        50.0
    );
    let budget = 64 + 50 / 32;
    let refused = ch.refused_inserts();
    assert!(
        (2..=1 + budget).contains(&refused),
        "{refused} refused inserts: the first, then at most the budget of {budget}"
    );
    assert!(
        ids(&ch).iter().all(|id| !bad.contains(id)),
        "no refused row stored"
    );
    // The writer goes on with the next batch.
    let (next, body) = array(1);
    accepted(&app, &body).await;
    holds(&ch, &next, Duration::from_secs(10)).await;
    app.stop(false).await;
}

//! The ClickHouse replicas: their health, which one is written to, and the insert itself.
//!
//! Each replica is in one of three states ([`State`]), exported as
//! `collector_clickhouse_replica_state{replica}`:
//!
//! - **Healthy**: written to when it is the most preferred healthy replica.
//! - **Down**: several failures in quick succession ([`FAILURES_TO_DOWN`] insert failures within
//!   [`FAILURE_WINDOW`], or [`PROBE_FAILURES_TO_DOWN`] failed probes in a row). One slow or
//!   failed request does not take a replica down.
//! - **CatchingUp**: answering again, but not yet past the catch-up check
//!   ([`crate::writer::probe`]) on [`PASSES_TO_HEALTHY`] consecutive probes. Not written to
//!   while a healthy replica exists.
//!
//! **Only an insert proves a replica takes inserts.** The probe is a SELECT, and a replica can
//! answer SELECTs while it refuses every insert (a read-only profile, a memory limit, too many
//! parts). So a replica taken down by failed inserts stays **Down** (state metric 0) when its
//! probes pass again; once it has passed [`PASSES_TO_HEALTHY`] catch-up probes in a row, the
//! writer sends it one batch as a *trial* ([`Replicas::pick`]), the half-open call of a
//! circuit breaker: the trial's success makes it healthy at once (one "back" line), a failure
//! leaves it down without a line and the next trial waits longer ([`TRIAL_INTERVAL_MIN`]
//! doubling up to [`TRIAL_INTERVAL_MAX`], jittered). A failed trial costs that batch one
//! retry on the healthy replica (the token folds a copy that landed). Without traffic there is
//! no trial: the replica stays down until a batch comes. A replica taken down by its probes
//! alone (unreachable, frozen) returns through its probes as above.
//!
//! The writer asks [`Replicas::pick`] before every attempt: the most preferred healthy replica,
//! else the most preferred catching-up one, else (everything down) the next in rotation, so
//! that whichever replica comes back first gets the spool's backlog.
//!
//! A replica that lacks the schema (no `measurements` table, or a column missing, e.g. it was
//! down during `collector migrate`) is never written to, not even in rotation: it counts as
//! down until the prober has applied the schema to it and it has caught up.
//!
//! **Idle connections.** ClickHouse closes an idle HTTP keep-alive connection after its
//! `keep_alive_timeout` (3 s on 18.16, longer on current releases), and a restarted replica
//! leaves every pooled connection dead. A request that fails on a connection taken from the
//! pool, other than by a timeout or a refused connect, is therefore sent once more at once on
//! a fresh connection to the same replica ([`is_stale_connection`]); only if that fails too
//! does it count against the replica. Retrying an INSERT is safe: the token and the table's
//! `ReplacingMergeTree` fold a second copy.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::clickhouse::errors::{classify, InsertError};
use crate::clickhouse::insert::{insert_rows, is_stale_connection, InsertBody};
use crate::metrics::{Metrics, ReplicaLabel};

/// Why a replica failed a probe (its `probe:` cause in the log and `/readyz`).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// A query refused or the connection failed (ClickHouse's error chain).
    #[error("{}", crate::logging::chain(.0))]
    ClickHouse(#[from] clickhouse::error::Error),
    /// No answer within the probe's timeout ([`crate::writer::probe::PROBE_TIMEOUT`]).
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Insert failures within [`FAILURE_WINDOW`] that mark a replica down.
pub const FAILURES_TO_DOWN: usize = 3;
/// Window in which [`FAILURES_TO_DOWN`] insert failures mark a replica down.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(10);
/// Consecutive failed probes that mark a replica down.
pub const PROBE_FAILURES_TO_DOWN: u32 = 3;
/// Consecutive lagging probes that demote a healthy replica to catching up.
pub const LAGS_TO_DEMOTE: u32 = 3;
/// Consecutive passed catch-up probes that make a returning replica healthy again.
pub const PASSES_TO_HEALTHY: u32 = 3;
/// While a replica stays down, one summary line this often (besides the line when it goes
/// down and the one when it returns).
pub const DOWN_SUMMARY_INTERVAL: Duration = Duration::from_secs(60);
/// Least time between two trial inserts into a replica taken down by failed inserts (see the
/// module doc); doubles per failed trial up to [`TRIAL_INTERVAL_MAX`].
pub const TRIAL_INTERVAL_MIN: Duration = Duration::from_secs(2);
/// Longest time between two trial inserts.
pub const TRIAL_INTERVAL_MAX: Duration = Duration::from_secs(30);
/// Bound on one trial insert: a replica that takes the insert and then hangs (an unreachable
/// insert quorum, a stuck disk) holds the writer at most this long per trial, while a healthy
/// replica waits with the batch.
pub const TRIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// What one probe of a replica found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// It passed the catch-up check (see the module doc); false when `schema` is false.
    pub caught_up: bool,
    /// It knows `insert_deduplication_token` (ClickHouse 22.2 and later).
    pub dedup_token: bool,
    /// It has the `measurements` table with every column the writer sends.
    pub schema: bool,
    /// `system.replicas` has a row for the table: it is replicated, and the catch-up check
    /// applies. False for the single-server form (nothing to gate on) and when `schema` is
    /// false.
    pub replicated: bool,
}

/// A replica's health as the writer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Failing: not written to unless every replica is down.
    Down = 0,
    /// Answering, not yet caught up.
    CatchingUp = 1,
    /// Caught up and answering.
    Healthy = 2,
}

#[derive(Debug)]
struct Health {
    state: State,
    /// Whether the last probe found the schema (table and every column) on this replica.
    schema: bool,
    insert_failures: Vec<Instant>,
    probe_failures: u32,
    passes: u32,
    /// Consecutive probes that found it behind.
    lags: u32,
    /// The outage began with failed inserts: only a successful insert (a trial) ends it.
    awaits_insert: bool,
    /// Failed trials in this outage, and the earliest time of the next one.
    trials_failed: u32,
    next_trial: Option<Instant>,
    /// Whether the server knows `insert_deduplication_token` (ClickHouse 22.2 and later).
    dedup_token: bool,
    /// Whether the last probe that found the table found it replicated (`None`: none yet).
    replicated: Option<bool>,
    /// Since when it is down, and when the last "still down" summary was logged; kept while
    /// it catches up, until it is healthy again.
    down_since: Option<(Instant, Instant)>,
    /// The last failure seen (probe or insert), with its causes.
    last_error: String,
    /// When the last "down" warning and the last "back" line were logged: a replica that
    /// flaps (probes pass, inserts fail) gets at most one of each per
    /// [`DOWN_SUMMARY_INTERVAL`]; the outages in between are counted in `flaps` and named in
    /// the next line.
    down_logged: Option<Instant>,
    back_logged: Option<Instant>,
    flaps: u32,
}

impl Health {
    /// Down since failed inserts, with the schema and passing catch-up probes: a trial insert
    /// may go to it (see the module doc).
    fn trial_ready(&self) -> bool {
        self.state == State::Down
            && self.awaits_insert
            && self.schema
            && self.passes >= PASSES_TO_HEALTHY
    }
}

/// The wait before the trial after `failed` failed trials: [`TRIAL_INTERVAL_MIN`] doubled per
/// failure up to [`TRIAL_INTERVAL_MAX`], a random point in its upper half ("equal jitter", as
/// [`crate::writer::backoff`]).
fn trial_interval(failed: u32) -> Duration {
    crate::writer::jittered(TRIAL_INTERVAL_MIN, TRIAL_INTERVAL_MAX, failed)
}

struct Inner {
    health: Vec<Health>,
    active: usize,
    rotation: usize,
}

/// Every replica, shared by the writer and the prober.
#[derive(Clone)]
pub struct Replicas {
    /// The shard's name, for the metric labels and the log.
    shard: Arc<str>,
    urls: Arc<[String]>,
    /// Per replica: a client over a connection pool, and one that never reuses a connection.
    clients: Arc<[(clickhouse::Client, clickhouse::Client)]>,
    inner: Arc<Mutex<Inner>>,
    changed: watch::Sender<u64>,
    metrics: Arc<Metrics>,
}

impl Replicas {
    /// Clients for the replicas of `shard` (in preference order, as `config`'s user, over
    /// http or verified https), writing to `config`'s database. Every replica starts healthy;
    /// the first probe round corrects that before the writer starts.
    pub fn new(
        config: &crate::config::ClickHouseConfig,
        shard: &crate::config::ShardConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        let urls: Vec<String> = shard
            .urls
            .iter()
            .map(|u| u.as_str().trim_end_matches('/').to_owned())
            .collect();
        let configure = |pooled: bool, u: &String| {
            crate::clickhouse::client(u, config, pooled)
                .with_database(&config.database)
                .with_compression(clickhouse::Compression::Lz4)
        };
        let clients: Vec<_> = urls
            .iter()
            .map(|u| (configure(true, u), configure(false, u)))
            .collect();
        let health = urls
            .iter()
            .map(|_| Health {
                state: State::Healthy,
                schema: true,
                insert_failures: Vec::new(),
                probe_failures: 0,
                passes: 0,
                lags: 0,
                awaits_insert: false,
                replicated: None,
                trials_failed: 0,
                next_trial: None,
                dedup_token: false,
                down_since: None,
                down_logged: None,
                back_logged: None,
                flaps: 0,
                last_error: String::new(),
            })
            .collect();
        let replicas = Replicas {
            shard: shard.name.as_str().into(),
            urls: urls.into(),
            clients: clients.into(),
            inner: Arc::new(Mutex::new(Inner {
                health,
                active: 0,
                rotation: 0,
            })),
            changed: watch::channel(0).0,
            metrics,
        };
        for i in 0..replicas.len() {
            replicas
                .metrics
                .clickhouse
                .replica_preference
                .get_or_create(&replicas.label(i))
                .set(i as i64);
            replicas.metrics.clickhouse.init_replica(&replicas.label(i));
        }
        replicas.publish(&replicas.inner.lock().unwrap());
        replicas
    }

    /// Number of replicas.
    pub fn len(&self) -> usize {
        self.urls.len()
    }

    /// Whether there is no replica (never: configuration requires one).
    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// URL of replica `i` as configured.
    pub fn url(&self, i: usize) -> &str {
        &self.urls[i]
    }

    /// Client of replica `i` (pooled connections).
    pub fn client(&self, i: usize) -> &clickhouse::Client {
        &self.clients[i].0
    }

    /// Client of replica `i` that opens a fresh connection for every request.
    pub fn fresh_client(&self, i: usize) -> &clickhouse::Client {
        &self.clients[i].1
    }

    /// Current state of replica `i`.
    pub fn state(&self, i: usize) -> State {
        self.inner.lock().unwrap().health[i].state
    }

    /// Index of the replica the writer writes to now.
    pub fn active(&self) -> usize {
        self.inner.lock().unwrap().active
    }

    /// The metric label of replica `i`: its URL as configured and its shard.
    fn label(&self, i: usize) -> ReplicaLabel {
        ReplicaLabel::new(&self.shard, &self.urls[i])
    }

    /// The name of the shard these replicas are (contract v5 §3).
    pub fn shard(&self) -> &str {
        &self.shard
    }

    fn publish(&self, inner: &Inner) {
        for (i, h) in inner.health.iter().enumerate() {
            self.metrics
                .clickhouse
                .replica_state
                .get_or_create(&self.label(i))
                .set(h.state as i64);
            self.metrics
                .clickhouse
                .active_replica
                .get_or_create(&self.label(i))
                .set((i == inner.active) as i64);
        }
        self.changed.send_modify(|n| *n += 1);
    }

    /// Changes the state of `i`, logging the change. An outage is one warning when the
    /// replica goes down (with its cause) and one line when it is back (healthy again, with how
    /// long it was out); while it is out, down or catching up, [`Replicas::probed`] adds one
    /// summary a [`DOWN_SUMMARY_INTERVAL`]. Going down again while still catching up is part of
    /// the same outage: no new line.
    fn set_state(&self, inner: &mut Inner, i: usize, state: State) {
        let h = &mut inner.health[i];
        if h.state == state {
            return;
        }
        let url = &self.urls[i];
        match (h.state, state) {
            (_, State::Down) if h.down_since.is_some() => {
                tracing::debug!(replica = %url, cause = %h.last_error, "clickhouse: replica down again while catching up");
            }
            (_, State::Down) => {
                let now = Instant::now();
                h.down_since = Some((now, now));
                if h.down_logged
                    .is_some_and(|t| now.duration_since(t) < DOWN_SUMMARY_INTERVAL)
                {
                    h.flaps += 1;
                    tracing::debug!(replica = %url, cause = %h.last_error, "clickhouse: replica down again (flapping)");
                } else if h.schema {
                    h.down_logged = Some(now);
                    let flaps = std::mem::take(&mut h.flaps);
                    tracing::warn!(replica = %url, cause = %h.last_error, flaps_in_last_interval = flaps, "clickhouse: replica down; not written to until it answers and has caught up");
                } else {
                    h.down_logged = Some(now);
                    tracing::warn!(replica = %url, "clickhouse: replica lacks the schema; applying it, not written to until it has caught up");
                }
            }
            (from, State::Healthy) if h.down_since.is_some() => {
                let down_for = h.down_since.take().map(|(t, _)| t.elapsed());
                let now = Instant::now();
                if h.back_logged
                    .is_some_and(|t| now.duration_since(t) < DOWN_SUMMARY_INTERVAL)
                {
                    tracing::debug!(replica = %url, down_for = ?down_for, "clickhouse: replica back (flapping)");
                } else {
                    h.back_logged = Some(now);
                    if h.awaits_insert {
                        tracing::info!(replica = %url, from = ?from, down_for = ?down_for, "clickhouse: replica back: caught up and a trial insert succeeded, written to again");
                    } else {
                        tracing::info!(replica = %url, from = ?from, down_for = ?down_for, "clickhouse: replica back: answering and caught up, written to again");
                    }
                }
            }
            (State::Down, to) => {
                tracing::debug!(replica = %url, to = ?to, "clickhouse: replica answering again; catching up");
            }
            (from, to) => {
                tracing::info!(replica = %url, from = ?from, to = ?to, "clickhouse: replica state")
            }
        }
        h.state = state;
        h.passes = 0;
        if state == State::Healthy {
            h.awaits_insert = false;
            h.trials_failed = 0;
            h.next_trial = None;
        }
    }

    /// Chooses the replica for the next attempt (see the module doc): a replica whose trial is
    /// due (a less preferred one too, so that it is not shown down for ever), which does not
    /// become the active one; else, recorded as active, the most preferred healthy, else
    /// catching-up replica, else the next in rotation.
    pub fn pick(&self) -> usize {
        let mut inner = self.inner.lock().unwrap();
        let now = Instant::now();
        let first = |s: State| inner.health.iter().position(|h| h.state == s && h.schema);
        let usable = first(State::Healthy).or_else(|| first(State::CatchingUp));
        let trial = inner
            .health
            .iter()
            .position(|h| h.trial_ready() && h.next_trial.is_none_or(|t| now >= t));
        if let Some(i) = trial {
            // Not the active replica: a trial is one batch, and its success makes the replica
            // healthy, after which the next pick chooses by preference.
            let h = &mut inner.health[i];
            h.next_trial = Some(now + trial_interval(h.trials_failed));
            tracing::debug!(replica = %self.urls[i], trials_failed = h.trials_failed, "clickhouse: trial insert into a replica taken down by failed inserts");
            return i;
        }
        let chosen = match usable {
            Some(i) => i,
            None => {
                // Rotate over the replicas that have the schema (over all, if none has it:
                // `insert` then refuses without sending, and the prober is applying it).
                let n = inner.health.len();
                let with_schema = inner.health.iter().any(|h| h.schema);
                let mut next = inner.rotation;
                for _ in 0..n {
                    next = (next + 1) % n;
                    if inner.health[next].schema || !with_schema {
                        break;
                    }
                }
                inner.rotation = next;
                next
            }
        };
        if chosen != inner.active {
            if inner.health[inner.active].state != State::Healthy || chosen < inner.active {
                // The state change that caused the switch has its own line (`set_state`);
                // while every replica is down the writer rotates at each retry.
                tracing::debug!(from = %self.urls[inner.active], to = %self.urls[chosen], "clickhouse: switching replica");
                self.metrics.clickhouse.failovers.inc();
            }
            inner.active = chosen;
            self.publish(&inner);
        }
        chosen
    }

    /// Records a failed insert on `i` (`cause`: the error with its causes); several in quick
    /// succession mark it down.
    pub fn insert_failed(&self, i: usize, cause: &str) {
        self.metrics
            .clickhouse
            .insert_error(&self.label(i), "transient");
        let mut inner = self.inner.lock().unwrap();
        let now = Instant::now();
        let h = &mut inner.health[i];
        // A replica already down keeps the cause that took it down, refreshed by its probes
        // (an insert abandoned because it is down would only repeat that cause).
        if h.state != State::Down {
            h.last_error = format!("insert: {cause}");
        } else if h.trial_ready() {
            h.trials_failed = h.trials_failed.saturating_add(1);
            // The latest refusal is what the operator needs in the "still down" line.
            h.last_error = format!("insert (trial): {cause}");
            tracing::debug!(replica = %self.urls[i], %cause, "clickhouse: trial insert failed; the replica stays down");
            return;
        }
        h.insert_failures
            .retain(|t| now.duration_since(*t) < FAILURE_WINDOW);
        h.insert_failures.push(now);
        if h.insert_failures.len() >= FAILURES_TO_DOWN {
            h.insert_failures.clear();
            if h.state != State::Down {
                h.awaits_insert = true;
                h.trials_failed = 0;
                h.next_trial = None;
            }
            self.set_state(&mut inner, i, State::Down);
            self.publish(&inner);
        }
    }

    /// Records a successful insert on `i`: the end of an outage that awaited one (see the
    /// module doc), at once when its probes pass, else through them.
    pub fn insert_succeeded(&self, i: usize) {
        self.metrics
            .clickhouse
            .inserts
            .get_or_create(&self.label(i))
            .inc();
        let mut inner = self.inner.lock().unwrap();
        let h = &mut inner.health[i];
        h.insert_failures.clear();
        if !h.awaits_insert {
            return;
        }
        if h.trial_ready() {
            self.set_state(&mut inner, i, State::Healthy);
            // The preferred replica back is the active one now, not at the next batch (as
            // `probed` does), so that a quiet collector does not name the fallback.
            if i < inner.active {
                inner.active = i;
                self.metrics.clickhouse.failovers.inc();
            }
            self.publish(&inner);
        } else {
            h.awaits_insert = false;
        }
    }

    /// Records a probe result for `i`: why it failed, else what it found. `initial` (the first
    /// round at start) trusts a single result.
    pub fn probed(&self, i: usize, result: Result<Probe, ProbeError>, initial: bool) {
        let mut inner = self.inner.lock().unwrap();
        let before = inner.health[i].state;
        match result {
            Ok(Probe { schema: false, .. }) => self.probed_without_schema(&mut inner, i),
            Err(cause) => self.probe_failed(&mut inner, i, &cause, initial),
            Ok(found) => self.probe_passed(&mut inner, i, found, before, initial),
        }
        self.say_still_down(&mut inner, i);
        if inner.health[i].state != before {
            self.publish(&inner);
        }
        // A more preferred replica healthy again is the active one from now on, not only at
        // the next batch: on a quiet collector the metric would otherwise name the fallback
        // for as long as no beacon arrives (and `CollectorPreferredReplicaUnused` would fire).
        let back = inner.health[i].state == State::Healthy && before != State::Healthy;
        if back && i < inner.active {
            drop(inner);
            self.pick();
        }
    }

    /// A probe found replica `i` without the table or one of the writer's columns: down.
    fn probed_without_schema(&self, inner: &mut Inner, i: usize) {
        let h = &mut inner.health[i];
        h.schema = false;
        h.last_error = "probe: the measurements table, or one of the writer's columns, is missing (the prober applies the schema; its error, if any, is logged)".into();
        h.probe_failures = 0;
        h.passes = 0;
        self.set_state(inner, i, State::Down);
    }

    /// A probe of replica `i` failed with `cause`: down after [`PROBE_FAILURES_TO_DOWN`] in a
    /// row, or at once in the `initial` round.
    fn probe_failed(&self, inner: &mut Inner, i: usize, cause: &ProbeError, initial: bool) {
        let h = &mut inner.health[i];
        h.probe_failures += 1;
        h.passes = 0;
        tracing::debug!(replica = %self.urls[i], %cause, "clickhouse: probe failed");
        h.last_error = format!("probe: {cause}");
        if h.probe_failures >= PROBE_FAILURES_TO_DOWN || initial {
            self.set_state(inner, i, State::Down);
        }
    }

    /// A probe found replica `i` with the schema (`found`); it was `before`. Counts towards
    /// its return or its demotion (see the module doc).
    fn probe_passed(
        &self,
        inner: &mut Inner,
        i: usize,
        found: Probe,
        before: State,
        initial: bool,
    ) {
        let Probe {
            caught_up,
            dedup_token: token,
            replicated,
            ..
        } = found;
        let h = &mut inner.health[i];
        if h.replicated != Some(replicated) {
            if replicated {
                tracing::debug!(replica = %self.urls[i], "clickhouse: measurements is replicated; returning replicas are gated on catching up");
            } else {
                tracing::info!(replica = %self.urls[i], "clickhouse: measurements is not replicated here (the single-server form): no catch-up to gate on, the replica counts as caught up whenever it answers");
            }
            h.replicated = Some(replicated);
        }
        h.schema = true;
        h.probe_failures = 0;
        if caught_up {
            h.lags = 0;
        }
        h.dedup_token = token;
        if h.awaits_insert && before == State::Down {
            // Probes do not end an outage that failed inserts began: they only make
            // the replica ready for a trial (see the module doc).
            h.passes = if caught_up {
                h.passes.saturating_add(1)
            } else {
                0
            };
        } else if !caught_up {
            h.passes = 0;
            h.lags += 1;
            // A healthy replica that is being written to is briefly behind its own
            // replication log after each insert: only several lagging probes in a row
            // demote it.
            let demote = before == State::Down || initial || h.lags >= LAGS_TO_DEMOTE;
            if before != State::CatchingUp && demote {
                self.set_state(inner, i, State::CatchingUp);
            }
        } else if before != State::Healthy {
            self.count_pass(inner, i, before, initial);
        }
    }

    /// A caught-up probe of replica `i`, which was `before` (not healthy): catching up, and
    /// healthy after [`PASSES_TO_HEALTHY`] of them (or one in the `initial` round).
    fn count_pass(&self, inner: &mut Inner, i: usize, before: State, initial: bool) {
        inner.health[i].lags = 0;
        if before == State::Down {
            self.set_state(inner, i, State::CatchingUp);
        }
        let h = &mut inner.health[i];
        h.passes += 1;
        if h.passes >= PASSES_TO_HEALTHY || initial {
            self.set_state(inner, i, State::Healthy);
        }
    }

    /// While replica `i` is not healthy after an outage, a line every
    /// [`DOWN_SUMMARY_INTERVAL`] on what it still lacks.
    fn say_still_down(&self, inner: &mut Inner, i: usize) {
        let h = &mut inner.health[i];
        let trial_ready = h.trial_ready();
        if let Some((since, summary)) = &mut h.down_since {
            if h.state != State::Healthy && summary.elapsed() >= DOWN_SUMMARY_INTERVAL {
                *summary = Instant::now();
                if trial_ready {
                    tracing::warn!(replica = %self.urls[i], down_for = ?since.elapsed(), last_refusal = %h.last_error, "clickhouse: replica still down: it answers and has caught up, but no trial insert has succeeded yet (a trial goes with the next batch; none while no beacon arrives)");
                } else if h.state == State::Down {
                    tracing::warn!(replica = %self.urls[i], down_for = ?since.elapsed(), cause = %h.last_error, "clickhouse: replica still down");
                } else {
                    tracing::warn!(replica = %self.urls[i], down_for = ?since.elapsed(), "clickhouse: replica still catching up after being down");
                }
            }
        }
    }

    /// Resolves when replica `i` is marked down (used to abandon an insert into a replica that
    /// stopped answering, e.g. a frozen process, without waiting for the insert's timeout).
    pub async fn wait_down(&self, i: usize) {
        let mut rx = self.changed.subscribe();
        loop {
            if self.state(i) == State::Down {
                return;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Inserts `body` into replica `i` once (plus one immediate retry on a fresh connection
    /// when the pooled one was found dead), abandoning it if `i` is marked down meanwhile. An
    /// insert into a replica already down (a trial, or the rotation while every replica is
    /// down) is bounded by [`TRIAL_TIMEOUT`] instead: it must be let finish, or it could
    /// never succeed.
    pub async fn insert(&self, i: usize, body: &InsertBody) -> Result<(), InsertError> {
        let (token, schema, down) = {
            let inner = self.inner.lock().unwrap();
            let h = &inner.health[i];
            (
                h.dedup_token.then(|| body.token.clone()),
                h.schema,
                h.state == State::Down,
            )
        };
        if !schema {
            return Err(InsertError::Transient(
                "the replica lacks the schema; not written to until the prober has applied it"
                    .into(),
            ));
        }
        let attempt = async {
            match insert_rows(self.client(i), body, token.clone()).await {
                Err(e) if is_stale_connection(&e) => {
                    tracing::debug!(replica = %self.urls[i], error = %crate::logging::chain(&e), "clickhouse: pooled connection found dead; retrying on a fresh one");
                    insert_rows(self.fresh_client(i), body, token).await
                }
                other => other,
            }
            .map_err(|e| classify(&e))
        };
        // An insert into a replica that is down (a trial, or the rotation): `wait_down` would
        // end it at once, so TRIAL_TIMEOUT bounds it.
        let attempt = async {
            if !down {
                return attempt.await;
            }
            tokio::time::timeout(TRIAL_TIMEOUT, attempt)
                .await
                .unwrap_or_else(|_| {
                    Err(InsertError::Transient(format!(
                        "insert into a replica that is down: no answer within {TRIAL_TIMEOUT:?}"
                    )))
                })
        };
        let result = tokio::select! {
            r = attempt => r,
            () = self.wait_down(i), if !down => {
                let cause = self.inner.lock().unwrap().health[i].last_error.clone();
                Err(InsertError::Transient(format!("replica marked down during the insert: {cause}")))
            }
        };
        match &result {
            Ok(()) => self.insert_succeeded(i),
            Err(InsertError::Transient(cause)) => self.insert_failed(i, cause),
            Err(InsertError::Permanent(_)) => self
                .metrics
                .clickhouse
                .insert_error(&self.label(i), "permanent"),
        }
        result
    }
}

#[cfg(test)]
mod tests;

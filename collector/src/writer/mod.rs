//! The write path: spool → batch → ClickHouse replica, on its own thread.
//!
//! One writer reads durable frames from the spool in order, joins them into a batch (flushed
//! at [`BatchLimits`]: rows, bytes, or age of its oldest frame), inserts the batch into the
//! active replica and only then confirms it in the spool. The frames hold RowBinary rows, the
//! format of the INSERT, so a batch is their payloads end to end: no row is decoded or
//! encoded here. A batch is an owned, immutable value: a failed insert retries the very same
//! bytes, on the same or the next replica, with jittered exponential backoff, until it lands or
//! ClickHouse refuses it as bad data; a refused batch is bisected ([`refused`]) so that only
//! the rows ClickHouse refuses are kept aside and the rest is stored. The writer never imports
//! HTTP types; it sees only the spool and the replicas.
//!
//! **Its own thread.** The writer and the replica prober run on a single-threaded tokio
//! runtime on a thread of their own ([`spawn`]), at a lower scheduling priority
//! ([`WRITER_NICE`]), never on the runtime that serves requests: the kernel's scheduler then
//! preempts a batch's work (reading the spool, LZ4, the HTTP exchange) whenever a request
//! task is ready, on a one-core host too, instead of the request tasks waiting for it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rand::Rng;
use tokio::sync::watch;

pub mod probe;
mod purge;
mod refused;
pub mod replicas;

use crate::clickhouse::errors::InsertError;
use crate::clickhouse::insert::InsertBody;
use crate::metrics::Metrics;
use crate::settings::PurgedSites;
use crate::spool::{Frame, Position, SpoolReader};
pub use replicas::Replicas;

/// Flush thresholds of a batch.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    /// Flush at this many measurements.
    pub max_rows: usize,
    /// Flush at this many spooled bytes.
    pub max_bytes: usize,
    /// Flush when the oldest frame of the batch has waited this long.
    pub max_age: Duration,
}

/// First backoff after a failed insert.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest backoff between insert attempts while every replica fails.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// On shutdown, how long the writer may keep trying to flush before leaving the rest in the spool.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(10);
/// How much higher the writer thread's nice value is than the process's (Linux: per thread; at
/// most 19): under contention it gets about a tenth of a core against each request thread
/// (CFS weights 110 against 1024 for nice 10 against 0, `sched_prio_to_weight` in the
/// kernel's `kernel/sched/core.c`), and the scheduler runs a woken request task first. It is
/// never starved: idle cores run it, and a spool that fills answers 503, which lowers the load.
pub const WRITER_NICE: i32 = 10;

/// A batch: consecutive spool frames, from `start` up to `end`.
#[derive(Debug)]
pub struct Batch {
    /// The identity of the spool it comes from (32 hex digits, see [`crate::spool`]).
    pub spool: Arc<str>,
    /// Spool position of its first frame.
    pub start: Position,
    /// Spool position just after its last frame.
    pub end: Position,
    /// The rows, RowBinary, in spool order.
    pub body: Bytes,
    /// How many rows `body` holds.
    pub rows: u64,
    /// Spooled bytes it covers.
    pub bytes: u64,
    /// Rows of purged sites dropped from it ([`purge`]); 0 for a batch sent whole.
    pub purged: u64,
}

impl Batch {
    /// The batch's `insert_deduplication_token`: `<spool identity>-<start>-<end>`, equal for
    /// every retry of this batch (after a restart too, see [`crate::spool`]'s in-flight
    /// record) and never equal for two different batches, of this spool or any other.
    ///
    /// A batch whose rows of purged sites were dropped ends in `-p<rows dropped>`: its rows are
    /// not those of the whole range, so it must never be folded with (nor its pieces with the
    /// pieces of) an earlier attempt that sent the range whole.
    pub fn dedup_token(&self) -> String {
        let token = format!(
            "{}-{}-{}-{}-{}",
            self.spool, self.start.segment, self.start.offset, self.end.segment, self.end.offset
        );
        match self.purged {
            0 => token,
            n => format!("{token}-p{n}"),
        }
    }

    /// The whole batch as one INSERT.
    fn whole(&self) -> InsertBody {
        InsertBody {
            token: self.dedup_token(),
            rows: self.body.clone(),
        }
    }
}

/// Jittered exponential backoff: a random duration in `[d/2, d]` where `d` doubles per attempt
/// from [`BACKOFF_MIN`] up to [`BACKOFF_MAX`] ("equal jitter", AWS Architecture Blog,
/// "Exponential Backoff And Jitter", 2015).
pub fn backoff(attempt: u32) -> Duration {
    jittered(BACKOFF_MIN, BACKOFF_MAX, attempt)
}

/// A random duration in `[d/2, d]` where `d` is `min` doubled `attempt` times, at most `max`.
pub fn jittered(min: Duration, max: Duration, attempt: u32) -> Duration {
    let d = min.saturating_mul(1 << attempt.min(16)).min(max);
    let half = d / 2;
    half + rand::thread_rng().gen_range(Duration::ZERO..=half)
}

/// One shard's part of the write path (contract v5 §3): its spool's reading side and its
/// replicas, with their own failover, gating, batches, tokens and confirmation.
pub struct ShardWriter {
    /// The shard's spool, read in order.
    pub reader: SpoolReader,
    /// The shard's replicas.
    pub replicas: Replicas,
    /// How its replicas are probed (and given the schema).
    pub probing: probe::Options,
}

/// Starts the writers of every shard and their replica probers on a thread of their own
/// (named `writer`, at [`WRITER_NICE`]) with a single-threaded runtime, each shard in tasks of
/// its own, so that a shard whose replicas hang holds back no other shard: per shard, one
/// probe round first, so that a replica found down or lagging at start is not written to
/// first; then the writer until `shutdown` turns true and the drain ends ([`run`]). Join the
/// handle to wait for every shard's drain (each bounded by [`DRAIN_DEADLINE`], side by side).
pub fn spawn(
    shards: Vec<ShardWriter>,
    limits: BatchLimits,
    metrics: Arc<Metrics>,
    purged: watch::Receiver<PurgedSites>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("writer".into())
        .spawn(move || {
            crate::priority::lower_this_thread(WRITER_NICE, "writer");
            runtime.block_on(async move {
                let tasks: Vec<_> = shards
                    .into_iter()
                    .map(|shard| {
                        tokio::spawn(run_shard(
                            shard,
                            limits,
                            metrics.clone(),
                            purged.clone(),
                            shutdown.clone(),
                        ))
                    })
                    .collect();
                for task in tasks {
                    let _ = task.await;
                }
            });
        })
}

/// One shard's prober and writer, until its drain ends.
async fn run_shard(
    shard: ShardWriter,
    limits: BatchLimits,
    metrics: Arc<Metrics>,
    purged: watch::Receiver<PurgedSites>,
    shutdown: watch::Receiver<bool>,
) {
    let ShardWriter {
        reader,
        replicas,
        probing,
    } = shard;
    probe::round(&replicas, &probing, true).await;
    // The prober has a stop of its own, sent once the writer has drained: during the drain
    // its probes still mark a hanging replica down, which ends the insert waiting on it and
    // fails the batch over.
    let (stop_prober, prober_stop) = watch::channel(false);
    let prober = tokio::spawn(probe::run(replicas.clone(), probing, prober_stop));
    run(reader, replicas, limits, metrics, purged, shutdown).await;
    let _ = stop_prober.send(true);
    let _ = prober.await;
}

/// Runs the writer until `shutdown` turns true; then flushes what it can within
/// [`DRAIN_DEADLINE`] and leaves the rest in the spool.
pub async fn run(
    reader: SpoolReader,
    replicas: Replicas,
    limits: BatchLimits,
    metrics: Arc<Metrics>,
    purged: watch::Receiver<PurgedSites>,
    shutdown: watch::Receiver<bool>,
) {
    let spool: Arc<str> = reader.identity().into();
    let mut writer = Writer {
        reader,
        replicas,
        metrics,
        purged,
        shutdown,
        draining_since: None,
    };
    let mut frames = Vec::new();
    loop {
        let Some(mut batch) = writer.next_batch(&spool, &mut frames, limits).await else {
            return;
        };
        writer.drop_purged(&mut batch);
        if batch.rows == 0 {
            // Every row was of a purged site: nothing to insert.
            writer.reader.confirm(batch.end, batch.purged, batch.bytes);
            continue;
        }
        writer.reader.record_in_flight(batch.start, batch.end);
        // When the drain began: set once, here or by `drain_deadline` when shutdown is asked
        // for (a batch begun before it must give up too, not retry forever), and never moved
        // on: the drain ends DRAIN_DEADLINE after it began, however many batches are left.
        if writer.draining_since.is_none() && *writer.shutdown.borrow() {
            writer.draining_since = Some(Instant::now());
        }
        let delivered = match writer.send(&batch.whole()).await {
            Ok(()) => Ok(()),
            Err(Failure::Refused(reason)) => writer.deliver_refused(&batch, reason).await,
            Err(Failure::Abandoned) => Err(Abandoned),
        };
        match delivered {
            Ok(()) => writer
                .reader
                .confirm(batch.end, batch.rows + batch.purged, batch.bytes),
            Err(Abandoned) => {
                tracing::warn!(
                    rows = batch.rows,
                    "drain deadline passed; the batch stays in the spool and is sent after the restart"
                );
                return;
            }
        }
    }
}

/// Why [`Writer::send`] gave up.
enum Failure {
    /// ClickHouse refused the rows as bad data (the reason, with its code).
    Refused(String),
    /// The drain deadline passed.
    Abandoned,
}

/// The drain deadline passed: the rest stays in the spool.
struct Abandoned;

/// The writer's state between batches.
struct Writer {
    reader: SpoolReader,
    replicas: Replicas,
    metrics: Arc<Metrics>,
    /// The purged sites, whose rows are dropped instead of inserted.
    purged: watch::Receiver<PurgedSites>,
    shutdown: watch::Receiver<bool>,
    /// When the drain began, as seen by the current batch.
    draining_since: Option<Instant>,
}

impl Writer {
    /// Inserts `body` into the active replica until it lands, retrying transient failures
    /// with backoff (on whichever replica is active then), until ClickHouse refuses it as bad
    /// data or the drain deadline passes.
    async fn send(&mut self, body: &InsertBody) -> Result<(), Failure> {
        let mut attempt = 0u32;
        // The body without the rows of sites purged while it was being retried.
        let mut repurged: Option<InsertBody> = None;
        loop {
            if attempt > 0 {
                self.metrics.clickhouse.batches_retried.inc();
            }
            if let Some(left) = self.repurge(repurged.as_ref().unwrap_or(body)) {
                if left.rows.is_empty() {
                    return Ok(());
                }
                repurged = Some(left);
            }
            let body = repurged.as_ref().unwrap_or(body);
            let target = self.replicas.pick();
            // An insert into a replica that hangs (frozen, black-holed) can take up to the
            // insert timeout per replica: the drain deadline must cut it, not wait for it. A
            // cut insert may still complete on the server: the batch stays in the spool and
            // is sent again after the restart with the same token (see `INFLIGHT`).
            let result = tokio::select! {
                r = self.replicas.insert(target, body) => r,
                () = drain_deadline(&mut self.shutdown, &mut self.draining_since) => {
                    tracing::debug!(replica = %self.replicas.url(target), "drain deadline passed during an insert");
                    return Err(Failure::Abandoned);
                }
            };
            match result {
                Ok(()) => return Ok(()),
                Err(InsertError::Permanent(reason)) => return Err(Failure::Refused(reason)),
                Err(InsertError::Transient(reason)) => {
                    // Not a warning: every attempt counts against its replica, and a replica
                    // that keeps failing is logged once when it goes down, with this cause
                    // (`Replicas::set_state`), then once a minute while it stays down.
                    tracing::debug!(replica = %self.replicas.url(target), %reason, attempt, "clickhouse insert failed; will retry");
                    self.pause(attempt).await?;
                    attempt = attempt.saturating_add(1);
                }
            }
        }
    }

    /// Waits the backoff of `attempt`, or fails once the drain deadline passes.
    async fn pause(&mut self, attempt: u32) -> Result<(), Failure> {
        tokio::select! {
            () = tokio::time::sleep(backoff(attempt)) => Ok(()),
            () = drain_deadline(&mut self.shutdown, &mut self.draining_since) => Err(Failure::Abandoned),
        }
    }

    /// Gathers the next batch; `None` once shutdown is requested and nothing is left to read.
    /// Reading is blocking I/O from the page cache, on the writer's own thread.
    async fn next_batch(
        &mut self,
        spool: &Arc<str>,
        frames: &mut Vec<Frame>,
        limits: BatchLimits,
    ) -> Option<Batch> {
        let start = self.reader.position();
        let mut body = BytesMut::new();
        let (mut rows, mut bytes, mut end) = (0u64, 0u64, start);
        let mut deadline: Option<Instant> = None;
        loop {
            let room = (limits.max_bytes as u64).saturating_sub(bytes).max(1);
            let rows_room = (limits.max_rows as u64).saturating_sub(rows).max(1);
            self.reader.read_available(room, rows_room, frames);
            for frame in frames.drain(..) {
                body.extend_from_slice(&frame.payload);
                rows += u64::from(frame.rows);
                bytes += frame.bytes;
                end = frame.end;
            }
            if rows > 0 && deadline.is_none() {
                deadline = Some(Instant::now() + limits.max_age);
            }
            // A batch replayed after a restart ends where it ended before (same token).
            let replayed = self
                .reader
                .replay_bound()
                .is_some_and(|b| self.reader.position() >= b);
            let full =
                replayed || rows >= limits.max_rows as u64 || bytes >= limits.max_bytes as u64;
            let draining = *self.shutdown.borrow();
            let ready = match deadline {
                Some(d) => full || draining || Instant::now() >= d,
                None if draining => return None,
                None => false,
            };
            if ready {
                return Some(Batch {
                    spool: spool.clone(),
                    start,
                    end,
                    body: body.freeze(),
                    rows,
                    bytes,
                    purged: 0,
                });
            }
            let wait = deadline.map_or(Duration::from_secs(1), |d| {
                d.saturating_duration_since(Instant::now())
            });
            tokio::select! {
                _ = self.reader.wait(wait) => {}
                _ = self.shutdown.changed() => {}
            }
        }
    }
}

/// Completes once shutdown has been asked for and [`DRAIN_DEADLINE`] has passed since the
/// drain began (`since`, set here when this future first sees the shutdown). Never completes
/// while no shutdown is asked for, nor when no one can ask for one any more.
async fn drain_deadline(shutdown: &mut watch::Receiver<bool>, since: &mut Option<Instant>) {
    let began = match *since {
        Some(t) => t,
        None => {
            if shutdown.wait_for(|stop| *stop).await.is_err() {
                std::future::pending::<()>().await;
            }
            *since.insert(Instant::now())
        }
    };
    tokio::time::sleep_until((began + DRAIN_DEADLINE).into()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_differ_between_spools_and_between_ranges() {
        let at = |segment, offset| Position { segment, offset };
        let batch = |spool: &str, end| Batch {
            spool: spool.into(),
            start: at(1, 8),
            end: at(1, end),
            body: Bytes::new(),
            rows: 0,
            bytes: 0,
            purged: 0,
        };
        let (a, b) = ("a".repeat(32), "b".repeat(32));
        assert_eq!(batch(&a, 100).dedup_token(), batch(&a, 100).dedup_token());
        assert_ne!(batch(&a, 100).dedup_token(), batch(&b, 100).dedup_token());
        assert_ne!(batch(&a, 100).dedup_token(), batch(&a, 101).dedup_token());
        assert_eq!(batch(&a, 100).dedup_token(), format!("{a}-1-8-1-100"));
    }

    #[test]
    fn backoff_grows_is_jittered_and_capped() {
        for attempt in 0..40 {
            let d = backoff(attempt);
            let cap = BACKOFF_MIN
                .saturating_mul(1 << attempt.min(16))
                .min(BACKOFF_MAX);
            assert!(d >= cap / 2 && d <= cap, "{attempt}: {d:?}");
        }
        let samples: std::collections::HashSet<_> = (0..20).map(|_| backoff(5)).collect();
        assert!(samples.len() > 1, "jitter");
    }
}

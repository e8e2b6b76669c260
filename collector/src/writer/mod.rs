//! The write path: spool → batch → ClickHouse replica.
//!
//! One writer task reads durable records from the spool in order, gathers them into a batch
//! (flushed at [`BatchLimits`]: rows, bytes, or age of its oldest record), inserts the batch
//! into the active replica and only then confirms it in the spool. A batch is an owned,
//! immutable value: a failed insert retries the very same rows, on the same or the next replica,
//! with jittered exponential backoff, until it lands or ClickHouse refuses it as bad data
//! (then it is kept aside in the spool folder and the pipeline goes on). The writer never
//! imports HTTP types; it sees only the spool and the replicas.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::watch;

use crate::measurement::Measurement;

pub mod probe;
pub mod replicas;

use crate::metrics::Metrics;
use crate::spool::{Position, Record, SpoolReader};
pub use replicas::Replicas;

/// Flush thresholds of a batch.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    /// Flush at this many measurements.
    pub max_rows: usize,
    /// Flush at this many spooled bytes.
    pub max_bytes: usize,
    /// Flush when the oldest record of the batch has waited this long.
    pub max_age: Duration,
}

/// First backoff after a failed insert.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest backoff between insert attempts while every replica fails.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Most spool bytes decoded in one go while a batch is gathered.
const READ_CHUNK_BYTES: u64 = 256 * 1024;
/// On shutdown, how long the writer may keep trying to flush before leaving the rest in the spool.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(10);

/// A batch: consecutive spool records, from `start` up to `end`.
#[derive(Debug)]
pub struct Batch {
    /// The identity of the spool it comes from (32 hex digits, see [`crate::spool`]).
    pub spool: Arc<str>,
    /// Spool position of its first record.
    pub start: Position,
    /// Spool position just after its last record.
    pub end: Position,
    /// The rows, in spool order.
    pub rows: Vec<Measurement>,
    /// Spooled bytes it covers.
    pub bytes: u64,
}

impl Batch {
    fn push(&mut self, record: Record) {
        self.end = record.end;
        self.bytes += record.bytes;
        self.rows.extend(record.measurements);
    }

    /// The batch's `insert_deduplication_token`: `<spool identity>-<start>-<end>`, equal for
    /// every retry of this batch (after a restart too, see [`crate::spool`]'s in-flight
    /// record) and never equal for two different batches, of this spool or any other.
    pub fn dedup_token(&self) -> String {
        format!(
            "{}-{}-{}-{}-{}",
            self.spool, self.start.segment, self.start.offset, self.end.segment, self.end.offset
        )
    }
}

/// How an insert failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsertError {
    /// Worth retrying: network, timeout, 5xx, read-only replica, too many parts, ...
    Transient(String),
    /// ClickHouse refuses this data (e.g. code 117 INCORRECT_DATA, 53 TYPE_MISMATCH):
    /// retrying the same batch cannot succeed.
    Permanent(String),
}

/// ClickHouse error codes that mean "this data is bad", from ClickHouse's
/// `src/Common/ErrorCodes.cpp`: 6 CANNOT_PARSE_TEXT, 26 CANNOT_PARSE_QUOTED_STRING,
/// 27 CANNOT_PARSE_INPUT_ASSERTION_FAILED, 33 CANNOT_READ_ALL_DATA, 38 CANNOT_PARSE_DATE,
/// 41 CANNOT_PARSE_DATETIME, 53 TYPE_MISMATCH, 69 ARGUMENT_OUT_OF_BOUND, 70 CANNOT_CONVERT_TYPE,
/// 72 CANNOT_PARSE_NUMBER, 117 INCORRECT_DATA, 130 CANNOT_READ_ARRAY_FROM_TEXT.
pub const BAD_DATA_CODES: [u32; 12] = [6, 26, 27, 33, 38, 41, 53, 69, 70, 72, 117, 130];

/// Classifies a ClickHouse client error.
pub fn classify(error: &clickhouse::error::Error) -> InsertError {
    let text = crate::logging::chain(error);
    if let clickhouse::error::Error::BadResponse(body) = error {
        if let Some(code) = exception_code(body) {
            if BAD_DATA_CODES.contains(&code) {
                return InsertError::Permanent(text);
            }
        }
    }
    InsertError::Transient(text)
}

/// The `Code: N` of a ClickHouse exception text.
pub fn exception_code(text: &str) -> Option<u32> {
    let rest = &text[text.find("Code: ")? + 6..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Jittered exponential backoff: a random duration in `[d/2, d]` where `d` doubles per attempt
/// from [`BACKOFF_MIN`] up to [`BACKOFF_MAX`] ("equal jitter", AWS Architecture Blog,
/// "Exponential Backoff And Jitter", 2015).
pub fn backoff(attempt: u32) -> Duration {
    let d = BACKOFF_MIN
        .saturating_mul(1 << attempt.min(16))
        .min(BACKOFF_MAX);
    let half = d / 2;
    half + rand::thread_rng().gen_range(Duration::ZERO..=half)
}

/// Runs the writer until `shutdown` turns true; then flushes what it can within
/// [`DRAIN_DEADLINE`] and leaves the rest in the spool.
pub async fn run(
    mut reader: SpoolReader,
    replicas: Replicas,
    limits: BatchLimits,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut records = Vec::new();
    let spool: Arc<str> = reader.identity().into();
    loop {
        let Some(batch) =
            next_batch(&mut reader, &spool, &mut records, limits, &mut shutdown).await
        else {
            return;
        };
        reader.record_in_flight(batch.start, batch.end);
        // When the drain began, as seen by this batch: set by `drain_deadline` when shutdown
        // is asked for (a batch begun before it must give up too, not retry forever).
        let mut draining_since = (*shutdown.borrow()).then(Instant::now);
        let mut attempt = 0u32;
        loop {
            if attempt > 0 {
                metrics.batches_retried.inc();
            }
            let target = replicas.pick();
            // An insert into a replica that hangs (frozen, black-holed) can take up to the
            // insert timeout per replica: the drain deadline must cut it, not wait for it. A
            // cut insert may still complete on the server: the batch stays in the spool and
            // is sent again after the restart with the same token (see `INFLIGHT`).
            let result = tokio::select! {
                r = replicas.insert(target, &batch) => r,
                () = drain_deadline(&mut shutdown, &mut draining_since) => {
                    tracing::warn!(
                        rows = batch.rows.len(),
                        replica = %replicas.url(target),
                        "drain deadline passed during an insert; the batch stays in the spool"
                    );
                    return;
                }
            };
            match result {
                Ok(()) => {
                    confirm(&mut reader, &batch);
                    break;
                }
                Err(InsertError::Permanent(reason)) => {
                    match reader.keep_aside(batch.start, &batch.rows, &reason) {
                        Ok(path) => {
                            tracing::error!(rows = batch.rows.len(), file = %path.display(), %reason, "clickhouse refused a batch as bad data; kept aside")
                        }
                        Err(e) => {
                            tracing::error!(error = %crate::logging::chain(&e), "cannot keep a refused batch aside; retrying later");
                            tokio::time::sleep(backoff(attempt)).await;
                            attempt += 1;
                            continue;
                        }
                    }
                    metrics.kept_aside.inc();
                    confirm(&mut reader, &batch);
                    break;
                }
                Err(InsertError::Transient(reason)) => {
                    // Not a warning: every attempt counts against its replica, and a replica
                    // that keeps failing is logged once when it goes down, with this cause
                    // (`Replicas::set_state`), then once a minute while it stays down.
                    tracing::debug!(replica = %replicas.url(target), %reason, attempt, "clickhouse insert failed; will retry");
                    tokio::select! {
                        () = tokio::time::sleep(backoff(attempt)) => {}
                        () = drain_deadline(&mut shutdown, &mut draining_since) => {
                            tracing::warn!(
                                rows = batch.rows.len(),
                                last_error = %reason,
                                "drain deadline passed; the batch stays in the spool"
                            );
                            return;
                        }
                    }
                    attempt = attempt.saturating_add(1);
                }
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

fn confirm(reader: &mut SpoolReader, batch: &Batch) {
    reader.confirm(batch.end, batch.rows.len() as u64, batch.bytes);
}

/// Gathers the next batch; `None` once shutdown is requested and nothing is left to read.
async fn next_batch(
    reader: &mut SpoolReader,
    spool: &Arc<str>,
    records: &mut Vec<Record>,
    limits: BatchLimits,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Batch> {
    let start = reader.position();
    let mut batch = Batch {
        spool: spool.clone(),
        start,
        end: start,
        rows: Vec::new(),
        bytes: 0,
    };
    let mut deadline: Option<Instant> = None;
    loop {
        // Read in chunks: decoding a large backlog at once would hold the CPU from intake.
        let room = (limits.max_bytes as u64)
            .saturating_sub(batch.bytes)
            .clamp(1, READ_CHUNK_BYTES);
        tokio::task::block_in_place(|| reader.read_available(room, records));
        let got = !records.is_empty();
        for record in records.drain(..) {
            batch.push(record);
        }
        if !batch.rows.is_empty() && deadline.is_none() {
            deadline = Some(Instant::now() + limits.max_age);
        }
        // A batch replayed after a restart ends where it ended before (same token).
        let replayed = reader
            .replay_bound()
            .is_some_and(|b| reader.position() >= b);
        let full = replayed
            || batch.rows.len() >= limits.max_rows
            || batch.bytes >= limits.max_bytes as u64;
        let draining = *shutdown.borrow();
        match deadline {
            Some(_) if full || draining => return Some(batch),
            Some(d) if Instant::now() >= d => return Some(batch),
            Some(_) if got => tokio::task::yield_now().await,
            Some(d) => {
                tokio::select! {
                    _ = reader.wait(d.saturating_duration_since(Instant::now())) => {}
                    _ = shutdown.changed() => {}
                }
            }
            None if draining => return None,
            None => {
                tokio::select! {
                    _ = reader.wait(Duration::from_secs(1)) => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exception_codes() {
        assert_eq!(
            exception_code("Code: 117, e.displayText() = DB::Exception: bad"),
            Some(117)
        );
        assert_eq!(
            exception_code("Code: 53. DB::Exception: Type mismatch"),
            Some(53)
        );
        assert_eq!(exception_code("connection refused"), None);
    }

    #[test]
    fn classification() {
        let bad = clickhouse::error::Error::BadResponse(
            "Code: 117. DB::Exception: Incorrect data".into(),
        );
        assert!(matches!(classify(&bad), InsertError::Permanent(_)));
        let ro = clickhouse::error::Error::BadResponse(
            "Code: 242. DB::Exception: Table is in readonly mode".into(),
        );
        assert!(matches!(classify(&ro), InsertError::Transient(_)));
        let parts = clickhouse::error::Error::BadResponse(
            "Code: 252. DB::Exception: Too many parts".into(),
        );
        assert!(matches!(classify(&parts), InsertError::Transient(_)));
        assert!(matches!(
            classify(&clickhouse::error::Error::TimedOut),
            InsertError::Transient(_)
        ));
    }

    #[test]
    fn tokens_differ_between_spools_and_between_ranges() {
        let at = |segment, offset| Position { segment, offset };
        let batch = |spool: &str, end| Batch {
            spool: spool.into(),
            start: at(1, 8),
            end: at(1, end),
            rows: Vec::new(),
            bytes: 0,
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

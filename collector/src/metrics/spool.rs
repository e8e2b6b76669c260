//! The spool's families: what it holds, its syncs, its disk.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::monotonic_nanos;

/// [`SpoolMetrics::oldest_held_since`] when the spool holds nothing unconfirmed.
pub const NOTHING_HELD: i64 = i64::MIN;

/// `collector_spool_*`.
pub struct SpoolMetrics {
    /// `collector_spool_bytes`: spooled bytes ClickHouse has not confirmed.
    pub bytes: Gauge<i64, AtomicI64>,
    /// `collector_spool_records`: spooled measurements ClickHouse has not confirmed.
    pub records: Gauge<i64, AtomicI64>,
    /// `collector_spool_disk_bytes`: bytes of frames in the spool's segments, confirmed records
    /// awaiting deletion included; the preallocated room of the segment being written and of
    /// the prepared next one (up to two segments) is not counted.
    pub disk_bytes: Gauge<i64, AtomicI64>,
    /// `collector_spool_damaged_bytes_total`: bytes of damaged or torn records skipped or cut
    /// when the spool was recovered at start.
    pub damaged_bytes: Counter,
    /// `collector_spool_kept_aside_total`: dead-letter files written, each a piece of a batch
    /// ClickHouse refused as bad data.
    pub kept_aside: Counter,
    /// `collector_spool_kept_aside_rows_total`: measurements in those files (dead-letter).
    pub kept_aside_rows: Counter,
    /// `collector_spool_purged_rows_total`: measurements of erased sites (`collector sites
    /// purge`) dropped from the spool instead of inserted.
    pub purged_rows: Counter,
    /// `collector_spool_max_bytes`: the spool's bound (`COLLECTOR_SPOOL_MAX_BYTES`), so that
    /// `collector_spool_bytes / collector_spool_max_bytes` is how full it is.
    pub max_bytes: Gauge<i64, AtomicI64>,
    /// `collector_spool_disk_full`: 1 while the spool cannot write (a full disk or a quota, or
    /// another write error the log names; `/readyz` answers 503 meanwhile), else 0.
    pub disk_full: Gauge<i64, AtomicI64>,
    /// `collector_spool_sync_duration_seconds`: how long one group commit's `write` and
    /// `fdatasync` took (every 202 waits for one); its count is the number of syncs. On a full
    /// core it includes the appender's wait for the CPU after the disk answered (the appender
    /// runs below the request threads: `spool::APPENDER_NICE`).
    pub sync_duration: Histogram,
    /// Since when ([`monotonic_nanos`]) the spool holds the oldest measurement ClickHouse has
    /// not confirmed; [`NOTHING_HELD`] when there is none. Kept by the spool; exported as an age.
    pub oldest_held_since: AtomicI64,
    /// `collector_spool_oldest_record_age_seconds` (contract §2): now minus
    /// `oldest_held_since` on the monotonic clock, 0 when nothing is unconfirmed; set at each
    /// scrape ([`SpoolMetrics::refresh_age`]).
    oldest_age: Gauge<f64, AtomicU64>,
}

impl SpoolMetrics {
    /// Registers the families.
    pub fn new(r: &mut Registry) -> Self {
        let m = SpoolMetrics {
            bytes: Gauge::default(),
            records: Gauge::default(),
            disk_bytes: Gauge::default(),
            damaged_bytes: Counter::default(),
            kept_aside: Counter::default(),
            kept_aside_rows: Counter::default(),
            purged_rows: Counter::default(),
            max_bytes: Gauge::default(),
            disk_full: Gauge::default(),
            // 100 µs to 13 s: beyond the 5 s a request waits for its sync.
            sync_duration: Histogram::new(exponential_buckets(0.0001, 2.0, 18)),
            oldest_held_since: AtomicI64::new(NOTHING_HELD),
            oldest_age: Gauge::default(),
        };
        r.register(
            "collector_spool_bytes",
            "Spooled bytes not yet confirmed by ClickHouse",
            m.bytes.clone(),
        );
        r.register(
            "collector_spool_records",
            "Spooled measurements not yet confirmed by ClickHouse",
            m.records.clone(),
        );
        r.register(
            "collector_spool_disk_bytes",
            "Bytes of frames in the spool's segments (preallocated room not counted)",
            m.disk_bytes.clone(),
        );
        r.register(
            "collector_spool_damaged_bytes",
            "Bytes of damaged or torn spool records skipped at recovery",
            m.damaged_bytes.clone(),
        );
        r.register(
            "collector_spool_kept_aside",
            "Dead-letter files written: pieces of batches ClickHouse refused as bad data, kept aside",
            m.kept_aside.clone(),
        );
        r.register(
            "collector_spool_kept_aside_rows",
            "Measurements kept aside (dead-letter) because ClickHouse refused them as bad data",
            m.kept_aside_rows.clone(),
        );
        r.register(
            "collector_spool_purged_rows",
            "Measurements of erased sites dropped from the spool instead of inserted",
            m.purged_rows.clone(),
        );
        r.register(
            "collector_spool_max_bytes",
            "The spool's bound on unconfirmed bytes",
            m.max_bytes.clone(),
        );
        r.register(
            "collector_spool_disk_full",
            "1 while the spool cannot write (full disk, quota or another write error), else 0",
            m.disk_full.clone(),
        );
        r.register(
            "collector_spool_sync_duration_seconds",
            "Time of one group commit: the write and fdatasync every 202 waits for",
            m.sync_duration.clone(),
        );
        r.register(
            "collector_spool_oldest_record_age_seconds",
            "Age of the oldest measurement not yet confirmed by ClickHouse (0 when none)",
            m.oldest_age.clone(),
        );
        m
    }

    /// Sets the age gauge for a scrape now.
    pub(super) fn refresh_age(&self) {
        let since = self.oldest_held_since.load(Ordering::Relaxed);
        let age = if since == NOTHING_HELD {
            0.0
        } else {
            (monotonic_nanos().saturating_sub(since)).max(0) as f64 / 1e9
        };
        self.oldest_age.set(age);
    }

    /// The age gauge as last refreshed, in seconds.
    #[cfg(test)]
    pub(super) fn oldest_age(&self) -> f64 {
        self.oldest_age.get()
    }
}

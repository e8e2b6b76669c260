//! The spool's families: what it holds, its syncs, its disk.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::monotonic_nanos;

/// [`SpoolMetrics::oldest_held_since`] when the spool holds nothing unconfirmed.
pub const NOTHING_HELD: i64 = i64::MIN;

/// One shard's spool's own figures (contract v5 §3: one spool per shard), set by that spool;
/// [`SpoolMetrics::publish_totals`] sums them into the totals.
#[derive(Debug)]
pub struct ShardSpool {
    /// Unconfirmed bytes.
    pub bytes: AtomicI64,
    /// Unconfirmed measurements.
    pub records: AtomicI64,
    /// Bytes of frames in its segments.
    pub disk_bytes: AtomicI64,
    /// Its bound in bytes.
    pub max_bytes: AtomicI64,
    /// Since when ([`monotonic_nanos`]) it holds its oldest unconfirmed measurement;
    /// [`NOTHING_HELD`] when none.
    pub oldest_held_since: AtomicI64,
    /// Whether it cannot write.
    pub unwritable: AtomicBool,
}

impl Default for ShardSpool {
    fn default() -> Self {
        ShardSpool {
            bytes: AtomicI64::new(0),
            records: AtomicI64::new(0),
            disk_bytes: AtomicI64::new(0),
            max_bytes: AtomicI64::new(0),
            oldest_held_since: AtomicI64::new(NOTHING_HELD),
            unwritable: AtomicBool::new(false),
        }
    }
}

/// The shards' spools by name, in the order they were first named.
type ShardSpools = Arc<Mutex<Vec<(String, Arc<ShardSpool>)>>>;

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
    /// `collector_spool_purged_rows_total`: measurements of purged sites (`collector sites
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
    /// Each shard's spool (contract v5 §3): `collector_spool_bytes`, `collector_spool_records`
    /// and `collector_spool_oldest_record_age_seconds` are exported per shard (`{shard}`)
    /// beside their totals (no label).
    shards: ShardSpools,
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
            shards: ShardSpools::default(),
        };
        r.register_collector(Box::new(PerShard {
            bytes: m.bytes.clone(),
            records: m.records.clone(),
            oldest_age: m.oldest_age.clone(),
            shards: m.shards.clone(),
        }));
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
            "Measurements of purged sites dropped from the spool instead of inserted",
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
        m
    }

    /// The figures of shard `name`'s spool, made at 0 on first use.
    pub fn shard(&self, name: &str) -> Arc<ShardSpool> {
        let mut shards = self.shards.lock().unwrap();
        if let Some((_, s)) = shards.iter().find(|(n, _)| n == name) {
            return s.clone();
        }
        let s = Arc::new(ShardSpool::default());
        shards.push((name.to_owned(), s.clone()));
        s
    }

    /// Sets the totals from every shard's spool: bytes, records, disk bytes and bounds summed,
    /// the oldest held measurement the oldest of all, `disk_full` 1 while any spool cannot
    /// write. Called by a spool after it changed its own figures.
    pub fn publish_totals(&self) {
        let shards = self.shards.lock().unwrap();
        let sum = |f: fn(&ShardSpool) -> &AtomicI64| {
            shards
                .iter()
                .map(|(_, s)| f(s).load(Ordering::Relaxed))
                .sum::<i64>()
        };
        self.bytes.set(sum(|s| &s.bytes));
        self.records.set(sum(|s| &s.records));
        self.disk_bytes.set(sum(|s| &s.disk_bytes));
        self.max_bytes.set(sum(|s| &s.max_bytes));
        let unwritable = shards
            .iter()
            .any(|(_, s)| s.unwritable.load(Ordering::Relaxed));
        self.disk_full.set(i64::from(unwritable));
        let oldest = shards
            .iter()
            .map(|(_, s)| s.oldest_held_since.load(Ordering::Relaxed))
            .filter(|&t| t != NOTHING_HELD)
            .min()
            .unwrap_or(NOTHING_HELD);
        self.oldest_held_since.store(oldest, Ordering::Relaxed);
    }

    /// Sets the age gauge for a scrape now.
    pub(super) fn refresh_age(&self) {
        self.oldest_age
            .set(age_of(self.oldest_held_since.load(Ordering::Relaxed)));
    }

    /// The age gauge as last refreshed, in seconds.
    #[cfg(test)]
    pub(super) fn oldest_age(&self) -> f64 {
        self.oldest_age.get()
    }
}

/// Seconds since `since` ([`monotonic_nanos`]); 0 for [`NOTHING_HELD`].
fn age_of(since: i64) -> f64 {
    if since == NOTHING_HELD {
        0.0
    } else {
        (monotonic_nanos().saturating_sub(since)).max(0) as f64 / 1e9
    }
}

/// Exports the totals without a label and each shard's figure with `shard`, under one name.
#[derive(Debug)]
struct PerShard {
    bytes: Gauge<i64, AtomicI64>,
    records: Gauge<i64, AtomicI64>,
    oldest_age: Gauge<f64, AtomicU64>,
    shards: ShardSpools,
}

impl Collector for PerShard {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let shards: Vec<(String, Arc<ShardSpool>)> = self.shards.lock().unwrap().clone();
        let count = |a: &AtomicI64| a.load(Ordering::Relaxed);
        gauge_per_shard(
            &mut encoder,
            "collector_spool_bytes",
            "Spooled bytes not yet confirmed by ClickHouse (per shard with the shard label)",
            self.bytes.get(),
            shards.iter().map(|(n, s)| (n.as_str(), count(&s.bytes))),
        )?;
        gauge_per_shard(
            &mut encoder,
            "collector_spool_records",
            "Spooled measurements not yet confirmed by ClickHouse (per shard with the shard label)",
            self.records.get(),
            shards.iter().map(|(n, s)| (n.as_str(), count(&s.records))),
        )?;
        gauge_per_shard(
            &mut encoder,
            "collector_spool_oldest_record_age_seconds",
            "Age of the oldest measurement not yet confirmed by ClickHouse (0 when none; per shard with the shard label)",
            self.oldest_age.get(),
            shards
                .iter()
                .map(|(n, s)| (n.as_str(), age_of(count(&s.oldest_held_since)))),
        )
    }
}

/// One gauge family: `total` without a label, then one sample per `(shard, value)`.
fn gauge_per_shard<'a, V: prometheus_client::encoding::EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    total: V,
    shards: impl Iterator<Item = (&'a str, V)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    metric.encode_gauge(&total)?;
    for (shard, value) in shards {
        let labels = [("shard", shard)];
        metric.encode_family(&labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

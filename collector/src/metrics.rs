//! Prometheus metrics (contract §2, "Operations"), with prometheus-client.
//!
//! One [`Metrics`] value is created at start and shared; every station increments its own
//! fields directly (an atomic add, no lookup by name on the hot path except labelled families,
//! whose label sets are small and fixed).
//!
//! Names follow the Prometheus conventions (<https://prometheus.io/docs/practices/naming/>):
//! base units (`_seconds`, `_bytes`), `_total` for counters. Two gauges are ages that grow
//! with the clock (`collector_spool_oldest_record_age_seconds`, `collector_settings_age_seconds`):
//! their owners record a point in time ([`Metrics::spool_oldest_held_since`], on the monotonic
//! clock, so that a wall-clock step changes no age; [`Metrics::settings_loaded`]) and
//! [`Metrics::encode`] turns it into an age at scrape time.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// Label set naming one ClickHouse replica by its URL as configured.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabel {
    /// The replica's URL as configured in `COLLECTOR_CLICKHOUSE_URLS`.
    pub replica: String,
}

/// Label set naming one ClickHouse replica and how an insert into it failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaKindLabel {
    /// The replica's URL as configured in `COLLECTOR_CLICKHOUSE_URLS`.
    pub replica: String,
    /// `transient` (retried: network, timeout, 5xx, read-only, ...) or `permanent`
    /// (ClickHouse refused the data: the batch is kept aside).
    pub kind: &'static str,
}

/// Label set of `collector_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabel {
    /// The crate version (`Cargo.toml`).
    pub version: &'static str,
    /// The git commit the binary was built from (`build.rs`), or `unknown`.
    pub revision: &'static str,
}

/// Label set for a rejection reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Short reason, e.g. `invalid url`, `unknown site`.
    pub reason: String,
}

/// Label set for a dropped optional field.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FieldLabel {
    /// Request field name, e.g. `lcp_ms`.
    pub field: String,
}

/// Label set for HTTP requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    /// Route, e.g. `/api/v1/measurements`, or `other`.
    pub route: &'static str,
    /// Status code.
    pub status: u16,
}

/// Label set for a route only.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteOnly {
    /// Route, e.g. `/api/v1/measurements`, or `other`.
    pub route: &'static str,
}

/// The intake's route label and the statuses it answers (contract §2), whose
/// `collector_http_requests_total` series exist from the start: the intake alerts' ratios.
pub const INTAKE_ROUTE: &str = "/api/v1/measurements";
/// See [`INTAKE_ROUTE`].
pub const INTAKE_STATUSES: [u16; 7] = [202, 400, 403, 413, 415, 429, 503];

/// The `kind` values of `collector_clickhouse_insert_errors_total`.
pub const INSERT_ERROR_KINDS: [&str; 2] = ["transient", "permanent"];

/// Every metric the collector exports.
pub struct Metrics {
    registry: Registry,
    /// `collector_measurements_accepted_total`: measurements made durable.
    pub accepted: Counter,
    /// `collector_measurements_duplicate_total`: measurements answered as duplicates.
    pub duplicate: Counter,
    /// `collector_measurements_rejected_total{reason}`.
    pub rejected: Family<ReasonLabel, Counter>,
    /// `collector_measurements_field_dropped_total{field}`.
    pub field_dropped: Family<FieldLabel, Counter>,
    /// `collector_measurements_clock_skew_total`: `ts` values stored as NULL for skew.
    pub clock_skew: Counter,
    /// `collector_spool_bytes`: spooled bytes ClickHouse has not confirmed.
    pub spool_bytes: Gauge<i64, AtomicI64>,
    /// `collector_spool_records`: spooled measurements ClickHouse has not confirmed.
    pub spool_records: Gauge<i64, AtomicI64>,
    /// `collector_spool_disk_bytes`: bytes of frames in the spool's segments, confirmed records
    /// awaiting deletion included; the preallocated room of the segment being written and of
    /// the prepared next one (up to two segments) is not counted.
    pub spool_disk_bytes: Gauge<i64, AtomicI64>,
    /// `collector_spool_damaged_bytes_total`: bytes of damaged or torn records skipped or cut
    /// when the spool was recovered at start.
    pub spool_damaged_bytes: Counter,
    /// `collector_spool_kept_aside_total`: dead-letter files written, each a piece of a batch
    /// ClickHouse refused as bad data.
    pub kept_aside: Counter,
    /// `collector_spool_kept_aside_rows_total`: measurements in those files (dead-letter).
    pub kept_aside_rows: Counter,
    /// `collector_spool_max_bytes`: the spool's bound (`COLLECTOR_SPOOL_MAX_BYTES`), so that
    /// `collector_spool_bytes / collector_spool_max_bytes` is how full it is.
    pub spool_max_bytes: Gauge<i64, AtomicI64>,
    /// `collector_spool_disk_full`: 1 while the spool cannot write (a full disk or a quota, or
    /// another write error the log names; `/readyz` answers 503 meanwhile), else 0.
    pub spool_disk_full: Gauge<i64, AtomicI64>,
    /// `collector_spool_sync_duration_seconds`: how long one group commit's `write` and
    /// `fdatasync` took (every 202 waits for one); its count is the number of syncs. On a full
    /// core it includes the appender's wait for the CPU after the disk answered (the appender
    /// runs below the request threads: `spool::appender::APPENDER_NICE`).
    pub spool_sync_duration: Histogram,
    /// Since when ([`monotonic_nanos`]) the spool holds the oldest measurement ClickHouse has
    /// not confirmed; [`NOTHING_HELD`] when there is none. Kept by the spool; exported as an age.
    pub spool_oldest_held_since: AtomicI64,
    /// `collector_spool_oldest_record_age_seconds` (contract §2): now minus
    /// [`Metrics::spool_oldest_held_since`] on the monotonic clock, 0 when nothing is
    /// unconfirmed; set by [`Metrics::encode`].
    spool_oldest_age: Gauge<f64, AtomicU64>,
    /// `collector_settings_store_up`: 1 when the last settings-store call succeeded.
    pub settings_store_up: Gauge<i64, AtomicI64>,
    /// `collector_settings_first_fetch_limited_total`: never-seen site keys answered 503
    /// because the first-fetch budget (`settings::FIRST_FETCH_RATE` per second) was spent.
    pub settings_first_fetch_limited: Counter,
    /// `collector_settings_stale_served_total`: lookups answered from expired settings.
    pub settings_stale_served: Counter,
    /// `collector_settings_from_snapshot`: 1 while serving settings loaded from the snapshot
    /// file because the store was unreachable at start.
    pub settings_from_snapshot: Gauge<i64, AtomicI64>,
    /// `collector_settings_store_queries_total`: queries sent to the settings store.
    pub settings_store_queries: Counter,
    /// When the settings held were loaded (Unix seconds as `f64` bits); 0 before any load.
    /// When the settings held now were loaded, on the monotonic clock ([`monotonic_nanos`]);
    /// the process's start until the first load.
    settings_loaded_at: AtomicI64,
    /// `collector_settings_age_seconds`: time since the last successful full load of the
    /// settings (from the snapshot: since the snapshot was written; before any load: since
    /// the start); set by [`Metrics::encode`].
    settings_age: Gauge<f64, AtomicU64>,
    /// `collector_clickhouse_replica_state{replica}`: 0 down, 1 catching up, 2 healthy.
    pub replica_state: Family<ReplicaLabel, Gauge<i64, AtomicI64>>,
    /// `collector_clickhouse_active_replica{replica}`: 1 for the replica written to.
    pub active_replica: Family<ReplicaLabel, Gauge<i64, AtomicI64>>,
    /// `collector_clickhouse_inserts_total{replica}`: successful batch inserts.
    pub inserts: Family<ReplicaLabel, Counter>,
    /// `collector_clickhouse_replica_preference{replica}`: the replica's place in
    /// `COLLECTOR_CLICKHOUSE_URLS`, 0 for the preferred one.
    pub replica_preference: Family<ReplicaLabel, Gauge<i64, AtomicI64>>,
    /// `collector_clickhouse_insert_errors_total{replica,kind}`: failed insert attempts, see
    /// [`Metrics::insert_error`].
    pub insert_errors: Family<ReplicaKindLabel, Counter>,
    /// `collector_clickhouse_failovers_total`: switches of the active replica.
    pub failovers: Counter,
    /// `collector_batches_retried_total`: insert attempts that were retries of a batch.
    pub batches_retried: Counter,
    /// `collector_http_requests_total{route,status}`.
    pub http_requests: Family<RouteLabel, Counter>,
    /// `collector_http_request_duration_seconds{route}`.
    pub http_duration: Family<RouteOnly, Histogram>,
    /// `collector_http_shed_total`: requests answered 503 for overload before any work.
    pub shed: Counter,
    /// `collector_http_rate_limited_total`: requests answered 429.
    pub rate_limited: Counter,
    /// `collector_http_open_connections`: connections open now.
    pub open_connections: Gauge<i64, AtomicI64>,
    /// `collector_http_connections_refused_total`: connections closed at accept (limit).
    pub connections_refused: Counter,
    /// `collector_log_suppressed_total`: log lines suppressed by rate limiting.
    pub log_suppressed: Counter,
    /// `process_start_time_seconds`: when this process started (Unix seconds; the standard
    /// name of the Prometheus client libraries, which a restart-loop alert counts changes of).
    process_start: Gauge<f64, AtomicU64>,
}

/// [`Metrics::spool_oldest_held_since`] when the spool holds nothing unconfirmed.
pub const NOTHING_HELD: i64 = i64::MIN;

/// Now on this process's monotonic clock, in nanoseconds since its first reading (so an
/// earlier point, such as a recovered record's, is negative). A wall-clock step (NTP, an
/// operator) moves it neither way.
pub fn monotonic_nanos() -> i64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as i64
}

/// The git commit of this build (set by `build.rs`; `unknown` outside a git checkout).
pub const REVISION: &str = env!("COLLECTOR_REVISION");

/// Now in Unix seconds.
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            accepted: Counter::default(),
            duplicate: Counter::default(),
            rejected: Family::default(),
            field_dropped: Family::default(),
            clock_skew: Counter::default(),
            spool_bytes: Gauge::default(),
            spool_records: Gauge::default(),
            spool_disk_bytes: Gauge::default(),
            kept_aside: Counter::default(),
            kept_aside_rows: Counter::default(),
            spool_max_bytes: Gauge::default(),
            spool_disk_full: Gauge::default(),
            // 100 µs to 13 s: beyond the 5 s a request waits for its sync.
            spool_sync_duration: Histogram::new(exponential_buckets(0.0001, 2.0, 18)),
            spool_oldest_held_since: AtomicI64::new(NOTHING_HELD),
            spool_oldest_age: Gauge::default(),
            spool_damaged_bytes: Counter::default(),
            settings_store_up: Gauge::default(),
            settings_stale_served: Counter::default(),
            settings_first_fetch_limited: Counter::default(),
            settings_from_snapshot: Gauge::default(),
            settings_store_queries: Counter::default(),
            settings_loaded_at: AtomicI64::new(monotonic_nanos()),
            settings_age: Gauge::default(),
            replica_state: Family::default(),
            active_replica: Family::default(),
            inserts: Family::default(),
            replica_preference: Family::default(),
            insert_errors: Family::default(),
            failovers: Counter::default(),
            batches_retried: Counter::default(),
            http_requests: Family::default(),
            http_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            }),
            shed: Counter::default(),
            rate_limited: Counter::default(),
            open_connections: Gauge::default(),
            connections_refused: Counter::default(),
            log_suppressed: crate::logging::SUPPRESSED.clone(),
            process_start: Gauge::default(),
            registry: Registry::default(),
        };
        // Created with the process's shared state, before anything is served: close enough to
        // the start for counting restarts.
        m.process_start.set(unix_now());
        // Counter names are registered without `_total`; the encoder appends it.
        let r = &mut registry;
        r.register(
            "collector_measurements_accepted",
            "Measurements made durable",
            m.accepted.clone(),
        );
        r.register(
            "collector_measurements_duplicate",
            "Measurements answered as duplicates",
            m.duplicate.clone(),
        );
        r.register(
            "collector_measurements_rejected",
            "Measurements rejected, by reason",
            m.rejected.clone(),
        );
        r.register(
            "collector_measurements_field_dropped",
            "Invalid optional fields dropped",
            m.field_dropped.clone(),
        );
        r.register(
            "collector_measurements_clock_skew",
            "ts values stored as NULL for clock skew",
            m.clock_skew.clone(),
        );
        r.register(
            "collector_spool_bytes",
            "Spooled bytes not yet confirmed by ClickHouse",
            m.spool_bytes.clone(),
        );
        r.register(
            "collector_spool_records",
            "Spooled measurements not yet confirmed by ClickHouse",
            m.spool_records.clone(),
        );
        r.register(
            "collector_spool_disk_bytes",
            "Bytes of frames in the spool's segments (preallocated room not counted)",
            m.spool_disk_bytes.clone(),
        );
        r.register(
            "collector_spool_damaged_bytes",
            "Bytes of damaged or torn spool records skipped at recovery",
            m.spool_damaged_bytes.clone(),
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
            "collector_spool_max_bytes",
            "The spool's bound on unconfirmed bytes",
            m.spool_max_bytes.clone(),
        );
        r.register(
            "collector_spool_disk_full",
            "1 while the spool cannot write (full disk, quota or another write error), else 0",
            m.spool_disk_full.clone(),
        );
        r.register(
            "collector_spool_sync_duration_seconds",
            "Time of one group commit: the write and fdatasync every 202 waits for",
            m.spool_sync_duration.clone(),
        );
        r.register(
            "collector_spool_oldest_record_age_seconds",
            "Age of the oldest measurement not yet confirmed by ClickHouse (0 when none)",
            m.spool_oldest_age.clone(),
        );
        r.register(
            "collector_settings_age_seconds",
            "Time since the last successful full load of the site settings",
            m.settings_age.clone(),
        );
        r.register(
            "collector_settings_store_up",
            "1 when the settings store answered last time",
            m.settings_store_up.clone(),
        );
        r.register(
            "collector_settings_from_snapshot",
            "1 while serving settings from the snapshot file",
            m.settings_from_snapshot.clone(),
        );
        r.register(
            "collector_settings_stale_served",
            "Lookups answered from expired settings",
            m.settings_stale_served.clone(),
        );
        r.register(
            "collector_settings_first_fetch_limited",
            "Never-seen site keys answered 503 because the first-fetch budget was spent",
            m.settings_first_fetch_limited.clone(),
        );
        r.register(
            "collector_settings_store_queries",
            "Queries sent to the settings store",
            m.settings_store_queries.clone(),
        );
        r.register(
            "collector_clickhouse_replica_state",
            "0 down, 1 catching up, 2 healthy",
            m.replica_state.clone(),
        );
        r.register(
            "collector_clickhouse_active_replica",
            "1 for the replica being written to",
            m.active_replica.clone(),
        );
        r.register(
            "collector_clickhouse_replica_preference",
            "Place in COLLECTOR_CLICKHOUSE_URLS, 0 for the preferred replica",
            m.replica_preference.clone(),
        );
        r.register(
            "collector_clickhouse_inserts",
            "Batches inserted, by replica",
            m.inserts.clone(),
        );
        r.register(
            "collector_clickhouse_insert_errors",
            "Failed insert attempts, by replica and kind (transient, permanent)",
            m.insert_errors.clone(),
        );
        r.register(
            "collector_clickhouse_failovers",
            "Switches of the active replica",
            m.failovers.clone(),
        );
        r.register(
            "collector_batches_retried",
            "Insert attempts that retried a batch",
            m.batches_retried.clone(),
        );
        r.register(
            "collector_http_requests",
            "HTTP requests by route and status",
            m.http_requests.clone(),
        );
        r.register(
            "collector_http_request_duration_seconds",
            "HTTP request latency",
            m.http_duration.clone(),
        );
        r.register(
            "collector_http_shed",
            "Requests shed with 503 for overload",
            m.shed.clone(),
        );
        r.register(
            "collector_http_rate_limited",
            "Requests answered 429",
            m.rate_limited.clone(),
        );
        r.register(
            "collector_http_open_connections",
            "Connections open now",
            m.open_connections.clone(),
        );
        r.register(
            "collector_http_connections_refused",
            "Connections closed at accept for the connection limit",
            m.connections_refused.clone(),
        );
        r.register(
            "collector_log_suppressed",
            "Log lines suppressed by rate limiting",
            m.log_suppressed.clone(),
        );
        r.register(
            "collector_build",
            "Version and git revision of this build",
            Info::new(BuildLabel {
                version: env!("CARGO_PKG_VERSION"),
                revision: REVISION,
            }),
        );
        r.register(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch",
            m.process_start.clone(),
        );
        for reason in crate::beacon::rejection_reasons() {
            drop(m.rejected.get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            }));
        }
        for status in INTAKE_STATUSES {
            drop(m.http_requests.get_or_create(&RouteLabel {
                route: INTAKE_ROUTE,
                status,
            }));
        }
        drop(m.http_duration.get_or_create(&RouteOnly {
            route: INTAKE_ROUTE,
        }));
        for field in crate::measurement::optional_fields() {
            drop(m.field_dropped.get_or_create(&FieldLabel {
                field: field.to_owned(),
            }));
        }
        Metrics { registry, ..m }
    }

    /// Records that the settings held now were loaded at `at` (Unix seconds): now for a full
    /// load from the store, the snapshot's `written_at` for the snapshot. Kept as a point on
    /// the monotonic clock (the age `at` has now), so that a later wall-clock step moves
    /// `collector_settings_age_seconds` neither way.
    pub fn settings_loaded(&self, at: f64) {
        let age_now = (unix_now() - at).max(0.0);
        self.settings_loaded_at.store(
            monotonic_nanos() - (age_now * 1e9) as i64,
            Ordering::Relaxed,
        );
    }

    /// Creates the series of `replica` at 0 (inserts, both kinds of insert errors), so that a
    /// fresh or quiet collector exports every series the dashboard and the alerts query
    /// (Prometheus's instrumentation practice: initialise label values known in advance).
    pub fn init_replica(&self, replica: &str) {
        let label = ReplicaLabel {
            replica: replica.to_owned(),
        };
        drop(self.inserts.get_or_create(&label));
        for kind in INSERT_ERROR_KINDS {
            drop(self.insert_errors.get_or_create(&ReplicaKindLabel {
                replica: replica.to_owned(),
                kind,
            }));
        }
    }

    /// Counts one failed insert attempt into `replica`; `kind` is `transient` or `permanent`.
    pub fn insert_error(&self, replica: &str, kind: &'static str) {
        debug_assert!(INSERT_ERROR_KINDS.contains(&kind), "unknown kind {kind:?}");
        self.insert_errors
            .get_or_create(&ReplicaKindLabel {
                replica: replica.to_owned(),
                kind,
            })
            .inc();
    }

    /// Sets the clock-driven gauges (ages) for a scrape at `now` (Unix seconds).
    fn refresh_ages(&self) {
        let since = self.spool_oldest_held_since.load(Ordering::Relaxed);
        let age = if since == NOTHING_HELD {
            0.0
        } else {
            (monotonic_nanos().saturating_sub(since)).max(0) as f64 / 1e9
        };
        self.spool_oldest_age.set(age);
        let loaded = self.settings_loaded_at.load(Ordering::Relaxed);
        self.settings_age
            .set((monotonic_nanos().saturating_sub(loaded)).max(0) as f64 / 1e9);
    }

    /// Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        self.refresh_ages();
        let mut out = String::with_capacity(8192);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// Counts one rejected measurement.
    pub fn reject(&self, reason: &str) {
        debug_assert!(
            crate::beacon::rejection_reasons().any(|r| r == reason),
            "{reason:?} is missing from beacon::rejection_reasons()"
        );
        self.rejected
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts one dropped optional field.
    pub fn drop_field(&self, field: &str) {
        debug_assert!(
            crate::measurement::optional_fields().any(|f| f == field),
            "{field:?} is not an optional field of the field table"
        );
        self.field_dropped
            .get_or_create(&FieldLabel {
                field: field.to_owned(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_registered_once() {
        let text = Metrics::new().encode();
        let mut types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let n = types.len();
        types.sort_unstable();
        types.dedup();
        assert_eq!(types.len(), n, "a metric is registered twice:\n{text}");
    }

    #[test]
    fn contract_names_are_exported() {
        let m = Metrics::new();
        m.accepted.inc();
        m.reject("invalid url");
        m.replica_state
            .get_or_create(&ReplicaLabel {
                replica: "http://a:8123".into(),
            })
            .set(2);
        let text = m.encode();
        for name in [
            "collector_measurements_accepted_total 1",
            "collector_measurements_duplicate_total 0",
            "collector_measurements_rejected_total{reason=\"invalid url\"} 1",
            "collector_clickhouse_replica_state{replica=\"http://a:8123\"} 2",
            "collector_spool_bytes 0",
            "collector_spool_records 0",
            "collector_settings_store_up 0",
            "collector_settings_stale_served_total 0",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }

    fn value(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .parse()
            .unwrap()
    }

    #[test]
    fn operations_metrics_are_exported() {
        let m = Metrics::new();
        m.insert_error("http://a:8123", "permanent");
        m.replica_preference
            .get_or_create(&ReplicaLabel {
                replica: "http://a:8123".into(),
            })
            .set(0);
        let text = m.encode();
        for line in [
            "collector_clickhouse_insert_errors_total{replica=\"http://a:8123\",kind=\"permanent\"} 1",
            "collector_clickhouse_replica_preference{replica=\"http://a:8123\"} 0",
            "collector_spool_kept_aside_rows_total 0",
            "collector_spool_max_bytes 0",
            "collector_spool_disk_full 0",
            "collector_spool_oldest_record_age_seconds 0.0",
            &format!(
                "collector_build_info{{version=\"{}\",revision=\"{REVISION}\"}} 1",
                env!("CARGO_PKG_VERSION")
            ),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert!(text.contains("# TYPE collector_http_request_duration_seconds histogram"));
        let start = value(&text, "process_start_time_seconds");
        assert!((unix_now() - start).abs() < 60.0, "start {start}");
    }

    #[test]
    fn settings_age_counts_from_the_last_load() {
        let m = Metrics::new();
        m.refresh_ages();
        let before = m.settings_age.get();
        assert!(
            (0.0..60.0).contains(&before),
            "before any load: since the start, {before}"
        );
        m.settings_loaded(unix_now() - 600.0);
        m.refresh_ages();
        let age = m.settings_age.get();
        assert!((600.0..601.0).contains(&age), "{age}");
        m.spool_oldest_held_since
            .store(monotonic_nanos() - 42_000_000_000, Ordering::Relaxed);
        m.refresh_ages();
        let age = m.spool_oldest_age.get();
        assert!((42.0..43.0).contains(&age), "{age}");
    }

    #[test]
    fn known_label_values_are_exported_at_zero_from_the_start() {
        let m = Metrics::new();
        m.init_replica("http://b:8123");
        let text = m.encode();
        let mut expected: Vec<String> =
            crate::beacon::rejection_reasons()
                .map(|r| format!("collector_measurements_rejected_total{{reason=\"{r}\"}} 0"))
                .chain(crate::measurement::optional_fields().map(|f| {
                    format!("collector_measurements_field_dropped_total{{field=\"{f}\"}} 0")
                }))
                .collect();
        expected.push("collector_clickhouse_inserts_total{replica=\"http://b:8123\"} 0".into());
        for status in INTAKE_STATUSES {
            expected.push(format!(
                "collector_http_requests_total{{route=\"{INTAKE_ROUTE}\",status=\"{status}\"}} 0"
            ));
        }
        expected.push(format!(
            "collector_http_request_duration_seconds_count{{route=\"{INTAKE_ROUTE}\"}} 0"
        ));
        for kind in INSERT_ERROR_KINDS {
            expected.push(format!(
                "collector_clickhouse_insert_errors_total{{replica=\"http://b:8123\",kind=\"{kind}\"}} 0"
            ));
        }
        for line in &expected {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }
}

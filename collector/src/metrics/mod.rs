//! Prometheus metrics (contract §2, "Operations"), with prometheus-client.
//!
//! One [`Metrics`] value is created at start and shared; it is one registry and one group of
//! families per station, each in its own file that registers its families: [`intake`],
//! [`spool`], [`settings`], [`clickhouse`] (the writer's), [`http`] (the server's and the
//! router's), and the process's own here. Every station increments its own fields directly
//! (an atomic add, no lookup by name on the hot path except labelled families, whose label
//! sets are small and fixed).
//!
//! Names follow the Prometheus conventions (<https://prometheus.io/docs/practices/naming/>):
//! base units (`_seconds`, `_bytes`), `_total` for counters. Two gauges are ages that grow
//! with the clock (`collector_spool_oldest_record_age_seconds`, `collector_settings_age_seconds`):
//! their owners record a point in time ([`SpoolMetrics::oldest_held_since`], on the monotonic
//! clock, so that a wall-clock step changes no age; [`SettingsMetrics::loaded`]) and
//! [`Metrics::encode`] turns it into an age at scrape time.

use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

pub mod clickhouse;
pub mod http;
pub mod intake;
pub mod settings;
pub mod spool;

pub use clickhouse::{ClickHouseMetrics, ReplicaKindLabel, ReplicaLabel, INSERT_ERROR_KINDS};
pub use http::{HttpMetrics, RouteLabel, RouteOnly, INTAKE_ROUTE, INTAKE_STATUSES};
pub use intake::{FieldLabel, IntakeMetrics, ReasonLabel, SiteLabel};
pub use settings::SettingsMetrics;
pub use spool::{ShardSpool, SpoolMetrics, NOTHING_HELD};

/// Label set of `collector_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabel {
    /// The crate version (`Cargo.toml`).
    pub version: &'static str,
    /// The git commit the binary was built from (`build.rs`), or `unknown`.
    pub revision: &'static str,
}

/// Every metric the collector exports, by station.
pub struct Metrics {
    registry: Registry,
    /// `collector_measurements_*`.
    pub intake: IntakeMetrics,
    /// `collector_spool_*`.
    pub spool: SpoolMetrics,
    /// `collector_settings_*`.
    pub settings: SettingsMetrics,
    /// `collector_clickhouse_*`, `collector_batches_retried_total`.
    pub clickhouse: ClickHouseMetrics,
    /// `collector_http_*`.
    pub http: HttpMetrics,
}

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
        let r = &mut registry;
        let (intake, spool, settings) = (
            IntakeMetrics::new(r),
            SpoolMetrics::new(r),
            SettingsMetrics::new(r),
        );
        let (clickhouse, http) = (ClickHouseMetrics::new(r), HttpMetrics::new(r));
        r.register(
            "collector_log_suppressed",
            "Log lines suppressed by rate limiting",
            Counter::clone(&crate::logging::SUPPRESSED),
        );
        r.register(
            "collector_build",
            "Version and git revision of this build",
            Info::new(BuildLabel {
                version: env!("CARGO_PKG_VERSION"),
                revision: REVISION,
            }),
        );
        // `process_start_time_seconds`: the standard name of the Prometheus client libraries,
        // which a restart-loop alert counts changes of. Set with the process's shared state,
        // before anything is served: close enough to the start for counting restarts.
        let process_start = Gauge::<f64, AtomicU64>::default();
        process_start.set(unix_now());
        r.register(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch",
            process_start,
        );
        Metrics {
            registry,
            intake,
            spool,
            settings,
            clickhouse,
            http,
        }
    }

    /// Sets the clock-driven gauges (ages) for a scrape now.
    fn refresh_ages(&self) {
        self.spool.refresh_age();
        self.settings.refresh_age();
    }

    /// Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        self.refresh_ages();
        let mut out = String::with_capacity(8192);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

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
        m.intake.accepted.inc();
        m.intake.reject("invalid url");
        m.clickhouse
            .replica_state
            .get_or_create(&ReplicaLabel::new("a", "http://a:8123"))
            .set(2);
        let text = m.encode();
        for name in [
            "collector_measurements_accepted_total 1",
            "collector_measurements_duplicate_total 0",
            "collector_measurements_rejected_total{reason=\"invalid url\"} 1",
            "collector_clickhouse_replica_state{replica=\"http://a:8123\",shard=\"a\"} 2",
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
        m.clickhouse
            .insert_error(&ReplicaLabel::new("a", "http://a:8123"), "permanent");
        m.clickhouse
            .replica_preference
            .get_or_create(&ReplicaLabel::new("a", "http://a:8123"))
            .set(0);
        let text = m.encode();
        for line in [
            "collector_clickhouse_insert_errors_total{replica=\"http://a:8123\",shard=\"a\",kind=\"permanent\"} 1",
            "collector_clickhouse_replica_preference{replica=\"http://a:8123\",shard=\"a\"} 0",
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
        let before = m.settings.age();
        assert!(
            (0.0..60.0).contains(&before),
            "before any load: since the start, {before}"
        );
        m.settings.loaded(unix_now() - 600.0);
        m.refresh_ages();
        let age = m.settings.age();
        assert!((600.0..601.0).contains(&age), "{age}");
        m.spool
            .oldest_held_since
            .store(monotonic_nanos() - 42_000_000_000, Ordering::Relaxed);
        m.refresh_ages();
        let age = m.spool.oldest_age();
        assert!((42.0..43.0).contains(&age), "{age}");
    }

    #[test]
    fn known_label_values_are_exported_at_zero_from_the_start() {
        let m = Metrics::new();
        m.intake.init(
            crate::beacon::rejection_reasons(),
            crate::measurement::optional_fields(),
        );
        m.clickhouse
            .init_replica(&ReplicaLabel::new("b", "http://b:8123"));
        let text = m.encode();
        let mut expected: Vec<String> =
            crate::beacon::rejection_reasons()
                .map(|r| format!("collector_measurements_rejected_total{{reason=\"{r}\"}} 0"))
                .chain(crate::measurement::optional_fields().map(|f| {
                    format!("collector_measurements_field_dropped_total{{field=\"{f}\"}} 0")
                }))
                .collect();
        expected.push(
            "collector_clickhouse_inserts_total{replica=\"http://b:8123\",shard=\"b\"} 0".into(),
        );
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
                "collector_clickhouse_insert_errors_total{{replica=\"http://b:8123\",shard=\"b\",kind=\"{kind}\"}} 0"
            ));
        }
        for line in &expected {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }
}

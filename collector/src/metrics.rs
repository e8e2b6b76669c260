//! Prometheus metrics (contract §2, "Operations"), with prometheus-client.
//!
//! One [`Metrics`] value is created at start and shared; every station increments its own
//! fields directly (an atomic add, no lookup by name on the hot path except labelled families,
//! whose label sets are small and fixed).

use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Label set naming one ClickHouse replica by its URL as configured.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabel {
    /// The replica's URL as configured in `COLLECTOR_CLICKHOUSE_URLS`.
    pub replica: String,
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
    /// `collector_spool_disk_bytes`: size of the spool's segment files, confirmed records
    /// awaiting deletion included.
    pub spool_disk_bytes: Gauge<i64, AtomicI64>,
    /// `collector_spool_damaged_bytes_total`: bytes of damaged or torn records skipped or cut
    /// when the spool was recovered at start.
    pub spool_damaged_bytes: Counter,
    /// `collector_spool_kept_aside_total`: batches ClickHouse refused as bad data, kept aside.
    pub kept_aside: Counter,
    /// `collector_settings_store_up`: 1 when the last settings-store call succeeded.
    pub settings_store_up: Gauge<i64, AtomicI64>,
    /// `collector_settings_stale_served_total`: lookups answered from expired settings.
    pub settings_stale_served: Counter,
    /// `collector_settings_from_snapshot`: 1 while serving settings loaded from the snapshot
    /// file because the store was unreachable at start.
    pub settings_from_snapshot: Gauge<i64, AtomicI64>,
    /// `collector_settings_store_queries_total`: queries sent to the settings store.
    pub settings_store_queries: Counter,
    /// `collector_clickhouse_replica_state{replica}`: 0 down, 1 catching up, 2 healthy.
    pub replica_state: Family<ReplicaLabel, Gauge<i64, AtomicI64>>,
    /// `collector_clickhouse_active_replica{replica}`: 1 for the replica written to.
    pub active_replica: Family<ReplicaLabel, Gauge<i64, AtomicI64>>,
    /// `collector_clickhouse_inserts_total{replica}`: successful batch inserts.
    pub inserts: Family<ReplicaLabel, Counter>,
    /// `collector_clickhouse_insert_errors_total{replica}`: failed insert attempts.
    pub insert_errors: Family<ReplicaLabel, Counter>,
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
            spool_damaged_bytes: Counter::default(),
            settings_store_up: Gauge::default(),
            settings_stale_served: Counter::default(),
            settings_from_snapshot: Gauge::default(),
            settings_store_queries: Counter::default(),
            replica_state: Family::default(),
            active_replica: Family::default(),
            inserts: Family::default(),
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
            registry: Registry::default(),
        };
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
            "Size of the spool's segment files",
            m.spool_disk_bytes.clone(),
        );
        r.register(
            "collector_spool_damaged_bytes",
            "Bytes of damaged or torn spool records skipped at recovery",
            m.spool_damaged_bytes.clone(),
        );
        r.register(
            "collector_spool_kept_aside",
            "Batches refused by ClickHouse as bad data and kept aside",
            m.kept_aside.clone(),
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
            "collector_clickhouse_inserts",
            "Batches inserted, by replica",
            m.inserts.clone(),
        );
        r.register(
            "collector_clickhouse_insert_errors",
            "Failed insert attempts, by replica",
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
        Metrics { registry, ..m }
    }

    /// Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(8192);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// Counts one rejected measurement.
    pub fn reject(&self, reason: &str) {
        self.rejected
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts one dropped optional field.
    pub fn drop_field(&self, field: &str) {
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
}

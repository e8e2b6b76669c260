//! The writer's families: the replicas, inserts and failovers.

use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Label set naming one ClickHouse replica by its URL as configured, and its shard.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabel {
    /// The replica's URL as configured (`COLLECTOR_CLICKHOUSE_URLS` or `_SHARDS`).
    pub replica: String,
    /// Its shard's name (contract v5 §3; `default` for `COLLECTOR_CLICKHOUSE_URLS`).
    pub shard: String,
}

/// Label set naming one ClickHouse replica and how an insert into it failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaKindLabel {
    /// The replica's URL as configured (`COLLECTOR_CLICKHOUSE_URLS` or `_SHARDS`).
    pub replica: String,
    /// Its shard's name.
    pub shard: String,
    /// `transient` (retried: network, timeout, 5xx, read-only, ...) or `permanent`
    /// (ClickHouse refused the data: the batch is kept aside).
    pub kind: &'static str,
}

/// The `kind` values of `collector_clickhouse_insert_errors_total`.
pub const INSERT_ERROR_KINDS: [&str; 2] = ["transient", "permanent"];

/// `collector_clickhouse_*` and `collector_batches_retried_total`.
pub struct ClickHouseMetrics {
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
    /// [`ClickHouseMetrics::insert_error`].
    pub insert_errors: Family<ReplicaKindLabel, Counter>,
    /// `collector_clickhouse_failovers_total`: switches of the active replica.
    pub failovers: Counter,
    /// `collector_batches_retried_total`: insert attempts that were retries of a batch.
    pub batches_retried: Counter,
}

impl ClickHouseMetrics {
    /// Registers the families.
    pub fn new(r: &mut Registry) -> Self {
        let m = ClickHouseMetrics {
            replica_state: Family::default(),
            active_replica: Family::default(),
            inserts: Family::default(),
            replica_preference: Family::default(),
            insert_errors: Family::default(),
            failovers: Counter::default(),
            batches_retried: Counter::default(),
        };
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
        m
    }

    /// Creates the series of `replica` at 0 (inserts, both kinds of insert errors), so that a
    /// fresh or quiet collector exports every series the dashboard and the alerts query
    /// (Prometheus's instrumentation practice: initialise label values known in advance).
    pub fn init_replica(&self, label: &ReplicaLabel) {
        drop(self.inserts.get_or_create(label));
        for kind in INSERT_ERROR_KINDS {
            drop(self.insert_errors.get_or_create(&label.with_kind(kind)));
        }
    }

    /// Counts one failed insert attempt into the replica of `label`; `kind` is `transient` or
    /// `permanent`.
    pub fn insert_error(&self, label: &ReplicaLabel, kind: &'static str) {
        debug_assert!(INSERT_ERROR_KINDS.contains(&kind), "unknown kind {kind:?}");
        self.insert_errors
            .get_or_create(&label.with_kind(kind))
            .inc();
    }
}

impl ReplicaLabel {
    /// The label of replica `replica` of shard `shard`.
    pub fn new(shard: &str, replica: &str) -> Self {
        ReplicaLabel {
            replica: replica.to_owned(),
            shard: shard.to_owned(),
        }
    }

    fn with_kind(&self, kind: &'static str) -> ReplicaKindLabel {
        ReplicaKindLabel {
            replica: self.replica.clone(),
            shard: self.shard.clone(),
            kind,
        }
    }
}

//! The settings store's and cache's families.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{monotonic_nanos, unix_now};

/// `collector_settings_*`.
pub struct SettingsMetrics {
    /// `collector_settings_store_up`: 1 when the last settings-store call succeeded.
    pub store_up: Gauge<i64, AtomicI64>,
    /// `collector_settings_first_fetch_limited_total`: never-seen site keys answered 503
    /// because the first-fetch budget (`settings::FIRST_FETCH_RATE` per second) was spent.
    pub first_fetch_limited: Counter,
    /// `collector_settings_stale_served_total`: lookups answered from expired settings.
    pub stale_served: Counter,
    /// `collector_settings_from_snapshot`: 1 while serving settings loaded from the snapshot
    /// file because the store was unreachable at start.
    pub from_snapshot: Gauge<i64, AtomicI64>,
    /// `collector_settings_store_queries_total`: queries sent to the settings store.
    pub store_queries: Counter,
    /// When the settings held now were loaded, on the monotonic clock ([`monotonic_nanos`]);
    /// the process's start until the first load.
    loaded_at: AtomicI64,
    /// `collector_settings_age_seconds`: time since the last successful full load of the
    /// settings (from the snapshot: since the snapshot was written; before any load: since
    /// the start); set at each scrape ([`SettingsMetrics::refresh_age`]).
    age: Gauge<f64, AtomicU64>,
}

impl SettingsMetrics {
    /// Registers the families.
    pub fn new(r: &mut Registry) -> Self {
        let m = SettingsMetrics {
            store_up: Gauge::default(),
            first_fetch_limited: Counter::default(),
            stale_served: Counter::default(),
            from_snapshot: Gauge::default(),
            store_queries: Counter::default(),
            loaded_at: AtomicI64::new(monotonic_nanos()),
            age: Gauge::default(),
        };
        r.register(
            "collector_settings_age_seconds",
            "Time since the last successful full load of the site settings",
            m.age.clone(),
        );
        r.register(
            "collector_settings_store_up",
            "1 when the settings store answered last time",
            m.store_up.clone(),
        );
        r.register(
            "collector_settings_from_snapshot",
            "1 while serving settings from the snapshot file",
            m.from_snapshot.clone(),
        );
        r.register(
            "collector_settings_stale_served",
            "Lookups answered from expired settings",
            m.stale_served.clone(),
        );
        r.register(
            "collector_settings_first_fetch_limited",
            "Never-seen site keys answered 503 because the first-fetch budget was spent",
            m.first_fetch_limited.clone(),
        );
        r.register(
            "collector_settings_store_queries",
            "Queries sent to the settings store",
            m.store_queries.clone(),
        );
        m
    }

    /// Records that the settings held now were loaded at `at` (Unix seconds): now for a full
    /// load from the store, the snapshot's `written_at` for the snapshot. Kept as a point on
    /// the monotonic clock (the age `at` has now), so that a later wall-clock step moves
    /// `collector_settings_age_seconds` neither way.
    pub fn loaded(&self, at: f64) {
        let age_now = (unix_now() - at).max(0.0);
        self.loaded_at.store(
            monotonic_nanos() - (age_now * 1e9) as i64,
            Ordering::Relaxed,
        );
    }

    /// Sets the age gauge for a scrape now.
    pub(super) fn refresh_age(&self) {
        let loaded = self.loaded_at.load(Ordering::Relaxed);
        self.age
            .set((monotonic_nanos().saturating_sub(loaded)).max(0) as f64 / 1e9);
    }

    /// The age gauge as last refreshed, in seconds.
    #[cfg(test)]
    pub(super) fn age(&self) -> f64 {
        self.age.get()
    }
}

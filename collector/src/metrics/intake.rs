//! The intake's families: what became of each measurement sent.

use std::sync::atomic::{AtomicI64, AtomicU64};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Label set for a rejection reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Short reason, e.g. `invalid url`, `unknown or disabled site`.
    pub reason: String,
}

/// Label set for a dropped optional field.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FieldLabel {
    /// Request field name, e.g. `lcp_ms`.
    pub field: String,
}

/// Label set naming a site (only sites sampled below their configured rate have a series: a
/// bounded set, see [`crate::sampling`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SiteLabel {
    /// The site key.
    pub site: String,
}

/// `collector_measurements_*`, and the sampling of sites over their budget.
pub struct IntakeMetrics {
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
    /// `collector_site_sample_rate{site}`: the rate answered for a site over its budget (only
    /// while it is below the site's configured rate).
    pub site_sample_rate: Family<SiteLabel, Gauge<f64, AtomicU64>>,
    /// `collector_sites_sampled`: sites answered a rate below their configured one now.
    pub sites_sampled: Gauge<i64, AtomicI64>,
}

impl IntakeMetrics {
    /// Registers the families ([`IntakeMetrics::init`] creates their series).
    pub fn new(r: &mut Registry) -> Self {
        let m = IntakeMetrics {
            accepted: Counter::default(),
            duplicate: Counter::default(),
            rejected: Family::default(),
            field_dropped: Family::default(),
            clock_skew: Counter::default(),
            site_sample_rate: Family::default(),
            sites_sampled: Gauge::default(),
        };
        r.register(
            "collector_site_sample_rate",
            "The sample_rate answered for a site over its budget (only while below its configured rate)",
            m.site_sample_rate.clone(),
        );
        r.register(
            "collector_sites_sampled",
            "Sites answered a sample_rate below their configured one",
            m.sites_sampled.clone(),
        );
        // Counter names are registered without `_total`; the encoder appends it.
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
        m
    }

    /// Creates the series of every rejection reason and dropped field intake can count, at
    /// 0 (Prometheus's instrumentation practice: initialise label values known in advance, so
    /// that a rate over them exists before the first one). Intake knows them (the field
    /// table's), so the composition root calls this at start.
    pub fn init<'a>(
        &self,
        reasons: impl IntoIterator<Item = &'a str>,
        fields: impl IntoIterator<Item = &'a str>,
    ) {
        for reason in reasons {
            drop(self.rejected.get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            }));
        }
        for field in fields {
            drop(self.field_dropped.get_or_create(&FieldLabel {
                field: field.to_owned(),
            }));
        }
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

//! The intake's families: what became of each measurement sent.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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

/// `collector_measurements_*`.
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
        };
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

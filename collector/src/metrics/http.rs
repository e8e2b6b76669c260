//! The server's and the router's families: requests, connections, shedding.

use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

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

/// `collector_http_*`.
pub struct HttpMetrics {
    /// `collector_http_requests_total{route,status}`.
    pub requests: Family<RouteLabel, Counter>,
    /// `collector_http_request_duration_seconds{route}`.
    pub duration: Family<RouteOnly, Histogram>,
    /// `collector_http_shed_total`: requests answered 503 for overload before any work.
    pub shed: Counter,
    /// `collector_http_rate_limited_total`: requests answered 429.
    pub rate_limited: Counter,
    /// `collector_http_over_share_total`: of those, requests refused as a client's
    /// measurements beyond its share of a site's budget (contract v5 §2;
    /// [`crate::limits::shares`]).
    pub over_share: Counter,
    /// `collector_http_open_connections`: connections open now.
    pub open_connections: Gauge<i64, AtomicI64>,
    /// `collector_http_connections_refused_total`: connections closed at accept (limit).
    pub connections_refused: Counter,
}

impl HttpMetrics {
    /// Registers the families, with the intake's route and statuses at 0 from the start.
    pub fn new(r: &mut Registry) -> Self {
        let m = HttpMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            }),
            shed: Counter::default(),
            rate_limited: Counter::default(),
            over_share: Counter::default(),
            open_connections: Gauge::default(),
            connections_refused: Counter::default(),
        };
        r.register(
            "collector_http_requests",
            "HTTP requests by route and status",
            m.requests.clone(),
        );
        r.register(
            "collector_http_request_duration_seconds",
            "HTTP request latency",
            m.duration.clone(),
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
            "collector_http_over_share",
            "Requests answered 429 because their client sent beyond its share of a site's budget",
            m.over_share.clone(),
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
        for status in INTAKE_STATUSES {
            drop(m.requests.get_or_create(&RouteLabel {
                route: INTAKE_ROUTE,
                status,
            }));
        }
        drop(m.duration.get_or_create(&RouteOnly {
            route: INTAKE_ROUTE,
        }));
        m
    }
}

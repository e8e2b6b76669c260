//! The stored row: one validated measurement, exactly as it goes to ClickHouse.
//!
//! The same value is what the spool keeps on disk (as JSON, see `spool`) and what the writer
//! inserts (as RowBinary), so a batch replayed after a crash or retried on another replica
//! carries the same values as the first attempt.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// One measurement of one page view, validated and normalised.
///
/// Field names are the column names of `measurements` (`schema/clickhouse/002_measurements.sql`)
/// and, for the metrics, the names of the request fields (contract §2 and §3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clickhouse::Row)]
pub struct Measurement {
    /// The client-made measurement id; one row per id after `FINAL`.
    #[serde(with = "clickhouse::serde::uuid")]
    pub id: Uuid,
    /// Site key, 1 to 64 characters from `A-Za-z0-9._-`.
    pub site: String,
    /// Server time of acceptance, seconds since the Unix epoch (ClickHouse `DateTime`).
    pub received_at: u32,
    /// Page URL, WHATWG-normalised, without fragment or credentials, at most 2048 bytes.
    pub url: String,
    /// Client time in milliseconds since the Unix epoch; `None` when absent, invalid or skewed.
    pub ts: Option<i64>,
    /// Referrer, normalised as `url` is, at most 2048 bytes.
    pub referrer: Option<String>,
    /// One of `navigate`, `reload`, `back_forward`, `back_forward_cache`, `prerender`,
    /// `restore`.
    pub navigation_type: Option<String>,
    /// Time to first byte, milliseconds, 0 to 3,600,000.
    pub ttfb_ms: Option<f64>,
    /// First Contentful Paint, milliseconds, 0 to 3,600,000.
    pub fcp_ms: Option<f64>,
    /// Largest Contentful Paint, milliseconds, 0 to 3,600,000.
    pub lcp_ms: Option<f64>,
    /// Interaction to Next Paint, milliseconds, 0 to 3,600,000.
    pub inp_ms: Option<f64>,
    /// `DOMContentLoaded` event end, milliseconds, 0 to 3,600,000.
    pub dom_content_loaded_ms: Option<f64>,
    /// `load` event end, milliseconds, 0 to 3,600,000.
    pub load_ms: Option<f64>,
    /// Cumulative Layout Shift, unitless, 0 to 100.
    pub cls: Option<f64>,
    /// Viewport width in CSS pixels, 0 to 100,000.
    pub viewport_width: Option<u32>,
    /// One of `slow-2g`, `2g`, `3g`, `4g`.
    pub effective_connection_type: Option<String>,
    /// The request's `User-Agent`, truncated to [`MAX_USER_AGENT_BYTES`].
    pub user_agent: String,
    /// The site's `sample_rate` in force when the measurement was accepted, 0 to 1: the
    /// share of page views whose script sends, so that an aggregate can weight each row by
    /// its inverse. Spool records written before this column existed read as 1 (every page
    /// view was sent then).
    #[serde(default = "every_page_view")]
    pub sample_rate: f64,
}

fn every_page_view() -> f64 {
    1.0
}

/// The longest user agent stored, in bytes; longer ones are cut at a character boundary.
pub const MAX_USER_AGENT_BYTES: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;

    /// A spool record written before `sample_rate` existed (the JSON of a row of that
    /// release) still replays, as a row of a page view that was always sent.
    #[test]
    fn a_record_without_sample_rate_reads_as_rate_one() {
        let old = r#"{"id":"7f1c2a3e-9b4d-4c6e-8f00-123456789abc","site":"s","received_at":1780000000,
            "url":"https://a.example/","ts":null,"referrer":null,"navigation_type":"navigate",
            "ttfb_ms":1.5,"fcp_ms":null,"lcp_ms":null,"inp_ms":null,"dom_content_loaded_ms":null,
            "load_ms":null,"cls":null,"viewport_width":390,"effective_connection_type":null,
            "user_agent":"UA"}"#;
        let m: Measurement = serde_json::from_str(old).unwrap();
        assert_eq!(m.sample_rate, 1.0);
        assert_eq!(m.viewport_width, Some(390));
        let again: Measurement = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(again, m);
    }
}

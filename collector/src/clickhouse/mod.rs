//! ClickHouse, in one place: how an insert failed ([`errors`]), the INSERT itself
//! ([`insert`]) and the schema with its two table forms ([`schema`]). The writer
//! ([`crate::writer`]) and `collector migrate` ([`crate::cli::migrate`]) use it; it uses neither.
//!
//! Inside this module and everywhere else, `clickhouse::…` names the `clickhouse` crate (the
//! HTTP client); this module is `crate::clickhouse`.

pub mod erase;
pub mod errors;
pub mod insert;
pub mod schema;

use crate::config::ClickHouseConfig;

/// A client of the ClickHouse server at `url` (as configured, without a trailing slash), as
/// the one-shot commands use it: one request at a time, no compression, no row validation.
pub fn client(url: &str, _config: &ClickHouseConfig) -> clickhouse::Client {
    clickhouse::Client::default()
        .with_url(url)
        .with_validation(false)
}

//! ClickHouse, in one place: how an insert failed ([`errors`]), the INSERT itself
//! ([`insert`]) and the schema with its two table forms ([`schema`]). The writer
//! ([`crate::writer`]) and `collector migrate` ([`crate::cli::migrate`]) use it; it uses neither.
//!
//! Inside this module and everywhere else, `clickhouse::…` names the `clickhouse` crate (the
//! HTTP client); this module is `crate::clickhouse`.

pub mod errors;
pub mod insert;
pub mod schema;

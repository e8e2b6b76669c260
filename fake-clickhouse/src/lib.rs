//! Test-only ClickHouse HTTP servers, shared by both test tiers.
//!
//! - [`memory`]: an in-memory ClickHouse, enough of its HTTP interface for the collector's
//!   writer and prober, with faults (the in-process tier, `collector/tests/in_process`).
//! - [`standin`]: a proxy in front of a real ClickHouse 18.16 replica that shows what only
//!   current replicas show (the real-server tier, `tests/tests/shape.rs`).
//! - [`lost_answer`]: a proxy that loses the answers of INSERTs the server stored (the
//!   real-server tier, `tests/tests/ch26.rs`).
//!
//! What they share: [`serve`] (a loopback HTTP server running a handler, stopped when
//! dropped), [`request`] (a request's query parameters and whether it is an INSERT),
//! [`tokens`] (a table's memory of `insert_deduplication_token`s) and [`proxy`] (forwarding
//! to the real server).

pub mod lost_answer;
pub mod memory;
pub mod proxy;
pub mod request;
pub mod serve;
pub mod standin;
pub mod tokens;

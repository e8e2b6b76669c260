//! The test bench of the collector, compiled once: helpers that start real servers (the
//! collector under test, PostgreSQL, ZooKeeper, ClickHouse replicas, nginx, browsers), stand-ins
//! for what no real server can show, and the diagnostics a failed test prints. The tests
//! themselves live in `tests/tests/*.rs`, one module per file of one binary
//! (`tests/tests/integration.rs`; `containers_engine/` is a binary of its own), each
//! `use collector_tests::common`.

pub mod common;

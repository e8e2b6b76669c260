//! The real-server tier in one test binary: one module per subject, each a file of this folder
//! (`tests/tests/NAME.rs`, its tests named `NAME::test`) or, for a large one, a folder of it
//! split by subject (`tests/tests/NAME/mod.rs` and `NAME/PART.rs`, its tests named
//! `NAME::PART::test`, so that a filter `test(/^NAME::/)` still takes them all). One binary
//! instead of one per file:
//! the dependency graph is linked once, not 25 times. `containers_engine/` stays a binary of
//! its own: its `#[ignore]`d tests are run by `scripts/check-containers.sh --engine` alone.
//!
//! Under `cargo nextest` (what `scripts/test.sh` runs) every test is a process of its own, and
//! `.config/nextest.toml`'s test groups keep apart the tests that share a stack they break; under
//! `cargo test` they share this process, and the locks in `collector_tests::common`
//! (`FAILOVER_TURN`) and in `shards/` (`TURN`) do the same.

mod access;
mod browser;
mod ch26;
mod clock;
mod containers;
mod disk_full;
mod edge;
mod edge_failover;
mod engines;
mod failover;
mod intake;
mod logs;
mod masking;
mod nextest_groups;
mod observability;
mod parity;
mod pooler;
mod privacy;
mod queries;
mod report;
mod report_crux;
mod sampling;
mod settings;
mod shape;
mod shards;
mod storage;
mod sync_fails;
mod upgrade;
mod upgrade_rows;

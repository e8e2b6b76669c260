//! Helpers shared by the integration tests: real servers, one database pair per test.
//!
//! - [`Stack`]: PostgreSQL, ZooKeeper and ClickHouse replicas started by the `stack` crate
//!   (the same code the main-job script runs through `scripts/stack.sh`). [`Stack::shared`] is one stack reused by
//!   every test that does not break servers (found through `STACK_ENV`, or started under
//!   `target/test-stack`); [`Stack::own`] starts a private stack a test may kill parts of.
//! - [`TestEnv`]: a fresh PostgreSQL database and ClickHouse database for one test, migrated
//!   with `collector migrate`, with a site registered.
//! - [`Collector`]: the real `collector` binary as a child process on a free port.
//! - [`Traffic`]: beacons sent to a collector while a test breaks things.
//!
//! By job, each re-exported here: [`stacks`] (the stacks of real servers), [`test_env`] (one
//! test's databases), [`collector`] (the collector process), [`traffic`], [`servers`] (nginx,
//! Caddy, PgBouncer, a 26.x server of a test's own), [`browser`], [`clients`] (HTTP,
//! ClickHouse, PostgreSQL), [`diag`] and [`process`] (waits, logs, what a failure prints),
//! [`fixtures`] (values sent and read back).
pub mod access_fixtures;
pub mod browser;
pub mod clients;
pub mod collector;
pub mod containers;
pub mod diag;
pub mod fixtures;
pub mod freeze;
pub mod process;
pub mod servers;
pub mod spool_files;
pub mod stacks;
pub mod test_env;
pub mod traffic;

/// The proxies in front of real ClickHouse servers, from the fakes both test tiers share.
pub use fake_clickhouse::{lost_answer, standin};

use std::path::{Path, PathBuf};

pub use clients::*;
pub use collector::*;
pub use diag::{poll_until, wait_until, Diag};
pub use fixtures::*;
pub use process::{log_text, rss_bytes, terminate};
pub use servers::*;
pub use stacks::*;
pub use test_env::*;
pub use traffic::*;

/// Two tests of `async fn BODY(env: TestEnv)` on the shared stack: `ON_18` with a
/// [`TestEnv::new`] (the 18.16 replicas) and `ON_26` with a [`TestEnv::on_ch26`] (the 26.x
/// server); or, written `BODY: ON_18 => empty, ON_26 => empty_on_ch26`, with the `TestEnv`
/// constructors named. Written where `BODY` is, beside it; the tests keep the names given.
#[macro_export]
macro_rules! on_both_servers {
    ($body:ident: $on_18:ident, $on_26:ident) => {
        $crate::on_both_servers!($body: $on_18 => new, $on_26 => on_ch26);
    };
    ($body:ident: $on_18:ident => $new_18:ident, $on_26:ident => $new_26:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $on_18() {
            let stack = $crate::common::Stack::shared();
            $body($crate::common::TestEnv::$new_18(stack).await).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $on_26() {
            let stack = $crate::common::Stack::shared();
            $body($crate::common::TestEnv::$new_26(stack).await).await;
        }
    };
}

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// A free TCP port on 127.0.0.1, reserved machine-wide for 10 minutes ([`stack::ports::alloc`]).
pub fn free_port() -> u16 {
    // Below the kernel's ephemeral range and reserved machine-wide (the stack's allocator): a
    // port picked by binding port 0 is an ephemeral one, which any outgoing connection on the
    // machine may take before the test's server binds it (a collector once failed to listen
    // on 127.0.0.1:36205, "Address already in use", in a fresh-clone run).
    stack::ports::alloc(1).unwrap_or_else(|e| panic!("a free loopback port: {e}"))[0]
}

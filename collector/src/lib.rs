//! The measurement collector: web-performance beacons in, ClickHouse rows out.
//!
//! # Layout
//!
//! One beacon travels one way; each station is one module:
//!
//! ```text
//! server (accept loop, limits, drain) ─► endpoints::intake
//!     ─► beacon (decode, validate, normalise) ─► settings (cache over PostgreSQL)
//!     ─► dedup (window by id) ─► measurement (encoded once, RowBinary)
//!     ─► spool (durable, group commit)                                ← 202 here
//!                                   │  frames of RowBinary rows, never decoded
//!              writer (own thread: batch, insert, bisect, confirm, failover)
//!                                   ─► ClickHouse replicas
//! ```
//!
//! - [`config`]: command line and `COLLECTOR_*` settings, every bad value reported at once.
//! - [`beacon`]: pure decoding and validation of request bodies; [`measurement`]: the row,
//!   its columns declared once, and its one encoding (RowBinary).
//! - [`settings`]: the `sites` store and the cache intake reads through.
//! - [`dedup`]: the in-memory dedup window.
//! - [`spool`]: the durable log where the request path ends and the write path begins.
//! - [`writer`]: batches from the spool into the preferred healthy replica, on a thread and
//!   runtime of its own at a lower priority than the request threads.
//! - [`server`]: the accept loop, connection and header limits, drain; it serves any router.
//! - [`endpoints`]: the routes ([`endpoints::router`]) and one handler per file, each reading
//!   the shared [`state`]; [`error`]: the intake's errors and their statuses.
//! - [`script`]: the tracking script.
//! - [`metrics`], [`logging`]: operations.
//! - [`app`]: the composition root: builds every part of `collector serve` from the
//!   configuration, wires them, and drains them on a signal.
//! - [`cli`]: the one-shot commands (`migrate`, `sites`, `probe`, `spool dump`), one file each,
//!   and [`RunError`], how a command fails.
//!
//! Intake never imports the writer and the writer never imports HTTP types: they meet only
//! in the spool. The server and the endpoints do not import each other either: [`app`] builds
//! the [`state`], hands `endpoints::router(state)` to [`server::serve`], and wires the rest;
//! [`run`] only dispatches a command line.

#![warn(missing_docs)]

pub mod app;
pub mod beacon;
pub mod cli;
pub mod clickhouse;
pub mod client_ip;
pub mod config;
pub mod dedup;
pub mod endpoints;
pub mod error;
pub mod limits;
pub mod logging;
pub mod measurement;
pub mod metrics;
pub mod script;
pub mod server;
pub mod settings;
pub mod spool;
pub mod state;
pub mod useragent;
pub mod writer;

pub use cli::RunError;
use config::{Cli, Command, Settings};

/// Exit code for bad configuration or usage (contract §1).
pub const EXIT_CONFIG: i32 = 2;
/// Exit code for a runtime failure (a server unreachable, the spool locked, ...).
pub const EXIT_FAILURE: i32 = 1;

/// Runs a parsed command line; returns the process exit code.
pub async fn run(cli: Cli) -> i32 {
    let settings = match Settings::from_args(&cli.args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("collector: {e}");
            return EXIT_CONFIG;
        }
    };
    logging::init(settings.log_format);
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => app::serve(settings).await,
        Command::Migrate => cli::migrate::run(&settings).await,
        Command::Sites { command } => cli::sites::run(&settings, command).await,
        Command::Probe => cli::probe::run(&settings).await,
        Command::Spool { command } => cli::spool::run(&settings, command),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("collector: {e}");
            e.exit_code()
        }
    }
}

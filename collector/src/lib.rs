//! The measurement collector: web-performance beacons in, ClickHouse rows out.
//!
//! # Layout
//!
//! One beacon travels one way; each station is one module:
//!
//! ```text
//! server (accept loop, limits, drain) ─► endpoints::intake
//!     ─► beacon (media, coding, JSON) ─► measurement (the field table's rules)
//!     ─► settings (cache over PostgreSQL) ─► limits ─► dedup (window by id)
//!     ─► measurement (encoded once, RowBinary) ─► spool (durable, group commit) ← 202 here
//!                                   │  records in a layout, never read by the spool
//!              writer (own thread: batch, insert, bisect, confirm, failover)
//!                                   ─► ClickHouse replicas
//! ```
//!
//! - [`config`]: the `COLLECTOR_*` configuration in sections, every bad value reported at once;
//!   [`cli`]: the command tree and the one-shot commands (`migrate`, `sites`, `probe`,
//!   `retention`, `report`, `spool dump`), one file each, and [`RunError`], how a command fails.
//! - [`report`]: a site's numbers at a glance for `collector report`: the one query (weighted
//!   by `1 / sample_rate`, web.dev's thresholds), the terminal table and the HTML page.
//! - [`server`]: the accept loop, connection and header limits, drain; it serves any router,
//!   and an idle keep-alive connection holds no HTTP state.
//! - [`endpoints`]: the routes ([`endpoints::router`]) and one handler per file, each reading
//!   the shared [`state`]; [`error`]: the intake's errors and their statuses.
//! - [`beacon`]: a request body's media type, coding and JSON, object by object;
//!   [`client_ip`]: the client's address behind trusted proxies; [`geo`]: its country, and then
//!   the address is forgotten; [`useragent`]: device, browser and OS from the `User-Agent`;
//!   [`limits`]: the in-flight bound and the site and client rates; [`sampling`]: a site over
//!   its budget answered a lower `sample_rate`.
//! - [`measurement`]: the row: its fields declared once (the field table), their rules, the
//!   page view's filing time, its one encoding (RowBinary) and its layouts.
//! - [`settings`]: the `sites` store and the cache intake reads through.
//! - [`dedup`]: the in-memory dedup window.
//! - [`spool`]: the durable log where the request path ends and the write path begins; it
//!   stores records it never reads. [`shards`]: one spool per ClickHouse shard (contract v5
//!   §3), so that a shard that is down holds back and fills only its own.
//! - [`writer`]: per shard, batches from its spool into its preferred healthy replica, on a
//!   thread and runtime of its own at a lower priority than the request threads; [`clickhouse`]: what
//!   knows ClickHouse (error classes, the insert, the schema, stored rows minimised again by
//!   `migrate`), used by the writer and `migrate`.
//! - [`script`]: the tracking script.
//! - [`purges`]: the rules at rest made from the site settings (what an earlier release left
//!   in a spool folder is held to them at open), and a purge reaching this collector's
//!   kept-aside and damaged-segment files, recorded in the settings store for `sites purge`.
//! - [`metrics`], [`logging`]: operations; [`priority`]: the background threads' nice value;
//!   [`tls`]: TLS to the databases (rustls), and PostgreSQL's `sslmode`.
//! - [`app`]: the composition root: builds every part of `collector serve` from the
//!   configuration, wires them, and drains them on a signal.
//!
//! Intake never imports the writer and the writer never imports HTTP types: they meet only
//! in the spool. The server and the endpoints do not import each other either: [`app`] builds
//! the [`state`], hands `endpoints::router(state)` to [`server::serve`], and wires the rest;
//! [`run`] only dispatches a command line.
//!
//! # Words
//!
//! One word for one thing, the field's where it has one:
//!
//! - **beacon**: one request from a visitor's browser to the intake; it carries one
//!   **measurement** or an array of up to 50. A measurement is one page view's metrics, one row
//!   ([`measurement::Measurement`]), named by its client-made `id`.
//! - **site**: a shop, by its key. **Site settings** are a site's row in PostgreSQL's `sites`
//!   table (allowed origins, sample rate, enabled): the [`settings`] module, its cache
//!   [`settings::SiteSettings`], its store [`settings::SettingsStore`] behind the seam
//!   [`settings::SiteSource`]. The process's own options (command line and `COLLECTOR_*`) are
//!   the **configuration**, [`config::Config`]; "settings" never means them (the configuration
//!   of the site settings' store is its section [`config::SiteSettingsConfig`]).
//! - **field table**: the one declaration of a measurement's fields ([`measurement::fields`]);
//!   a **layout** is one of its sections, the columns a release added; rows of an earlier
//!   layout are upgraded, never misread.
//! - **purge**: a site's erasure when the shop leaves (GDPR art. 17): `collector sites purge`
//!   disables the site, marks it purged (`purged_at`), deletes its rows on every server and its
//!   kept-aside records ([`cli::purge`]), and every collector drops what its spool still holds
//!   of it ([`settings::PurgedSites`]) and deletes it from its kept-aside and damaged-segment
//!   files, recording that it did ([`purges`]). Names and comments say "purge" and "purged";
//!   "erase" is the law's word, in what the command prints, and [`clickhouse::erase`] deletes
//!   rows (a purged site's, and those past the retention).
//! - **dedup window**: how long intake remembers an id ([`dedup`]); ClickHouse folds what
//!   passes it (the insert's deduplication token, then `ReplacingMergeTree`).
//! - **spool**: the durable log on local disk, in **segments** of **frames**; a frame holds one
//!   **record** (the rows of one request, in one layout, opaque to the spool); **group
//!   commit**: one `fdatasync` for the frames of many requests. The cursor marks what
//!   ClickHouse confirmed.
//! - **batch**: the rows of a range of the spool sent in one INSERT, with one deduplication
//!   token. A batch ClickHouse refuses as bad data is **bisected**; the rows it still refuses
//!   are **kept aside**: written to the spool's dead-letter files (`kept-aside/`, counted in
//!   `collector_spool_kept_aside_rows_total`). "Kept aside" is the project's one name for the
//!   dead-letter queue.
//! - **shard**: a replica set of its own (`COLLECTOR_CLICKHOUSE_SHARDS`; `COLLECTOR_CLICKHOUSE_URLS`
//!   is the one shard `default`); a **site** lives on one shard, chosen once when it is added
//!   ([`settings::place`]), and has its own spool, writer and failover there ([`shards`]).
//! - **replica**: one ClickHouse server of a shard; its state is down,
//!   catching up or healthy ([`writer::replicas`]). **Failover**: the writer moves to the next
//!   healthy replica by itself; **catch-up gating**: a returning replica is written to again
//!   only once it passed the catch-up check.
//! - **probe**: the writer's check of a replica, about once a second ([`writer::probe`]).
//!   `collector probe` is a different thing, the container health command ([`cli::probe`]).
//!   A **trial** is one call let through to see whether a failure is over: the one insert into
//!   a replica that failed inserts, the one call of the settings store's circuit breaker after
//!   its backoff, the spool's attempt to write again while it is unwritable.
//! - **circuit breaker**: *closed* lets calls through, *open* lets none through, *half-open*
//!   lets one trial through ([`settings::breaker::Breaker`]).
//! - **backoff**: the wait after a failure, growing and jittered, always bounded.
//! - **drain**: what SIGTERM starts: `/readyz` fails for the grace, the listener closes,
//!   in-flight requests finish, the writer flushes within its deadline ([`app::run`]).

#![warn(missing_docs)]

pub mod app;
pub mod beacon;
pub mod cli;
pub mod clickhouse;
pub mod client_ip;
pub mod config;
#[cfg(test)]
mod cost;
pub mod dedup;
pub mod endpoints;
pub mod error;
pub mod geo;
pub mod limits;
pub mod logging;
pub mod measurement;
pub mod metrics;
pub mod priority;
pub mod purges;
pub mod report;
pub mod sampling;
pub mod script;
pub mod server;
pub mod settings;
pub mod shards;
pub mod spool;
pub mod state;
pub mod tls;
pub mod useragent;
pub mod writer;

use cli::{Cli, Command};
pub use cli::{RunError, EXIT_CONFIG, EXIT_FAILURE};
use config::Config;

/// Runs a parsed command line; returns the process exit code.
pub async fn run(cli: Cli) -> i32 {
    let config = match Config::from_args(&cli.args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("collector: {e}");
            return EXIT_CONFIG;
        }
    };
    logging::init(config.log_format);
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => app::serve(config).await,
        Command::Migrate => cli::migrate::run(&config).await,
        Command::Sites { command } => cli::sites::run(&config, command).await,
        Command::Probe => cli::probe::run(&config).await,
        Command::Retention => cli::retention::run(&config).await,
        Command::Report(args) => cli::report::run(&config, args).await,
        Command::Spool { command } => cli::spool::run(&config, command),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("collector: {e}");
            e.exit_code()
        }
    }
}

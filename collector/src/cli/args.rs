//! The command tree (contract §1): `serve` (the default), `migrate`, `probe`, `sites …`,
//! `spool …`; the settings every command shares are [`crate::config::RawArgs`].

use clap::{Parser, Subcommand};

use crate::config::RawArgs;

/// The `collector` command line (contract §1).
#[derive(Debug, Parser)]
#[command(
    name = "collector",
    version,
    about = "Web-performance beacon collector"
)]
pub struct Cli {
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Settings shared by every command.
    #[command(flatten)]
    pub args: RawArgs,
}

/// The subcommands of [`Cli`].
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP collector (the default).
    Serve,
    /// Apply `schema/` to PostgreSQL and to every ClickHouse replica; idempotent.
    Migrate,
    /// Health check for containers: exits 0 when `GET /readyz` on `COLLECTOR_LISTEN`
    /// answers 200 within 2 s, else 1. Needs no shell tools.
    Probe,
    /// Manage sites in the settings store.
    Sites {
        /// What to do with sites.
        #[command(subcommand)]
        command: SitesCommand,
    },
    /// Inspect the spool folder (`COLLECTOR_SPOOL_DIR`).
    Spool {
        /// What to do with the spool.
        #[command(subcommand)]
        command: SpoolCommand,
    },
}

/// `collector spool ...`.
#[derive(Debug, Subcommand)]
pub enum SpoolCommand {
    /// Print the measurements the spool holds that ClickHouse has not confirmed, one JSON
    /// line each (`{"segment":N,"offset":N,"row":{...}}`), and a summary on stderr. Reads
    /// without the folder's lock: safe beside a running collector.
    Dump {
        /// Also the confirmed ones still on disk.
        #[arg(long)]
        all: bool,
    },
}

/// `collector sites ...`.
#[derive(Debug, Subcommand)]
pub enum SitesCommand {
    /// Register a site (or update it when the key exists).
    Add {
        /// The site key: 1 to 64 characters from `A-Za-z0-9._-`.
        #[arg(long)]
        key: String,
        /// An allowed `Origin` (scheme://host[:port]); repeat for several. None: any origin.
        #[arg(long = "origin")]
        origins: Vec<String>,
        /// Fraction of page views the tracking script reports, 0 to 1.
        #[arg(long, default_value_t = 1.0)]
        sample_rate: f64,
        /// Register the site disabled.
        #[arg(long)]
        disabled: bool,
    },
    /// List sites.
    List,
    /// Disable a site: its beacons get 403.
    Disable {
        /// The site key.
        key: String,
    },
    /// Enable a site.
    Enable {
        /// The site key.
        key: String,
    },
}

//! The command tree (contract §1): `serve` (the default), `migrate`, `probe`, `retention`,
//! `report`, `sites …`, `spool …`; the settings every command shares are [`crate::config::RawArgs`].

use clap::{Args, Parser, Subcommand};

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
    /// Health check for containers: exits 0 when `GET /readyz` on `COLLECTOR_ADMIN_LISTEN`
    /// answers 200 within 2 s, else 1. Needs no shell tools.
    Probe,
    /// Delete, once, every row older than `COLLECTOR_RETENTION` on every ClickHouse server, and
    /// kept-aside records as old (`serve` does the same at start and daily).
    Retention,
    /// A site's numbers at a glance, from ClickHouse: per group, page views and, for LCP, INP,
    /// CLS, FCP and TTFB, the p75 and the shares rated good, needing improvement and poor
    /// (web.dev's thresholds), weighted by 1 / sample_rate; bots left out.
    Report(super::report::ReportArgs),
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
    /// Print the measurements the spools hold that ClickHouse has not confirmed, one JSON
    /// line each (`{"shard":S,"segment":N,"offset":N,"row":{...}}`), and a summary per spool
    /// on stderr. Reads without the folders' locks: safe beside a running collector.
    Dump {
        /// Also the confirmed ones still on disk.
        #[arg(long)]
        all: bool,
        /// Only this shard's spool (the folder itself for `default`, `shards/NAME/` for the
        /// others); without it, every spool folder found, of a shard configured or not.
        #[arg(long)]
        shard: Option<String>,
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
        /// Fraction of page views the tracking script reports, 0 to 1.
        #[arg(long, default_value_t = 1.0)]
        sample_rate: f64,
        /// Register the site disabled.
        #[arg(long)]
        disabled: bool,
        /// The shard the site lives on, one of the configured shards; without it, the one at
        /// `cityHash64(KEY) mod n` of COLLECTOR_CLICKHOUSE_SHARDS. An existing site keeps its
        /// shard.
        #[arg(long)]
        shard: Option<String>,
        /// The site's lists.
        #[command(flatten)]
        lists: SiteLists,
    },
    /// Change a site: each option given replaces that setting (a list option, that list).
    Update {
        /// The site key.
        key: String,
        /// Fraction of page views the tracking script reports, 0 to 1.
        #[arg(long)]
        sample_rate: Option<f64>,
        /// The site's lists.
        #[command(flatten)]
        lists: SiteLists,
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
    /// Erase a site: disable it, then delete its rows on every replica (and in a table of an
    /// earlier layout) and its kept-aside records on this host; every collector drops its
    /// records still in a spool. Exit 1 naming each replica it could not reach: run it again.
    Purge {
        /// The site key.
        key: String,
    },
}

/// The list settings of a site; a list not given keeps its value (`update`) or default (`add`).
#[derive(Debug, Args)]
pub struct SiteLists {
    /// An allowed `Origin` (scheme://host[:port]); repeat for several. None: any origin.
    #[arg(long = "origin")]
    pub origins: Option<Vec<String>>,
    /// A query parameter of page URLs to keep: a name, or a prefix ending in `*`; repeat for
    /// several [default: utm_*]. `--keep-query ''` keeps none.
    #[arg(long = "keep-query")]
    pub keep_query: Option<Vec<String>>,
    /// A page-group rule `NAME=PATTERN` (`*` one path segment, `**` any rest; first match
    /// wins); repeat for several, in order, at most 200. `--page-group ''` clears them.
    #[arg(long = "page-group")]
    pub page_groups: Option<Vec<String>>,
    /// A shop platform's page-group rules (`shopify`, `shopware`, `magento`,
    /// `woocommerce`): the site's rules become the `--page-group` rules given, then the
    /// preset's (the first match wins, so a shop's own rules come first).
    #[arg(long = "page-groups-preset", value_parser = clap::builder::PossibleValuesParser::new(crate::measurement::page_groups::presets::NAMES))]
    pub page_groups_preset: Option<String>,
    /// A dimension name the page may set (`[a-z0-9_]`, at most 32 bytes); at most 5.
    /// `--dimension ''` clears them.
    #[arg(long = "dimension")]
    pub dimensions: Option<Vec<String>>,
    /// The shop's own reverse proxy, a CIDR or an address, whose client-address header
    /// (`COLLECTOR_CLIENT_IP_HEADER`) is believed for this site's beacons only (contract v5
    /// §1); repeat for several, at most 16. `--trusted-proxy ''` clears them.
    #[arg(long = "trusted-proxy")]
    pub trusted_proxies: Option<Vec<String>>,
}

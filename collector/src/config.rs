//! Command line and settings.
//!
//! Every flag can also be set from the environment as `COLLECTOR_<FLAG>` (clap's `env`), as the
//! contract (§1) requires. Values arrive as strings and are validated together in
//! [`Config::from_args`], so an operator sees every bad value at once, on one line, named by
//! its environment variable, and the process exits with code 2.
//!
//! Defaults are named constants so that docs/contract.md, the doc comments and the code agree.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use ipnet::IpNet;
use url::Url;

/// Default listen address (contract §1).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default settings store (contract §1).
pub const DEFAULT_DATABASE_URL: &str = "postgres://localhost/collector";
/// Default ClickHouse replica list (contract §1).
pub const DEFAULT_CLICKHOUSE_URLS: &str = "http://127.0.0.1:8123";
/// Default ClickHouse database (contract §1).
pub const DEFAULT_CLICKHOUSE_DATABASE: &str = "collector";
/// Default of `COLLECTOR_CLICKHOUSE_TABLE_FORM`.
pub const DEFAULT_CLICKHOUSE_TABLE_FORM: &str = "replicated";
/// Default spool folder (contract §1).
pub const DEFAULT_SPOOL_DIR: &str = "./spool";
/// How long a site's settings are fresh (contract §1).
pub const DEFAULT_SETTINGS_TTL: &str = "60s";
/// How long the settings store is left alone after a failure (contract §1).
pub const DEFAULT_SETTINGS_BACKOFF: &str = "10s";
/// The smallest spool bound accepted: below it the spool holds only a few largest requests
/// (64 KiB each), and readiness (which keeps a quarter of the bound as headroom) could not
/// tell a full spool from a working one.
pub const MIN_SPOOL_MAX_BYTES: u64 = 1 << 20;
/// The spool's bound: 1 GiB holds roughly two million typical measurements, i.e. about half
/// an hour of a busy collector's intake while every ClickHouse replica is down.
pub const DEFAULT_SPOOL_MAX_BYTES: &str = "1073741824";
/// The most `absolute_delay` a returning replica may show (contract §1).
pub const DEFAULT_CATCHUP_MAX_DELAY: &str = "0s";
/// On SIGTERM, how long `/readyz` answers 503 before the listener closes (contract §1).
pub const DEFAULT_DRAIN_GRACE: &str = "5s";
/// The longest duration any setting accepts: longer ones are surely a mistake (and some, such
/// as the dedup window, would overflow timers).
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Log format (contract §1).
pub const DEFAULT_LOG_FORMAT: &str = "text";
/// A batch is flushed once it holds this many measurements.
pub const DEFAULT_BATCH_MAX_ROWS: &str = "50000";
/// A batch is flushed once its spooled form holds this many bytes (16 MiB).
pub const DEFAULT_BATCH_MAX_BYTES: &str = "16777216";
/// A batch is flushed once its oldest measurement has waited this long: about one INSERT per
/// second under load, and under a second from 202 to ClickHouse when idle.
pub const DEFAULT_BATCH_MAX_AGE: &str = "800ms";
/// How long a measurement id is remembered by the in-memory dedup window.
pub const DEFAULT_DEDUP_WINDOW: &str = "10m";
/// How many ids the dedup window holds at most (about 150 bytes each).
pub const DEFAULT_DEDUP_CAPACITY: &str = "100000";
/// Intake requests per second per site and client address (bursts of twice); 0 turns it off.
/// Off by default (contract v2 §1): behind a shop's proxy, a NAT or a carrier's CGNAT many
/// visitors share one address.
pub const DEFAULT_CLIENT_RATE: &str = "0";
/// Measurements per second per site (bursts of twice); 0 turns it off.
pub const DEFAULT_SITE_RATE: &str = "2000";
/// Intake requests worked on at once; more are answered 503 at once.
pub const DEFAULT_MAX_IN_FLIGHT: &str = "512";
/// Open connections at most; more are closed at accept.
pub const DEFAULT_MAX_CONNECTIONS: &str = "20000";
/// A client must send complete request headers within this time of connecting or of its
/// previous response; it is also how long an idle keep-alive connection is kept.
pub const DEFAULT_HEADER_TIMEOUT: &str = "10s";
/// A request body must arrive completely within this time.
pub const DEFAULT_BODY_TIMEOUT: &str = "10s";

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

/// Settings as given on the command line or in the environment, not yet validated.
#[derive(Debug, Args)]
pub struct RawArgs {
    /// Address to listen on.
    #[arg(long, env = "COLLECTOR_LISTEN", default_value = DEFAULT_LISTEN, global = true)]
    pub listen: String,
    /// PostgreSQL settings store: tokio-postgres URL or key=value string; may list several hosts.
    #[arg(long, env = "COLLECTOR_DATABASE_URL", default_value = DEFAULT_DATABASE_URL, global = true, hide_env_values = true)]
    pub database_url: String,
    /// Comma-separated ClickHouse HTTP URLs, in preference order.
    #[arg(long, env = "COLLECTOR_CLICKHOUSE_URLS", default_value = DEFAULT_CLICKHOUSE_URLS, global = true, hide_env_values = true)]
    pub clickhouse_urls: String,
    /// ClickHouse database.
    #[arg(long, env = "COLLECTOR_CLICKHOUSE_DATABASE", default_value = DEFAULT_CLICKHOUSE_DATABASE, global = true)]
    pub clickhouse_database: String,
    /// The form `migrate` creates `measurements` in: `replicated` or `single`.
    #[arg(long, env = "COLLECTOR_CLICKHOUSE_TABLE_FORM", default_value = DEFAULT_CLICKHOUSE_TABLE_FORM, global = true)]
    pub clickhouse_table_form: String,
    /// Local durable spool folder.
    #[arg(long, env = "COLLECTOR_SPOOL_DIR", default_value = DEFAULT_SPOOL_DIR, global = true)]
    pub spool_dir: String,
    /// Comma-separated CIDRs whose X-Forwarded-For / Forwarded headers are believed.
    #[arg(
        long,
        env = "COLLECTOR_TRUSTED_PROXIES",
        default_value = "",
        global = true
    )]
    pub trusted_proxies: String,
    /// How long a site's settings are fresh.
    #[arg(long, env = "COLLECTOR_SETTINGS_TTL", default_value = DEFAULT_SETTINGS_TTL, global = true)]
    pub settings_ttl: String,
    /// After a settings-store failure, how long to leave the store alone.
    #[arg(long, env = "COLLECTOR_SETTINGS_BACKOFF", default_value = DEFAULT_SETTINGS_BACKOFF, global = true)]
    pub settings_backoff: String,
    /// The spool's bound in bytes; when full, intake answers 503.
    #[arg(long, env = "COLLECTOR_SPOOL_MAX_BYTES", default_value = DEFAULT_SPOOL_MAX_BYTES, global = true)]
    pub spool_max_bytes: String,
    /// The most `absolute_delay` a returning replica may show.
    #[arg(long, env = "COLLECTOR_CATCHUP_MAX_DELAY", default_value = DEFAULT_CATCHUP_MAX_DELAY, global = true)]
    pub catchup_max_delay: String,
    /// On SIGTERM, how long /readyz answers 503 before the listener closes.
    #[arg(long, env = "COLLECTOR_DRAIN_GRACE", default_value = DEFAULT_DRAIN_GRACE, global = true)]
    pub drain_grace: String,
    /// `text` or `json`.
    #[arg(long, env = "COLLECTOR_LOG_FORMAT", default_value = DEFAULT_LOG_FORMAT, global = true)]
    pub log_format: String,
    /// Flush a batch at this many measurements.
    #[arg(long, env = "COLLECTOR_BATCH_MAX_ROWS", default_value = DEFAULT_BATCH_MAX_ROWS, global = true)]
    pub batch_max_rows: String,
    /// Flush a batch at this many spooled bytes.
    #[arg(long, env = "COLLECTOR_BATCH_MAX_BYTES", default_value = DEFAULT_BATCH_MAX_BYTES, global = true)]
    pub batch_max_bytes: String,
    /// Flush a batch when its oldest measurement has waited this long.
    #[arg(long, env = "COLLECTOR_BATCH_MAX_AGE", default_value = DEFAULT_BATCH_MAX_AGE, global = true)]
    pub batch_max_age: String,
    /// How long a measurement id is remembered for in-memory dedup.
    #[arg(long, env = "COLLECTOR_DEDUP_WINDOW", default_value = DEFAULT_DEDUP_WINDOW, global = true)]
    pub dedup_window: String,
    /// How many measurement ids the dedup window holds at most.
    #[arg(long, env = "COLLECTOR_DEDUP_CAPACITY", default_value = DEFAULT_DEDUP_CAPACITY, global = true)]
    pub dedup_capacity: String,
    /// Intake requests per second per site and client address, for a collector exposed
    /// directly to browsers; 0: off.
    #[arg(long, env = "COLLECTOR_CLIENT_RATE", default_value = DEFAULT_CLIENT_RATE, global = true)]
    pub client_rate: String,
    /// Measurements per second per site; 0: off.
    #[arg(long, env = "COLLECTOR_SITE_RATE", default_value = DEFAULT_SITE_RATE, global = true)]
    pub site_rate: String,
    /// Intake requests worked on at once.
    #[arg(long, env = "COLLECTOR_MAX_IN_FLIGHT", default_value = DEFAULT_MAX_IN_FLIGHT, global = true)]
    pub max_in_flight: String,
    /// Open connections at most [default: 20000, lowered to what the open-files limit holds].
    #[arg(long, env = "COLLECTOR_MAX_CONNECTIONS", global = true)]
    pub max_connections: Option<String>,
    /// Time to send complete request headers; also the keep-alive idle timeout.
    #[arg(long, env = "COLLECTOR_HEADER_TIMEOUT", default_value = DEFAULT_HEADER_TIMEOUT, global = true)]
    pub header_timeout: String,
    /// Time to send a complete request body.
    #[arg(long, env = "COLLECTOR_BODY_TIMEOUT", default_value = DEFAULT_BODY_TIMEOUT, global = true)]
    pub body_timeout: String,
}

/// The form of the ClickHouse `measurements` table (`COLLECTOR_CLICKHOUSE_TABLE_FORM`).
///
/// A setting, not a guess from the server: a replica whose configuration lost its
/// `<macros>` or its ZooKeeper/Keeper section by mistake would otherwise get a table that
/// quietly never replicates, found out months later. With the default, such a server makes
/// `migrate` fail with a message that names what is missing and this setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableForm {
    /// `ReplicatedReplacingMergeTree` on every replica of one shard (ZooKeeper or Keeper, and
    /// the `{shard}` and `{replica}` macros): `replicated`, the default.
    Replicated,
    /// A `ReplacingMergeTree` on one server without replication, with the same columns and
    /// sort key, and `non_replicated_deduplication_window` set where the server knows it so
    /// that a resent batch's token folds it: `single`.
    Single,
}

impl TableForm {
    /// Parses `replicated` or `single`.
    pub fn parse(value: &str) -> Result<TableForm, String> {
        match value.trim() {
            "replicated" => Ok(TableForm::Replicated),
            "single" => Ok(TableForm::Single),
            _ => Err("must be replicated or single".into()),
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Validated settings. Durations are wall-clock; byte sizes are bytes.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// PostgreSQL connection string, as given (validated by tokio-postgres).
    pub database_url: String,
    /// ClickHouse replicas in preference order (at least one).
    pub clickhouse_urls: Vec<Url>,
    /// ClickHouse database name: `[A-Za-z_][A-Za-z0-9_]*`.
    pub clickhouse_database: String,
    /// The form of the `measurements` table that `migrate` and the prober create.
    pub clickhouse_table_form: TableForm,
    /// Spool folder.
    pub spool_dir: PathBuf,
    /// Peers whose forwarding headers are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// Freshness of cached site settings.
    pub settings_ttl: Duration,
    /// Quiet period after a settings-store failure.
    pub settings_backoff: Duration,
    /// Spool bound in bytes.
    pub spool_max_bytes: u64,
    /// Replication delay a returning replica may show and still count as caught up.
    pub catchup_max_delay: Duration,
    /// Time between `/readyz` turning 503 and the listener closing.
    pub drain_grace: Duration,
    /// Log format.
    pub log_format: LogFormat,
    /// Batch flush threshold in measurements (≥ 1).
    pub batch_max_rows: usize,
    /// Batch flush threshold in spooled bytes (≥ 1).
    pub batch_max_bytes: usize,
    /// Batch flush threshold in age of its oldest measurement.
    pub batch_max_age: Duration,
    /// Dedup window duration.
    pub dedup_window: Duration,
    /// Dedup window capacity in ids.
    pub dedup_capacity: u64,
    /// Intake requests per second per site and client address (0: off).
    pub client_rate: u32,
    /// Measurements per second per site (0: off).
    pub site_rate: u32,
    /// Intake requests worked on at once (≥ 1).
    pub max_in_flight: usize,
    /// Open connections at most (≥ 1).
    pub max_connections: usize,
    /// Whether `max_connections` was set (flag or environment) rather than defaulted: a set
    /// value the open-files limit cannot hold is warned about, the default is quietly lowered.
    pub max_connections_set: bool,
    /// Header read and keep-alive idle timeout.
    pub header_timeout: Duration,
    /// Body read timeout.
    pub body_timeout: Duration,
}

/// Every bad setting found, each as `COLLECTOR_NAME="value": reason`.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {}", .0.join("; "))]
pub struct ConfigError(pub Vec<String>);

impl Config {
    /// Validates every raw value, collecting all errors instead of stopping at the first.
    pub fn from_args(raw: &RawArgs) -> Result<Config, ConfigError> {
        let mut errors = Vec::new();
        let mut check = |name: &str, value: &str, result: Result<(), String>| {
            if let Err(reason) = result {
                errors.push(format!("COLLECTOR_{name}={value:?}: {reason}"));
            }
        };

        // An address, or a host name resolved once, here (never per request).
        let listen = raw
            .listen
            .parse::<SocketAddr>()
            .map_err(|e| e.to_string())
            .or_else(|e| {
                std::net::ToSocketAddrs::to_socket_addrs(raw.listen.as_str())
                    .map_err(|_| e)?
                    .next()
                    .ok_or_else(|| "resolves to no address".to_string())
            });
        check(
            "LISTEN",
            &raw.listen,
            listen.as_ref().map(|_| ()).map_err(Clone::clone),
        );

        let db = raw.database_url.parse::<tokio_postgres::Config>();
        check(
            "DATABASE_URL",
            "<hidden>",
            db.as_ref().map(|_| ()).map_err(|e| e.to_string()),
        );

        let urls = parse_clickhouse_urls(&raw.clickhouse_urls);
        check(
            "CLICKHOUSE_URLS",
            if raw.clickhouse_urls.contains('@') {
                "<hidden>"
            } else {
                &raw.clickhouse_urls
            },
            urls.as_ref().map(|_| ()).map_err(Clone::clone),
        );

        let db_name_ok = is_identifier(&raw.clickhouse_database);
        check(
            "CLICKHOUSE_DATABASE",
            &raw.clickhouse_database,
            if db_name_ok {
                Ok(())
            } else {
                Err("must match [A-Za-z_][A-Za-z0-9_]*".into())
            },
        );

        let table_form = TableForm::parse(&raw.clickhouse_table_form);
        check(
            "CLICKHOUSE_TABLE_FORM",
            &raw.clickhouse_table_form,
            table_form.as_ref().map(|_| ()).map_err(Clone::clone),
        );

        if let (Ok(TableForm::Single), Ok(urls)) = (&table_form, &urls) {
            if urls.len() > 1 {
                check(
                    "CLICKHOUSE_TABLE_FORM",
                    &raw.clickhouse_table_form,
                    Err(format!(
                        "single is one server without replication, but COLLECTOR_CLICKHOUSE_URLS lists {}: \
                         rows written to each would stay apart (list one URL, or use replicated)",
                        urls.len()
                    )),
                );
            }
        }

        let proxies = parse_cidrs(&raw.trusted_proxies);
        check(
            "TRUSTED_PROXIES",
            &raw.trusted_proxies,
            proxies.as_ref().map(|_| ()).map_err(Clone::clone),
        );

        let mut duration = |name: &str, value: &str| -> Duration {
            match humantime::parse_duration(value.trim()) {
                Ok(d) if d <= MAX_DURATION => d,
                Ok(_) => {
                    check(name, value, Err("must be at most 7 days".into()));
                    Duration::from_secs(1)
                }
                Err(e) => {
                    check(
                        name,
                        value,
                        Err(format!("not a duration like 10s or 250ms: {e}")),
                    );
                    // A placeholder that passes the later checks: reported once.
                    Duration::from_secs(1)
                }
            }
        };
        let settings_ttl = duration("SETTINGS_TTL", &raw.settings_ttl);
        let settings_backoff = duration("SETTINGS_BACKOFF", &raw.settings_backoff);
        let catchup_max_delay = duration("CATCHUP_MAX_DELAY", &raw.catchup_max_delay);
        let drain_grace = duration("DRAIN_GRACE", &raw.drain_grace);
        let batch_max_age = duration("BATCH_MAX_AGE", &raw.batch_max_age);
        let dedup_window = duration("DEDUP_WINDOW", &raw.dedup_window);
        let header_timeout = duration("HEADER_TIMEOUT", &raw.header_timeout);
        let body_timeout = duration("BODY_TIMEOUT", &raw.body_timeout);

        let mut positive = |name: &str, value: &str| -> u64 {
            match value.trim().parse::<u64>() {
                Ok(n) if n > 0 => n,
                _ => {
                    check(name, value, Err("must be a whole number above 0".into()));
                    1
                }
            }
        };
        let spool_max_bytes = positive("SPOOL_MAX_BYTES", &raw.spool_max_bytes);
        let batch_max_rows = positive("BATCH_MAX_ROWS", &raw.batch_max_rows);
        let batch_max_bytes = positive("BATCH_MAX_BYTES", &raw.batch_max_bytes);
        let dedup_capacity = positive("DEDUP_CAPACITY", &raw.dedup_capacity);
        let max_in_flight = positive("MAX_IN_FLIGHT", &raw.max_in_flight);
        let max_connections = positive(
            "MAX_CONNECTIONS",
            raw.max_connections
                .as_deref()
                .unwrap_or(DEFAULT_MAX_CONNECTIONS),
        );
        let mut rate = |name: &str, value: &str| -> u32 {
            value.trim().parse::<u32>().unwrap_or_else(|_| {
                check(
                    name,
                    value,
                    Err("must be a whole number (0 turns it off)".into()),
                );
                0
            })
        };
        let client_rate = rate("CLIENT_RATE", &raw.client_rate);
        let site_rate = rate("SITE_RATE", &raw.site_rate);

        let log_format = match raw.log_format.as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                check("LOG_FORMAT", other, Err("must be text or json".into()));
                LogFormat::Text
            }
        };

        // Zero would switch a guard off (a timeout) or turn a cache into a busy loop (10
        // full reloads a second with a TTL of 0): refused, not taken literally.
        for (name, value, d, min) in [
            (
                "BATCH_MAX_AGE",
                &raw.batch_max_age,
                batch_max_age,
                Duration::from_millis(1),
            ),
            (
                "HEADER_TIMEOUT",
                &raw.header_timeout,
                header_timeout,
                Duration::from_millis(100),
            ),
            (
                "BODY_TIMEOUT",
                &raw.body_timeout,
                body_timeout,
                Duration::from_millis(100),
            ),
            (
                "SETTINGS_TTL",
                &raw.settings_ttl,
                settings_ttl,
                Duration::from_secs(1),
            ),
            (
                "SETTINGS_BACKOFF",
                &raw.settings_backoff,
                settings_backoff,
                Duration::from_millis(100),
            ),
        ] {
            if d < min {
                check(name, value, Err(format!("must be at least {min:?}")));
            }
        }
        if spool_max_bytes < MIN_SPOOL_MAX_BYTES {
            check(
                "SPOOL_MAX_BYTES",
                &raw.spool_max_bytes,
                Err(format!("must be at least {MIN_SPOOL_MAX_BYTES} (1 MiB)")),
            );
        }
        if raw.database_url.trim().is_empty() {
            check("DATABASE_URL", "", Err("must be set".into()));
        }
        if raw.spool_dir.trim().is_empty() {
            check("SPOOL_DIR", "", Err("must be set".into()));
        }

        if !errors.is_empty() {
            return Err(ConfigError(errors));
        }
        Ok(Config {
            listen: listen.expect("checked"),
            database_url: raw.database_url.clone(),
            clickhouse_urls: urls.expect("checked"),
            clickhouse_database: raw.clickhouse_database.clone(),
            clickhouse_table_form: table_form.expect("checked"),
            spool_dir: PathBuf::from(&raw.spool_dir),
            trusted_proxies: proxies.expect("checked"),
            settings_ttl,
            settings_backoff,
            spool_max_bytes,
            catchup_max_delay,
            drain_grace,
            log_format,
            batch_max_rows: batch_max_rows as usize,
            batch_max_bytes: batch_max_bytes as usize,
            batch_max_age,
            dedup_window,
            dedup_capacity,
            client_rate,
            site_rate,
            max_in_flight: max_in_flight as usize,
            max_connections: max_connections as usize,
            max_connections_set: raw.max_connections.is_some(),
            header_timeout,
            body_timeout,
        })
    }
}

/// A SQL identifier safe to splice into DDL: `[A-Za-z_][A-Za-z0-9_]*`, at most 64 bytes.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 64
}

fn parse_clickhouse_urls(s: &str) -> Result<Vec<Url>, String> {
    let mut urls = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let url = Url::parse(part).map_err(|e| format!("{part}: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(format!("{part}: must be an http:// or https:// URL"));
        }
        // They would be ignored (no ClickHouse authentication is sent) and then shown in
        // logs and metric labels: refused, without echoing them.
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!(
                "{}: credentials in the URL are not supported (they would not be sent, and would show in logs and metrics)",
                url.host_str().unwrap_or("?")
            ));
        }
        if urls.contains(&url) {
            return Err(format!("{part}: listed twice"));
        }
        urls.push(url);
    }
    if urls.is_empty() {
        return Err("at least one URL is required".into());
    }
    Ok(urls)
}

fn parse_cidrs(s: &str) -> Result<Vec<IpNet>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<IpNet>()
                .or_else(|_| p.parse::<std::net::IpAddr>().map(IpNet::from))
                .map_err(|_| format!("{p}: not a CIDR like 10.0.0.0/8 or an address"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(args: &[&str]) -> RawArgs {
        let mut v = vec!["collector"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap().args
    }

    #[test]
    fn defaults_are_valid() {
        let s = Config::from_args(&raw(&[])).unwrap();
        assert_eq!(s.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(s.settings_backoff, Duration::from_secs(10));
        assert_eq!(s.clickhouse_urls.len(), 1);
        assert!(s.trusted_proxies.is_empty());
        assert_eq!(
            s.client_rate, 0,
            "per-client rate off by default (contract v2 §1)"
        );
        assert_eq!(s.site_rate, 2000, "site rates stay on");
    }

    #[test]
    fn the_single_form_takes_one_server() {
        let two = Config::from_args(&raw(&[
            "--clickhouse-table-form",
            "single",
            "--clickhouse-urls",
            "http://a:8123,http://b:8123",
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            two.contains("COLLECTOR_CLICKHOUSE_TABLE_FORM=\"single\""),
            "{two}"
        );
        assert!(two.contains("lists 2"), "{two}");
        let one = Config::from_args(&raw(&[
            "--clickhouse-table-form",
            "single",
            "--clickhouse-urls",
            "http://a:8123",
        ]))
        .unwrap();
        assert_eq!(one.clickhouse_table_form, TableForm::Single);
        assert!(Config::from_args(&raw(&["--clickhouse-table-form", "Single"])).is_err());
    }

    #[test]
    fn every_bad_value_is_reported_at_once() {
        let err = Config::from_args(&raw(&[
            "--listen",
            "nowhere",
            "--settings-ttl",
            "soon",
            "--clickhouse-urls",
            "ftp://x",
            "--trusted-proxies",
            "10.0.0.0/8,banana",
        ]))
        .unwrap_err();
        let line = err.to_string();
        assert_eq!(err.0.len(), 4, "{line}");
        for name in [
            "LISTEN",
            "SETTINGS_TTL",
            "CLICKHOUSE_URLS",
            "TRUSTED_PROXIES",
        ] {
            assert!(line.contains(&format!("COLLECTOR_{name}=")), "{line}");
        }
        assert!(!line.contains('\n'));
    }

    #[test]
    fn zero_timeouts_and_empty_places_are_refused() {
        let err = Config::from_args(&raw(&[
            "--header-timeout",
            "0s",
            "--body-timeout",
            "0ms",
            "--settings-ttl",
            "0s",
            "--database-url",
            "",
            "--spool-dir",
            " ",
            "--spool-max-bytes",
            "1",
        ]))
        .unwrap_err();
        let names: Vec<&str> = err.0.iter().map(|e| e.split('=').next().unwrap()).collect();
        assert_eq!(
            names,
            [
                "COLLECTOR_HEADER_TIMEOUT",
                "COLLECTOR_BODY_TIMEOUT",
                "COLLECTOR_SETTINGS_TTL",
                "COLLECTOR_SPOOL_MAX_BYTES",
                "COLLECTOR_DATABASE_URL",
                "COLLECTOR_SPOOL_DIR"
            ],
            "{err:?}"
        );
    }

    #[test]
    fn credentials_in_replica_urls_are_refused_and_not_echoed() {
        let err = Config::from_args(&raw(&[
            "--clickhouse-urls",
            "http://default:secret@ch1:8123",
        ]))
        .unwrap_err();
        assert_eq!(err.0.len(), 1);
        assert!(err.0[0].contains("credentials"), "{err:?}");
        assert!(!err.0[0].contains("secret"), "{err:?}");
    }

    #[test]
    fn replica_list_keeps_preference_order() {
        let s = Config::from_args(&raw(&["--clickhouse-urls", "http://b:8123, http://a:8123"]))
            .unwrap();
        let hosts: Vec<_> = s
            .clickhouse_urls
            .iter()
            .map(|u| u.host_str().unwrap())
            .collect();
        assert_eq!(hosts, ["b", "a"]);
    }

    #[test]
    fn durations_and_names_are_bounded_and_resolved() {
        let err = Config::from_args(&raw(&[
            "--dedup-window",
            "2000years",
            "--drain-grace",
            "8d",
        ]))
        .unwrap_err();
        assert_eq!(err.0.len(), 2, "{err}");
        let err = Config::from_args(&raw(&["--batch-max-age", "abc"])).unwrap_err();
        assert_eq!(err.0.len(), 1, "one error per bad value: {err}");
        let s = Config::from_args(&raw(&["--listen", "localhost:8080"])).unwrap();
        assert!(s.listen.ip().is_loopback());
    }

    #[test]
    fn identifiers() {
        assert!(is_identifier("collector"));
        assert!(is_identifier("test_1"));
        assert!(!is_identifier("1x"));
        assert!(!is_identifier("a;drop"));
        assert!(!is_identifier(""));
    }
}

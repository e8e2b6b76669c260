//! The settings as the command line and the environment give them: one flag and one
//! `COLLECTOR_<FLAG>` variable each (clap's `env`, contract §1), with its default, as strings
//! that [`super::Config::from_args`] validates together.
//!
//! Defaults are named constants so that docs/contract.md, the doc comments and the code agree.

use clap::Args;

/// Default listen address (contract §1).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default address of the operations listener (contract v4 §1): loopback, Prometheus's
/// conventional exporter range.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9464";
/// Default settings store (contract §1).
pub const DEFAULT_DATABASE_URL: &str = "postgres://localhost/collector";
/// Default ClickHouse replica list (contract §1).
pub const DEFAULT_CLICKHOUSE_URLS: &str = "http://127.0.0.1:8123";
/// The shard `COLLECTOR_CLICKHOUSE_URLS` is (contract v5 §3), and the shard of a site added
/// before shards existed.
pub const DEFAULT_SHARD: &str = "default";
/// Default of `COLLECTOR_CLICKHOUSE_CLUSTER` (contract v5 §1).
pub const DEFAULT_CLICKHOUSE_CLUSTER: &str = "collector";
/// The ClickHouse user connected as (contract v4 §1).
pub const DEFAULT_CLICKHOUSE_USER: &str = "default";
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
/// The spool's bound: 1 GiB holds roughly two million typical measurements, i.e. about half
/// an hour of a busy collector's intake while every ClickHouse replica is down.
pub const DEFAULT_SPOOL_MAX_BYTES: &str = "1073741824";
/// The most `absolute_delay` a returning replica may show (contract §1).
pub const DEFAULT_CATCHUP_MAX_DELAY: &str = "0s";
/// On SIGTERM, how long `/readyz` answers 503 before the listener closes (contract §1).
pub const DEFAULT_DRAIN_GRACE: &str = "5s";
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
/// The header a trusted proxy names the client in (contract v4 §1): what HAProxy, Caddy and
/// nginx write.
pub const DEFAULT_CLIENT_IP_HEADER: &str = "X-Forwarded-For";
/// How long a row is kept, from its page view (contract v4 §1): 13 months, so that a shop
/// compares this year's peak with last year's.
pub const DEFAULT_RETENTION: &str = "395d";
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

/// Settings as given on the command line or in the environment, not yet validated.
#[derive(Debug, Args)]
pub struct RawArgs {
    /// Address to listen on.
    #[arg(long, env = "COLLECTOR_LISTEN", default_value = DEFAULT_LISTEN, global = true)]
    pub listen: String,
    /// Address of the operations listener: `/metrics`, `/healthz`, `/readyz` with its reason.
    #[arg(long, env = "COLLECTOR_ADMIN_LISTEN", default_value = DEFAULT_ADMIN_LISTEN, global = true)]
    pub admin_listen: String,
    /// PostgreSQL settings store: tokio-postgres URL or key=value string; may list several hosts.
    #[arg(long, env = "COLLECTOR_DATABASE_URL", default_value = DEFAULT_DATABASE_URL, global = true, hide_env_values = true)]
    pub database_url: String,
    /// Comma-separated ClickHouse HTTP URLs, in preference order: one shard named `default`.
    /// Unset: `http://127.0.0.1:8123`, unless
    /// `COLLECTOR_CLICKHOUSE_SHARDS` is set (setting both is an error).
    #[arg(
        long,
        env = "COLLECTOR_CLICKHOUSE_URLS",
        global = true,
        hide_env_values = true
    )]
    pub clickhouse_urls: Option<String>,
    /// The shards (contract v5 §3): `NAME=URL,URL,...` separated by `;`, each a replica set in
    /// preference order. Not together with `COLLECTOR_CLICKHOUSE_URLS`.
    #[arg(
        long,
        env = "COLLECTOR_CLICKHOUSE_SHARDS",
        global = true,
        hide_env_values = true
    )]
    pub clickhouse_shards: Option<String>,
    /// The cluster (in the servers' `remote_servers`) that `measurements_all` reads over.
    #[arg(long, env = "COLLECTOR_CLICKHOUSE_CLUSTER", default_value = DEFAULT_CLICKHOUSE_CLUSTER, global = true)]
    pub clickhouse_cluster: String,
    /// The ClickHouse user the collector (and `migrate`) connects as.
    #[arg(long, env = "COLLECTOR_CLICKHOUSE_USER", default_value = DEFAULT_CLICKHOUSE_USER, global = true)]
    pub clickhouse_user: String,
    /// A file holding that user's password (one line; a trailing newline is not part of it).
    /// Empty: no password.
    #[arg(
        long,
        env = "COLLECTOR_CLICKHOUSE_PASSWORD_FILE",
        default_value = "",
        global = true
    )]
    pub clickhouse_password_file: String,
    /// PEM certificates an `https://` ClickHouse URL is verified against. Empty: the system's
    /// roots.
    #[arg(
        long,
        env = "COLLECTOR_CLICKHOUSE_CA_FILE",
        default_value = "",
        global = true
    )]
    pub clickhouse_ca_file: String,
    /// A file holding the PostgreSQL password, instead of one in the database URL. Empty:
    /// none.
    #[arg(
        long,
        env = "COLLECTOR_DATABASE_PASSWORD_FILE",
        default_value = "",
        global = true
    )]
    pub database_password_file: String,
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
    /// The one header that carries the client address from a trusted proxy: `X-Forwarded-For`
    /// or `Forwarded`; the other is never read.
    #[arg(long, env = "COLLECTOR_CLIENT_IP_HEADER", default_value = DEFAULT_CLIENT_IP_HEADER, global = true)]
    pub client_ip_header: String,
    /// A MaxMind DB file mapping addresses to countries (GeoLite2-Country, DB-IP, or the
    /// ip-location-db packages' layout); read again when replaced. Empty: no country.
    #[arg(long, env = "COLLECTOR_GEO_DB", default_value = "", global = true)]
    pub geo_db: String,
    /// How long a row is kept, counted from its page view; older rows are deleted by `serve`
    /// (at start and daily) and by `collector retention`.
    #[arg(long, env = "COLLECTOR_RETENTION", default_value = DEFAULT_RETENTION, global = true)]
    pub retention: String,
    /// Time to send a complete request body.
    #[arg(long, env = "COLLECTOR_BODY_TIMEOUT", default_value = DEFAULT_BODY_TIMEOUT, global = true)]
    pub body_timeout: String,
}

//! The process's configuration: every `COLLECTOR_*` setting (contract §1) validated together
//! ([`Config::from_args`]), so that an operator sees every bad value at once, on one line, named
//! by its environment variable, and the process exits with code 2.
//!
//! [`Config`] is in sections, one per station that reads it ([`ServerConfig`],
//! [`IntakeConfig`], [`SiteSettingsConfig`], [`ClickHouseConfig`], [`SpoolConfig`]), each read
//! by a function of its own; the flags and variables with their defaults are [`args`], the
//! command tree is `cli`'s.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use url::Url;

pub mod args;
mod values;

pub use values::{cidrs, ValueError};

pub use args::*;
use values::Problems;
pub use values::{is_identifier, ClientIpHeader, Secret, MAX_DURATION};

/// The smallest spool bound accepted: below it the spool holds only a few largest requests
/// (64 KiB each), and readiness (which keeps a quarter of the bound as headroom) could not
/// tell a full spool from a working one.
pub const MIN_SPOOL_MAX_BYTES: u64 = 1 << 20;

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
    pub fn parse(value: &str) -> Result<TableForm, ValueError> {
        match value.trim() {
            "replicated" => Ok(TableForm::Replicated),
            "single" => Ok(TableForm::Single),
            _ => Err(ValueError::TableForm),
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

/// Validated configuration, by section. Durations are wall-clock; byte sizes are bytes.
#[derive(Debug, Clone)]
pub struct Config {
    /// The listener and its connections.
    pub server: ServerConfig,
    /// What intake takes in: limits, rates, the dedup window, client addresses.
    pub intake: IntakeConfig,
    /// The site settings store and its cache.
    pub settings: SiteSettingsConfig,
    /// The ClickHouse replicas and the writer's batches.
    pub clickhouse: ClickHouseConfig,
    /// The spool.
    pub spool: SpoolConfig,
    /// Log format.
    pub log_format: LogFormat,
}

/// The listener and its connections.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on (the public listener).
    pub listen: SocketAddr,
    /// Address of the operations listener (`/metrics`, `/healthz`, `/readyz` with its reason).
    pub admin_listen: SocketAddr,
    /// Open connections at most (≥ 1).
    pub max_connections: usize,
    /// Whether `max_connections` was set (flag or environment) rather than defaulted: a set
    /// value the open-files limit cannot hold is warned about, the default is quietly lowered.
    pub max_connections_set: bool,
    /// Header read and keep-alive idle timeout (≥ 100 ms).
    pub header_timeout: Duration,
    /// Body read timeout (≥ 100 ms).
    pub body_timeout: Duration,
    /// Time between `/readyz` turning 503 and the listener closing.
    pub drain_grace: Duration,
}

/// What intake takes in.
#[derive(Debug, Clone)]
pub struct IntakeConfig {
    /// Peers whose forwarding header is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// The one header those peers name the client in.
    pub client_ip_header: ClientIpHeader,
    /// The country database, if any.
    pub geo_db: Option<PathBuf>,
    /// Intake requests per second per site and client address (0: off).
    pub client_rate: u32,
    /// Measurements per second per site (0: off).
    pub site_rate: u32,
    /// Intake requests worked on at once (≥ 1).
    pub max_in_flight: usize,
    /// Dedup window duration.
    pub dedup_window: Duration,
    /// Dedup window capacity in ids.
    pub dedup_capacity: u64,
}

/// The site settings store (PostgreSQL) and the cache intake reads through. Its `Debug` hides
/// the connection string, which may carry a password.
#[derive(Clone)]
pub struct SiteSettingsConfig {
    /// PostgreSQL connection string, as given (validated by tokio-postgres).
    pub database_url: String,
    /// Freshness of cached site settings (≥ 1 s).
    pub ttl: Duration,
    /// Quiet period after a settings-store failure (≥ 100 ms).
    pub backoff: Duration,
    /// The password, if `COLLECTOR_DATABASE_PASSWORD_FILE` names one.
    pub password: Option<Secret>,
}

impl std::fmt::Debug for SiteSettingsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SiteSettingsConfig")
            .field("database_url", &"<hidden>")
            .field("ttl", &self.ttl)
            .field("backoff", &self.backoff)
            .field("password", &self.password)
            .finish()
    }
}

/// One shard (contract v5 §3): a replica set with its own failover, spool and writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardConfig {
    /// Its name ([`values::is_shard_name`]): `default` for `COLLECTOR_CLICKHOUSE_URLS`.
    pub name: String,
    /// Its replicas in preference order (at least one), `http://` or `https://`.
    pub urls: Vec<Url>,
}

/// The ClickHouse shards and the writer's batches.
#[derive(Debug, Clone)]
pub struct ClickHouseConfig {
    /// The shards in the order configured (at least one; names and replicas unique): from
    /// `COLLECTOR_CLICKHOUSE_SHARDS`, or `COLLECTOR_CLICKHOUSE_URLS` as one shard `default`.
    /// A site without `--shard` is placed at `cityHash64(key) mod len` of this order.
    pub shards: Vec<ShardConfig>,
    /// The cluster in the servers' `remote_servers` that `measurements_all` reads over.
    pub cluster: String,
    /// The user connected as.
    pub user: String,
    /// Its password, if any (`COLLECTOR_CLICKHOUSE_PASSWORD_FILE`).
    pub password: Option<Secret>,
    /// How `https://` servers are verified: against `COLLECTOR_CLICKHOUSE_CA_FILE`, or the
    /// system's roots (always the chain and the host name).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Database name: `[A-Za-z_][A-Za-z0-9_]*`.
    pub database: String,
    /// The form of the `measurements` table that `migrate` and the prober create.
    pub table_form: TableForm,
    /// Replication delay a returning replica may show and still count as caught up.
    pub catchup_max_delay: Duration,
    /// Batch flush threshold in measurements (≥ 1).
    pub batch_max_rows: usize,
    /// Batch flush threshold in spooled bytes (≥ 1).
    pub batch_max_bytes: usize,
    /// Batch flush threshold in age of its oldest measurement (≥ 1 ms).
    pub batch_max_age: Duration,
    /// How long a row is kept, from its `page_view_at` (1 day to 100 years).
    pub retention: Duration,
}

/// The spool.
#[derive(Debug, Clone)]
pub struct SpoolConfig {
    /// Spool folder.
    pub dir: PathBuf,
    /// Spool bound in bytes (≥ [`MIN_SPOOL_MAX_BYTES`]).
    pub max_bytes: u64,
}

/// Every bad setting found, each as `COLLECTOR_NAME="value" (--name): reason`.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {}", .0.join("; "))]
pub struct ConfigError(pub Vec<String>);

impl Config {
    /// Validates every raw value, collecting all errors instead of stopping at the first.
    pub fn from_args(raw: &RawArgs) -> Result<Config, ConfigError> {
        let mut p = Problems::default();
        let config = Config {
            server: ServerConfig::read(raw, &mut p),
            intake: IntakeConfig::read(raw, &mut p),
            settings: SiteSettingsConfig::read(raw, &mut p),
            clickhouse: ClickHouseConfig::read(raw, &mut p),
            spool: SpoolConfig::read(raw, &mut p),
            log_format: match raw.log_format.as_str() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                other => {
                    p.report("LOG_FORMAT", other, "must be text or json");
                    LogFormat::Text
                }
            },
        };
        // Each shard's spool holds an equal share of the bound (contract v5 §3, `shards`).
        let shards = config.clickhouse.shards.len().max(1) as u64;
        if config.spool.max_bytes >= MIN_SPOOL_MAX_BYTES
            && config.spool.max_bytes / shards < MIN_SPOOL_MAX_BYTES
        {
            p.report(
                "SPOOL_MAX_BYTES",
                &raw.spool_max_bytes,
                format!(
                    "must be at least {MIN_SPOOL_MAX_BYTES} (1 MiB) per shard: each of the {shards} shards' spools holds an equal share"
                ),
            );
        }
        if p.0.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError(p.0))
        }
    }
}

impl ServerConfig {
    fn read(raw: &RawArgs, p: &mut Problems) -> ServerConfig {
        let listen = values::socket_addr(&raw.listen);
        let admin = values::socket_addr(&raw.admin_listen);
        if let (Ok(l), Ok(a)) = (&listen, &admin) {
            if l == a {
                p.report(
                    "ADMIN_LISTEN",
                    &raw.admin_listen,
                    "must differ from COLLECTOR_LISTEN",
                );
            }
        }
        let max_connections = raw
            .max_connections
            .as_deref()
            .unwrap_or(DEFAULT_MAX_CONNECTIONS);
        let min = Duration::from_millis(100);
        ServerConfig {
            listen: p
                .check("LISTEN", &raw.listen, listen)
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
            admin_listen: p
                .check("ADMIN_LISTEN", &raw.admin_listen, admin)
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
            max_connections: p.positive("MAX_CONNECTIONS", max_connections) as usize,
            max_connections_set: raw.max_connections.is_some(),
            header_timeout: p.duration("HEADER_TIMEOUT", &raw.header_timeout, min),
            body_timeout: p.duration("BODY_TIMEOUT", &raw.body_timeout, min),
            drain_grace: p.duration("DRAIN_GRACE", &raw.drain_grace, Duration::ZERO),
        }
    }
}

impl IntakeConfig {
    fn read(raw: &RawArgs, p: &mut Problems) -> IntakeConfig {
        let proxies = values::cidrs(&raw.trusted_proxies);
        let header = &raw.client_ip_header;
        IntakeConfig {
            trusted_proxies: p
                .check("TRUSTED_PROXIES", &raw.trusted_proxies, proxies)
                .unwrap_or_default(),
            client_ip_header: p
                .check("CLIENT_IP_HEADER", header, ClientIpHeader::parse(header))
                .unwrap_or_default(),
            geo_db: Some(raw.geo_db.trim())
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
            client_rate: p.rate("CLIENT_RATE", &raw.client_rate),
            site_rate: p.rate("SITE_RATE", &raw.site_rate),
            max_in_flight: p.positive("MAX_IN_FLIGHT", &raw.max_in_flight) as usize,
            dedup_window: p.duration("DEDUP_WINDOW", &raw.dedup_window, Duration::ZERO),
            dedup_capacity: p.positive("DEDUP_CAPACITY", &raw.dedup_capacity),
        }
    }
}

/// Checks `COLLECTOR_DATABASE_URL` as libpq would take it (contract v4 §3): it parses, its
/// `sslrootcert` reads, its password is no placeholder ([`values::not_placeholder`]), and
/// `sslmode=verify-full` has a host name to verify (a `hostaddr` without `host` has none;
/// libpq refuses it, and so does the collector rather than connect unverified). Errors never
/// hold the URL.
fn check_database_url(url: &str) -> Result<(), ValueError> {
    let (rest, ssl) = crate::tls::libpq::split(url)?;
    let config = rest
        .parse::<tokio_postgres::Config>()
        .map_err(ValueError::DatabaseUrl)?;
    let unnamed = config.get_hosts().len() < config.get_hostaddrs().len();
    if ssl.mode == crate::tls::libpq::SslMode::VerifyFull && unnamed {
        return Err(ValueError::NoHostToVerify);
    }
    if let Some(password) = config.get_password() {
        values::not_placeholder(&String::from_utf8_lossy(password))?;
    }
    ssl.client_config()?;
    Ok(())
}

impl SiteSettingsConfig {
    fn read(raw: &RawArgs, p: &mut Problems) -> SiteSettingsConfig {
        p.required("DATABASE_URL", &raw.database_url);
        // Never echoed: the string may hold a password.
        p.check(
            "DATABASE_URL",
            "<hidden>",
            check_database_url(&raw.database_url),
        );
        let password = Some(raw.database_password_file.trim())
            .filter(|f| !f.is_empty())
            .and_then(|f| p.check("DATABASE_PASSWORD_FILE", f, values::secret_file(f)));
        SiteSettingsConfig {
            database_url: raw.database_url.clone(),
            password,
            ttl: p.duration("SETTINGS_TTL", &raw.settings_ttl, Duration::from_secs(1)),
            backoff: p.duration(
                "SETTINGS_BACKOFF",
                &raw.settings_backoff,
                Duration::from_millis(100),
            ),
        }
    }
}

impl ClickHouseConfig {
    /// Every replica URL of every shard, shard by shard in order.
    pub fn urls(&self) -> impl Iterator<Item = &Url> {
        self.shards.iter().flat_map(|s| s.urls.iter())
    }

    /// Whether the shards were named (`COLLECTOR_CLICKHOUSE_SHARDS`), rather than the one
    /// shard `default` of `COLLECTOR_CLICKHOUSE_URLS`, whose servers need no cluster.
    pub fn sharded(&self) -> bool {
        !matches!(&self.shards[..], [s] if s.name == DEFAULT_SHARD)
    }

    /// The shard named `name`.
    pub fn shard(&self, name: &str) -> Option<&ShardConfig> {
        self.shards.iter().find(|s| s.name == name)
    }

    fn read(raw: &RawArgs, p: &mut Problems) -> ClickHouseConfig {
        let shards = read_shards(raw, p);
        if !is_identifier(&raw.clickhouse_cluster) {
            p.report(
                "CLICKHOUSE_CLUSTER",
                &raw.clickhouse_cluster,
                "must match [A-Za-z_][A-Za-z0-9_]*",
            );
        }
        if !is_identifier(&raw.clickhouse_database) {
            let name = &raw.clickhouse_database;
            p.report(
                "CLICKHOUSE_DATABASE",
                name,
                "must match [A-Za-z_][A-Za-z0-9_]*",
            );
        }
        let form = &raw.clickhouse_table_form;
        let table_form = p
            .check("CLICKHOUSE_TABLE_FORM", form, TableForm::parse(form))
            .unwrap_or(TableForm::Replicated);
        if let Some(shard) = shards.iter().find(|s| s.urls.len() > 1) {
            if table_form == TableForm::Single {
                p.report(
                    "CLICKHOUSE_TABLE_FORM",
                    form,
                    format!(
                        "single is one server without replication, but shard {} lists {} replicas: \
                         rows written to each would stay apart (list one URL per shard, or use replicated)",
                        shard.name,
                        shard.urls.len()
                    ),
                );
            }
        }
        let password = Some(raw.clickhouse_password_file.trim())
            .filter(|f| !f.is_empty())
            .and_then(|f| p.check("CLICKHOUSE_PASSWORD_FILE", f, values::secret_file(f)));
        let ca = Some(raw.clickhouse_ca_file.trim()).filter(|f| !f.is_empty());
        let https = shards
            .iter()
            .flat_map(|s| &s.urls)
            .any(|u| u.scheme() == "https");
        let tls = (ca.is_some() || https)
            .then(|| {
                let made = crate::tls::client_config(
                    ca.map(std::path::Path::new),
                    crate::tls::Verify::Full,
                );
                p.check(
                    "CLICKHOUSE_CA_FILE",
                    ca.unwrap_or("(the system's roots)"),
                    made,
                )
            })
            .flatten();
        ClickHouseConfig {
            shards,
            cluster: raw.clickhouse_cluster.clone(),
            user: raw.clickhouse_user.clone(),
            password,
            tls,
            database: raw.clickhouse_database.clone(),
            table_form,
            catchup_max_delay: p.duration(
                "CATCHUP_MAX_DELAY",
                &raw.catchup_max_delay,
                Duration::ZERO,
            ),
            batch_max_rows: p.positive("BATCH_MAX_ROWS", &raw.batch_max_rows) as usize,
            batch_max_bytes: p.positive("BATCH_MAX_BYTES", &raw.batch_max_bytes) as usize,
            batch_max_age: p.duration(
                "BATCH_MAX_AGE",
                &raw.batch_max_age,
                Duration::from_millis(1),
            ),
            retention: p.long_duration("RETENTION", &raw.retention, Duration::from_secs(86_400)),
        }
    }
}

/// The shards of `COLLECTOR_CLICKHOUSE_SHARDS`, or `COLLECTOR_CLICKHOUSE_URLS` (or its default)
/// as the one shard [`DEFAULT_SHARD`]; both set is an error (contract v5 §3).
fn read_shards(raw: &RawArgs, p: &mut Problems) -> Vec<ShardConfig> {
    let hide = |v: &str| {
        if values::may_hold_password(v) {
            "<hidden>".to_owned()
        } else {
            v.to_owned()
        }
    };
    match (&raw.clickhouse_shards, &raw.clickhouse_urls) {
        (Some(shards), Some(_)) => {
            p.report(
                "CLICKHOUSE_SHARDS",
                &hide(shards),
                "not together with COLLECTOR_CLICKHOUSE_URLS (which is one shard named default): set one of them",
            );
            Vec::new()
        }
        (Some(shards), None) => p
            .check(
                "CLICKHOUSE_SHARDS",
                &hide(shards),
                values::clickhouse_shards(shards),
            )
            .unwrap_or_default()
            .into_iter()
            .map(|(name, urls)| ShardConfig { name, urls })
            .collect(),
        (None, urls) => {
            let urls = urls.as_deref().unwrap_or(DEFAULT_CLICKHOUSE_URLS);
            p.check(
                "CLICKHOUSE_URLS",
                &hide(urls),
                values::clickhouse_urls(urls),
            )
            .map(|urls| {
                vec![ShardConfig {
                    name: DEFAULT_SHARD.to_owned(),
                    urls,
                }]
            })
            .unwrap_or_default()
        }
    }
}

impl SpoolConfig {
    fn read(raw: &RawArgs, p: &mut Problems) -> SpoolConfig {
        p.required("SPOOL_DIR", &raw.spool_dir);
        let max_bytes = p.positive("SPOOL_MAX_BYTES", &raw.spool_max_bytes);
        // A value that is not a number was reported above: once is enough.
        let a_number = raw.spool_max_bytes.trim().parse::<u64>().is_ok();
        if a_number && max_bytes < MIN_SPOOL_MAX_BYTES {
            p.report(
                "SPOOL_MAX_BYTES",
                &raw.spool_max_bytes,
                format!("must be at least {MIN_SPOOL_MAX_BYTES} (1 MiB)"),
            );
        }
        SpoolConfig {
            dir: PathBuf::from(&raw.spool_dir),
            max_bytes,
        }
    }
}

#[cfg(test)]
mod tests;

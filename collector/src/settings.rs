//! Site settings: the PostgreSQL store and the in-memory cache intake reads through.
//!
//! The store knows nothing of ClickHouse or HTTP. The cache ([`SiteSettings`]) is a moka
//! cache keyed by site key: one query per key however many requests ask at once (moka's
//! single-flight `try_get_with`), known sites kept for `COLLECTOR_SETTINGS_TTL`, unknown keys
//! kept as unknown for [`UNKNOWN_TTL`] so that a flood of random keys cannot reach the
//! database once per request, and at most [`CACHE_CAPACITY`] keys.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use crate::metrics::Metrics;

/// How long an unknown site key is remembered as unknown (capped by the settings TTL).
pub const UNKNOWN_TTL: Duration = Duration::from_secs(10);
/// Most site keys cached, known and unknown together.
pub const CACHE_CAPACITY: u64 = 100_000;
/// Connections the settings store pool opens at most.
pub const POOL_SIZE: usize = 4;
/// Bound on opening one connection to PostgreSQL.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on one settings query, pool wait included.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(3);

/// One site's settings, as stored in the `sites` table.
#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    /// Site key (primary key).
    pub key: String,
    /// Allowed `Origin` values, serialised as `scheme://host[:port]`; empty allows any.
    pub allowed_origins: Vec<String>,
    /// Fraction of page views the tracking script reports, 0 to 1.
    pub sample_rate: f64,
    /// Disabled sites are answered 403.
    pub enabled: bool,
}

impl Site {
    /// Whether a request with this `Origin` header may send beacons for the site: a request
    /// without `Origin` is judged by the site key alone (contract §2).
    pub fn allows_origin(&self, origin: Option<&str>) -> bool {
        match origin {
            None => true,
            Some(_) if self.allowed_origins.is_empty() => true,
            Some(o) => self
                .allowed_origins
                .iter()
                .any(|a| a.eq_ignore_ascii_case(o)),
        }
    }
}

/// Normalises an origin as a browser sends it in `Origin`: `scheme://host[:port]`, lowercase,
/// default port omitted. `None` for anything that is not an http(s) origin.
pub fn normalise_origin(s: &str) -> Option<String> {
    let url = url::Url::parse(s.trim()).ok()?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return None;
    }
    Some(url.origin().ascii_serialization())
}

/// A settings-store failure: connection, timeout or query error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("settings store: {0}")]
pub struct StoreError(pub String);

/// The PostgreSQL settings store (the `sites` table), through a small deadpool pool.
#[derive(Clone)]
pub struct SettingsStore {
    pool: Pool,
}

const SITE_COLUMNS: &str = "key, allowed_origins, sample_rate, enabled";

fn site_from_row(row: &tokio_postgres::Row) -> Site {
    Site {
        key: row.get(0),
        allowed_origins: row.get(1),
        sample_rate: row.get(2),
        enabled: row.get(3),
    }
}

impl SettingsStore {
    /// A pool over `database_url` (may list several hosts; tokio-postgres tries them in order
    /// and resolves names per connection). Connects lazily.
    pub fn new(database_url: &str) -> Result<Self, StoreError> {
        let mut config: tokio_postgres::Config = database_url
            .parse()
            .map_err(|e| StoreError(format!("{e}")))?;
        config.connect_timeout(CONNECT_TIMEOUT);
        if config.get_application_name().is_none() {
            config.application_name("collector");
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(QUERY_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| StoreError(e.to_string()))?;
        Ok(SettingsStore { pool })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(|e| StoreError(e.to_string()))
    }

    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(QUERY_TIMEOUT, f).await {
            Ok(r) => r.map_err(|e| StoreError(e.to_string())),
            Err(_) => Err(StoreError("query timed out".into())),
        }
    }

    /// One site by key; `Ok(None)` when it does not exist.
    pub async fn fetch(&self, key: &str) -> Result<Option<Site>, StoreError> {
        let client = self.client().await?;
        let sql = format!("SELECT {SITE_COLUMNS} FROM sites WHERE key = $1");
        let row = self.bounded(client.query_opt(&sql, &[&key])).await?;
        Ok(row.as_ref().map(site_from_row))
    }

    /// Every site, ordered by key.
    pub async fn fetch_all(&self) -> Result<Vec<Site>, StoreError> {
        let client = self.client().await?;
        let sql = format!("SELECT {SITE_COLUMNS} FROM sites ORDER BY key");
        let rows = self.bounded(client.query(&sql, &[])).await?;
        Ok(rows.iter().map(site_from_row).collect())
    }

    /// Inserts or updates a site.
    pub async fn upsert(&self, site: &Site) -> Result<(), StoreError> {
        let client = self.client().await?;
        self.bounded(client.execute(
            "INSERT INTO sites (key, allowed_origins, sample_rate, enabled) VALUES ($1, $2, $3, $4)
             ON CONFLICT (key) DO UPDATE SET allowed_origins = EXCLUDED.allowed_origins,
               sample_rate = EXCLUDED.sample_rate, enabled = EXCLUDED.enabled, updated_at = now()",
            &[
                &site.key,
                &site.allowed_origins,
                &site.sample_rate,
                &site.enabled,
            ],
        ))
        .await?;
        Ok(())
    }

    /// Enables or disables a site; `Ok(false)` when there is no such site.
    pub async fn set_enabled(&self, key: &str, enabled: bool) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let n = self
            .bounded(client.execute(
                "UPDATE sites SET enabled = $2, updated_at = now() WHERE key = $1",
                &[&key, &enabled],
            ))
            .await?;
        Ok(n == 1)
    }

    /// Runs DDL statements (the PostgreSQL half of `collector migrate`).
    pub async fn apply(&self, sql: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        self.bounded(client.batch_execute(sql)).await
    }
}

/// The answer to a settings lookup.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// The site exists (enabled or not).
    Known(Arc<Site>),
    /// No such site.
    Unknown,
    /// The site is not cached and the store cannot be asked now.
    Unavailable,
}

type Entry = Option<Arc<Site>>;

struct EntryExpiry {
    known: Duration,
    unknown: Duration,
}

impl moka::Expiry<Arc<str>, Entry> for EntryExpiry {
    fn expire_after_create(
        &self,
        _key: &Arc<str>,
        value: &Entry,
        _now: Instant,
    ) -> Option<Duration> {
        Some(if value.is_some() {
            self.known
        } else {
            self.unknown
        })
    }
}

/// Site settings as intake sees them: cached, single-flight, bounded.
#[derive(Clone)]
pub struct SiteSettings {
    cache: moka::future::Cache<Arc<str>, Entry>,
    store: SettingsStore,
    metrics: Arc<Metrics>,
}

impl SiteSettings {
    /// A cache over `store`; known sites stay fresh for `ttl`.
    pub fn new(store: SettingsStore, ttl: Duration, metrics: Arc<Metrics>) -> Self {
        let cache = moka::future::Cache::builder()
            .max_capacity(CACHE_CAPACITY)
            .expire_after(EntryExpiry {
                known: ttl,
                unknown: ttl.min(UNKNOWN_TTL),
            })
            .build();
        SiteSettings {
            cache,
            store,
            metrics,
        }
    }

    /// Loads every site in one query, so the first requests need no database.
    pub async fn warm(&self) -> Result<usize, StoreError> {
        let sites = self.store.fetch_all().await;
        self.record(&sites);
        let sites = sites?;
        for site in &sites {
            self.cache
                .insert(Arc::from(site.key.as_str()), Some(Arc::new(site.clone())))
                .await;
        }
        Ok(sites.len())
    }

    fn record<T>(&self, r: &Result<T, StoreError>) {
        self.metrics.settings_store_queries.inc();
        self.metrics.settings_store_up.set(r.is_ok() as i64);
    }

    /// The settings of `key`: from the cache, or one query shared by every concurrent caller.
    pub async fn lookup(&self, key: &str) -> Lookup {
        if let Some(entry) = self.cache.get(key).await {
            return entry.map_or(Lookup::Unknown, Lookup::Known);
        }
        let store = &self.store;
        let fetched = self
            .cache
            .try_get_with(Arc::from(key), async {
                let r = store.fetch(key).await;
                self.record(&r);
                r.map(|site| site.map(Arc::new))
            })
            .await;
        match fetched {
            Ok(entry) => entry.map_or(Lookup::Unknown, Lookup::Known),
            Err(e) => {
                tracing::warn!(error = %e, "settings store unavailable");
                Lookup::Unavailable
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        let site = Site {
            key: "s".into(),
            allowed_origins: vec!["https://shop.example".into()],
            sample_rate: 1.0,
            enabled: true,
        };
        assert!(site.allows_origin(None));
        assert!(site.allows_origin(Some("https://shop.example")));
        assert!(!site.allows_origin(Some("https://evil.example")));
        assert!(!site.allows_origin(Some("null")));
        let open = Site {
            allowed_origins: vec![],
            ..site
        };
        assert!(open.allows_origin(Some("https://anything.example")));
    }

    #[test]
    fn origin_normalisation() {
        assert_eq!(
            normalise_origin("HTTPS://Shop.Example:443/path").unwrap(),
            "https://shop.example"
        );
        assert_eq!(
            normalise_origin("http://localhost:8080").unwrap(),
            "http://localhost:8080"
        );
        assert_eq!(normalise_origin("ftp://x"), None);
        assert_eq!(normalise_origin("shop.example"), None);
    }
}

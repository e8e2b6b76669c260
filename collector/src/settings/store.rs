//! The PostgreSQL settings store (the `sites` table): a small pool ([`POOL_SIZE`],
//! deadpool-postgres's, with every wait bounded) behind a circuit breaker ([`Breaker`]), over
//! our connector ([`super::postgres`]: one bound per host, one attempt at a time). A connection
//! that fails or times out during a call is taken out of the pool, never reused.
//!
//! **Transaction-mode poolers** (PgBouncer `pool_mode = transaction`): consecutive statements
//! of one session may run on different server connections, so a named prepared statement
//! cannot outlive its round trip. Every query therefore uses the unnamed statement of the
//! extended protocol with its parameter types given (`query_typed`: Parse, Bind, Execute and
//! Sync in one round trip) or the simple protocol (`batch_execute`), never `prepare`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{ManagerConfig, Object, Pool, PoolError, RecyclingMethod};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Config;

use super::breaker::Breaker;
use super::postgres::{describe, HostsConnector, HOST_TIMEOUT};
use super::Site;
use crate::metrics::Metrics;

/// Connections the pool opens at most.
pub const POOL_SIZE: usize = 4;
/// Bound on one call once a connection is in hand (the query and its answer).
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(3);

/// A settings-store failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store failed recently; it is left alone until the backoff ends.
    #[error("settings store in backoff after a failure")]
    Backoff,
    /// Connection, timeout or query error.
    #[error("settings store: {0}")]
    Failed(String),
    /// The first-fetch budget of never-seen keys is spent (see [`crate::settings`]); the store
    /// was not asked.
    #[error("first-fetch budget of never-seen site keys spent")]
    Limited,
}

/// The store: a bounded pool behind a [`Breaker`]. Cheap to clone.
#[derive(Clone)]
pub struct SettingsStore {
    pool: Pool,
    /// Hosts in the URL: each has [`HOST_TIMEOUT`].
    hosts: usize,
    breaker: Arc<Breaker>,
    metrics: Arc<Metrics>,
}

/// A `sites` row as one JSON object (`to_jsonb(sites)`), so that a column added by a later
/// schema file reads as its default while `migrate` has not run yet (a rolling upgrade), and a
/// column a later release adds is ignored by this one.
const SITE_JSON: &str = "to_jsonb(sites)::text";

/// A `sites` row as JSON: the columns, `purged_at` as whether it is set.
#[derive(serde::Deserialize)]
struct SiteRow {
    #[serde(flatten)]
    site: Site,
    #[serde(default)]
    purged_at: Option<serde_json::Value>,
}

/// The site of one `sites` row read as [`SITE_JSON`]. Errors name the row's problem (a row
/// the table's own constraints let through always reads).
fn site_from_json(text: &str) -> Result<Site, StoreError> {
    let row: SiteRow = serde_json::from_str(text)
        .map_err(|e| StoreError::Failed(format!("a sites row that does not read: {e}")))?;
    let mut site = Site {
        purged: row.purged_at.is_some_and(|v| !v.is_null()),
        ..row.site
    };
    // See MIN_CONFIGURED_RATE: NaN and 0 collect nothing, a denormal rate the least.
    if site.sample_rate.is_nan() || site.sample_rate <= 0.0 {
        site.enabled = false;
        site.sample_rate = 1.0;
    } else if site.sample_rate < super::MIN_CONFIGURED_RATE {
        site.sample_rate = super::MIN_CONFIGURED_RATE;
    }
    Ok(site)
}

impl SettingsStore {
    /// A pool over `database_url`; connects lazily. `backoff`: see [`Breaker`].
    pub fn new(
        database_url: &str,
        password: Option<&crate::config::Secret>,
        backoff: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StoreError> {
        let (url, ssl) = crate::tls::libpq::split(database_url)
            .map_err(|e| StoreError::Failed(e.to_string()))?;
        let mut config: Config = url
            .parse()
            .map_err(|e| StoreError::Failed(crate::logging::chain(&e)))?;
        if let Some(password) = password {
            config.password(password.expose());
        }
        config.ssl_mode(ssl.negotiation());
        let tls = ssl
            .client_config()
            .map_err(|e| StoreError::Failed(e.to_string()))?
            .map(|c| tokio_postgres_rustls::MakeRustlsConnect::new((*c).clone()));
        config.connect_timeout(HOST_TIMEOUT);
        if config.get_application_name().is_none() {
            config.application_name("collector");
        }
        let breaker = Arc::new(Breaker::new(backoff));
        let connector = HostsConnector::new(&config, tls, breaker.clone());
        let hosts = connector.host_count();
        let connect_budget = HOST_TIMEOUT * hosts as u32;
        // Fast recycling: a pooled connection is checked for being closed, no query (a
        // transaction-mode pooler gains nothing from DISCARD ALL, and it costs a round trip).
        let manager = deadpool_postgres::Manager::from_connect(
            config,
            connector,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(QUERY_TIMEOUT))
            .create_timeout(Some(connect_budget + Duration::from_millis(100)))
            .recycle_timeout(Some(HOST_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Failed(e.to_string()))?;
        Ok(SettingsStore {
            pool,
            hosts,
            breaker,
            metrics,
        })
    }

    /// Whether the store is believed up (the breaker is closed).
    pub fn is_up(&self) -> bool {
        self.breaker.is_closed()
    }

    /// Runs `f` with a pooled client if the breaker admits it: the connection within the hosts'
    /// budget, then `f` within [`QUERY_TIMEOUT`]. A connection whose call timed out or failed
    /// other than by a server error is closed, never returned to the pool.
    pub(super) async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        F: for<'c> FnOnce(&'c tokio_postgres::Client) -> Query<'c, T>,
    {
        let admission = self.breaker.admit().ok_or(StoreError::Backoff)?;
        self.metrics.settings.store_queries.inc();
        let result = match self.pool.get().await {
            Err(PoolError::Backend(e)) => Err(StoreError::Failed(describe(&e))),
            Err(PoolError::Timeout(_)) => Err(StoreError::Failed(format!(
                "no connection within {:?} (every host tried)",
                HOST_TIMEOUT * self.hosts as u32
            ))),
            Err(e) => Err(StoreError::Failed(e.to_string())),
            Ok(client) => match tokio::time::timeout(QUERY_TIMEOUT, f(&client)).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => {
                    // A server error (with a SQLSTATE) leaves the connection usable.
                    if e.as_db_error().is_none() {
                        drop(Object::take(client));
                    }
                    Err(StoreError::Failed(describe(&e)))
                }
                Err(_) => {
                    drop(Object::take(client));
                    Err(StoreError::Failed(format!(
                        "no answer within {QUERY_TIMEOUT:?}"
                    )))
                }
            },
        };
        self.breaker.report(admission, result.is_ok());
        self.metrics
            .settings
            .store_up
            .set(self.breaker.is_closed() as i64);
        if let Err(e) = &result {
            crate::logging::warn_limited(
                "settings_store",
                || tracing::warn!(error = %e, "settings store failed; leaving it alone for the backoff"),
            );
        }
        result
    }

    /// One site by key; `Ok(None)` when it does not exist.
    pub async fn fetch(&self, key: &str) -> Result<Option<Site>, StoreError> {
        let sql = format!("SELECT {SITE_JSON} FROM sites WHERE key = $1");
        // Owned: the call's future may only borrow its connection.
        let key = key.to_owned();
        let row: Option<String> = self
            .call(|c| {
                Box::pin(async move {
                    let rows = c.query_typed(&sql, &[(&key, Type::TEXT)]).await?;
                    rows.first().map(|r| r.try_get(0)).transpose()
                })
            })
            .await?;
        row.as_deref().map(site_from_json).transpose()
    }

    /// Every site, ordered by key.
    pub async fn fetch_all(&self) -> Result<Vec<Site>, StoreError> {
        let sql = format!("SELECT {SITE_JSON} FROM sites ORDER BY key");
        let rows: Vec<String> = self
            .call(|c| {
                Box::pin(async move {
                    let rows = c.query_typed(&sql, &[]).await?;
                    rows.iter().map(|r| r.try_get(0)).collect()
                })
            })
            .await?;
        rows.iter().map(|r| site_from_json(r)).collect()
    }

    /// Inserts or updates a site; an existing site keeps the shard it was placed on.
    pub async fn upsert(&self, site: &Site) -> Result<(), StoreError> {
        let site = site.clone();
        self.call(|c| {
            Box::pin(async move {
                let params: [(&(dyn ToSql + Sync), Type); 9] = [
                    (&site.key, Type::TEXT),
                    (&site.allowed_origins, Type::TEXT_ARRAY),
                    (&site.sample_rate, Type::FLOAT8),
                    (&site.enabled, Type::BOOL),
                    (&site.keep_query, Type::TEXT_ARRAY),
                    (&site.page_groups, Type::TEXT_ARRAY),
                    (&site.dimensions, Type::TEXT_ARRAY),
                    (&site.shard, Type::TEXT),
                    (&site.trusted_proxies, Type::TEXT_ARRAY),
                ];
                // A site saved again is no longer purged: `purged_at` is cleared. Its shard is
                // set when the row is made and never changed here (contract v5 §3).
                c.query_typed(
                    "INSERT INTO sites (key, allowed_origins, sample_rate, enabled, keep_query, page_groups, dimensions, shard, trusted_proxies)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                     ON CONFLICT (key) DO UPDATE SET allowed_origins = EXCLUDED.allowed_origins,
                       sample_rate = EXCLUDED.sample_rate, enabled = EXCLUDED.enabled,
                       keep_query = EXCLUDED.keep_query, page_groups = EXCLUDED.page_groups,
                       dimensions = EXCLUDED.dimensions, trusted_proxies = EXCLUDED.trusted_proxies,
                       purged_at = NULL, updated_at = now()",
                    &params,
                )
                .await
                .map(|_| ())
            })
        })
        .await
    }

    /// Marks a site purged: disabled, and `purged_at` set if it was not (every collector then
    /// drops its records still in a spool). How long ago it was first marked; `Ok(None)` when
    /// there is no such site.
    pub async fn mark_purged(&self, key: &str) -> Result<Option<Duration>, StoreError> {
        let key = key.to_owned();
        self.call(|c| {
            Box::pin(async move {
                let rows = c
                    .query_typed(
                        "UPDATE sites SET enabled = false, purged_at = COALESCE(purged_at, now()), updated_at = now() \
                         WHERE key = $1 RETURNING extract(epoch FROM now() - purged_at)::float8",
                        &[(&key, Type::TEXT)],
                    )
                    .await?;
                rows.first()
                    .map(|r| r.try_get::<_, f64>(0))
                    .transpose()
                    .map(|age| age.map(|a| Duration::from_secs_f64(a.max(0.0))))
            })
        })
        .await
    }

    /// Enables or disables a site; `Ok(false)` when there is no such site.
    pub async fn set_enabled(&self, key: &str, enabled: bool) -> Result<bool, StoreError> {
        let key = key.to_owned();
        self.call(|c| {
            Box::pin(async move {
                let rows = c
                    .query_typed(
                        "UPDATE sites SET enabled = $2, updated_at = now() WHERE key = $1 RETURNING key",
                        &[(&key, Type::TEXT), (&enabled, Type::BOOL)],
                    )
                    .await?;
                Ok(rows.len() == 1)
            })
        })
        .await
    }

    /// Runs DDL statements (the PostgreSQL half of `collector migrate`), with the simple
    /// protocol.
    pub async fn apply(&self, sql: &str) -> Result<(), StoreError> {
        let sql = sql.to_owned();
        self.call(|c| Box::pin(async move { c.batch_execute(&sql).await }))
            .await
    }
}

/// The future of one store call, borrowing its connection.
pub(super) type Query<'c, T> =
    std::pin::Pin<Box<dyn Future<Output = Result<T, tokio_postgres::Error>> + Send + 'c>>;

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    // The runtime's clock, so that tests can pause and advance it.
    use tokio::time::Instant;

    use super::*;

    #[test]
    fn a_stored_rate_below_the_least_is_read_disabled_or_raised() {
        let row = |rate: &str| {
            site_from_json(&format!(
                r#"{{"key":"s","allowed_origins":[],"sample_rate":{rate},"enabled":true}}"#
            ))
            .unwrap()
        };
        let zero = row("0");
        assert!(!zero.enabled, "0 collects nothing");
        let tiny = row("1e-300");
        assert!(tiny.enabled);
        assert_eq!(tiny.sample_rate, crate::settings::MIN_CONFIGURED_RATE);
        assert_eq!(row("0.25").sample_rate, 0.25);
    }

    /// A listener that accepts TCP connections and closes them at once (a server that refuses
    /// every session); returns its port and the count of connections it accepted.
    async fn refusing_server() -> (u16, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                drop(socket);
            }
        });
        (port, accepted)
    }

    /// A host that accepts TCP and never answers costs [`HOST_TIMEOUT`], then the next host
    /// is tried; the error names each host and what it did.
    #[tokio::test]
    async fn a_hanging_host_costs_its_timeout_and_the_next_is_tried() {
        let hanging = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hang_port = hanging.local_addr().unwrap().port();
        let held = Arc::new(Mutex::new(Vec::new()));
        let keep = held.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = hanging.accept().await {
                keep.lock().unwrap().push(socket);
            }
        });
        let (refuse_port, accepted) = refusing_server().await;
        let store = SettingsStore::new(
            &format!("postgres://u@127.0.0.1:{hang_port},127.0.0.1:{refuse_port}/db"),
            None,
            Duration::from_secs(60),
            Arc::new(Metrics::new()),
        )
        .unwrap();
        let start = Instant::now();
        let Err(StoreError::Failed(e)) = store.fetch("a-site").await else {
            panic!("no store answers");
        };
        let took = start.elapsed();
        assert!(
            took >= HOST_TIMEOUT && took < HOST_TIMEOUT * 2,
            "{took:?}: {e}"
        );
        assert!(
            e.contains(&format!("127.0.0.1:{hang_port}: no answer within 1.5s")),
            "{e}"
        );
        assert!(e.contains(&format!("127.0.0.1:{refuse_port}: ")), "{e}");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "the next host was tried"
        );
        assert_eq!(held.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn calls_admitted_together_make_one_connection_attempt() {
        let (port, accepted) = refusing_server().await;
        let store = SettingsStore::new(
            &format!("postgres://u@127.0.0.1:{port}/db"),
            None,
            Duration::from_secs(60),
            Arc::new(Metrics::new()),
        )
        .unwrap();
        let calls: Vec<_> = (0..POOL_SIZE * 2)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move { store.fetch(&format!("site-{i}")).await })
            })
            .collect();
        for call in calls {
            assert!(call.await.unwrap().is_err());
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert!(!store.is_up());
        assert_eq!(store.fetch("later").await, Err(StoreError::Backoff));
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "none during the backoff"
        );
    }
}

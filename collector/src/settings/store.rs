//! The PostgreSQL settings store (the `sites` table), behind a backoff gate.
//!
//! Every call goes through [`Gate`]: after a failed query or connection, the store is not
//! contacted again for `COLLECTOR_SETTINGS_BACKOFF` by any path of this process, however many
//! requests arrive; then exactly one call is let through as a probe, and only its success
//! opens the gate again. The pool is small and every wait is bounded ([`CONNECT_TIMEOUT`],
//! [`QUERY_TIMEOUT`]). Host names are resolved by tokio-postgres per new connection, never
//! per request; a URL listing several hosts (a primary and its standby) is tried in order.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use super::Site;
use crate::metrics::Metrics;

/// Connections the pool opens at most.
pub const POOL_SIZE: usize = 4;
/// Bound on opening one connection (per host tried).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on one call: pool wait, connect and query together.
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GateState {
    /// Calls go through.
    Open,
    /// Nothing goes through until `until`.
    Closed { until: Instant },
    /// One probe is in flight; nothing else goes through.
    Probing,
}

/// The backoff gate in front of the store.
#[derive(Debug)]
pub struct Gate {
    state: Mutex<GateState>,
    backoff: Duration,
}

/// Permission for one call; `probe` when it is the single call after a backoff.
#[derive(Debug, Clone, Copy)]
pub struct Admission {
    probe: bool,
}

impl Gate {
    /// An open gate that closes for `backoff` after each failure.
    pub fn new(backoff: Duration) -> Self {
        Gate {
            state: Mutex::new(GateState::Open),
            backoff,
        }
    }

    /// Lets a call through, or not.
    pub fn admit(&self) -> Option<Admission> {
        let mut state = self.state.lock().unwrap();
        match *state {
            GateState::Open => Some(Admission { probe: false }),
            GateState::Closed { until } if Instant::now() >= until => {
                *state = GateState::Probing;
                Some(Admission { probe: true })
            }
            GateState::Closed { .. } | GateState::Probing => None,
        }
    }

    /// Records the outcome of an admitted call.
    pub fn report(&self, admission: Admission, ok: bool) {
        let mut state = self.state.lock().unwrap();
        *state = match (ok, *state) {
            (true, GateState::Probing) if admission.probe => GateState::Open,
            (true, s) => s,
            (false, GateState::Closed { until }) => GateState::Closed { until },
            (false, _) => GateState::Closed {
                until: Instant::now() + self.backoff,
            },
        };
    }

    /// Whether calls currently go through.
    pub fn is_open(&self) -> bool {
        matches!(*self.state.lock().unwrap(), GateState::Open)
    }
}

/// The store: a bounded pool behind a [`Gate`]. Cheap to clone.
#[derive(Clone)]
pub struct SettingsStore {
    pool: Pool,
    gate: Arc<Gate>,
    metrics: Arc<Metrics>,
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
    /// A pool over `database_url`; connects lazily. `backoff`: see [`Gate`].
    pub fn new(
        database_url: &str,
        backoff: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StoreError> {
        let mut config: tokio_postgres::Config = database_url
            .parse()
            .map_err(|e| StoreError::Failed(format!("{e}")))?;
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
            .create_timeout(Some(QUERY_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Failed(e.to_string()))?;
        Ok(SettingsStore {
            pool,
            gate: Arc::new(Gate::new(backoff)),
            metrics,
        })
    }

    /// Whether the store is believed up (the gate is open).
    pub fn is_up(&self) -> bool {
        self.gate.is_open()
    }

    /// Runs `f` with a pooled client if the gate admits it, within [`QUERY_TIMEOUT`].
    async fn call<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(deadpool_postgres::Object) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let admission = self.gate.admit().ok_or(StoreError::Backoff)?;
        self.metrics.settings_store_queries.inc();
        let work = async {
            let client = self
                .pool
                .get()
                .await
                .map_err(|e| StoreError::Failed(e.to_string()))?;
            f(client)
                .await
                .map_err(|e| StoreError::Failed(e.to_string()))
        };
        let result = match tokio::time::timeout(QUERY_TIMEOUT, work).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Failed("timed out".into())),
        };
        self.gate.report(admission, result.is_ok());
        self.metrics
            .settings_store_up
            .set(self.gate.is_open() as i64);
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
        let sql = format!("SELECT {SITE_COLUMNS} FROM sites WHERE key = $1");
        self.call(|c| async move {
            c.query_opt(&sql, &[&key])
                .await
                .map(|r| r.as_ref().map(site_from_row))
        })
        .await
    }

    /// Every site, ordered by key.
    pub async fn fetch_all(&self) -> Result<Vec<Site>, StoreError> {
        let sql = format!("SELECT {SITE_COLUMNS} FROM sites ORDER BY key");
        self.call(|c| async move {
            c.query(&sql, &[])
                .await
                .map(|rows| rows.iter().map(site_from_row).collect())
        })
        .await
    }

    /// Inserts or updates a site.
    pub async fn upsert(&self, site: &Site) -> Result<(), StoreError> {
        self.call(|c| async move {
            c.execute(
                "INSERT INTO sites (key, allowed_origins, sample_rate, enabled) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (key) DO UPDATE SET allowed_origins = EXCLUDED.allowed_origins,
                   sample_rate = EXCLUDED.sample_rate, enabled = EXCLUDED.enabled, updated_at = now()",
                &[&site.key, &site.allowed_origins, &site.sample_rate, &site.enabled],
            )
            .await
            .map(|_| ())
        })
        .await
    }

    /// Enables or disables a site; `Ok(false)` when there is no such site.
    pub async fn set_enabled(&self, key: &str, enabled: bool) -> Result<bool, StoreError> {
        self.call(|c| async move {
            c.execute(
                "UPDATE sites SET enabled = $2, updated_at = now() WHERE key = $1",
                &[&key, &enabled],
            )
            .await
            .map(|n| n == 1)
        })
        .await
    }

    /// Runs DDL statements (the PostgreSQL half of `collector migrate`).
    pub async fn apply(&self, sql: &str) -> Result<(), StoreError> {
        self.call(|c| async move { c.batch_execute(sql).await })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_probe_after_the_backoff() {
        let gate = Gate::new(Duration::from_millis(50));
        let a = gate.admit().unwrap();
        let b = gate.admit().unwrap();
        gate.report(a, false);
        gate.report(b, false);
        assert!(gate.admit().is_none(), "closed for the backoff");
        std::thread::sleep(Duration::from_millis(60));
        let probe = gate.admit().expect("one probe after the backoff");
        assert!(gate.admit().is_none(), "only one probe at a time");
        gate.report(probe, false);
        assert!(gate.admit().is_none(), "a failed probe closes it again");
        std::thread::sleep(Duration::from_millis(60));
        let probe = gate.admit().unwrap();
        gate.report(probe, true);
        assert!(gate.is_open());
        assert!(gate.admit().is_some() && gate.admit().is_some());
    }

    #[test]
    fn a_late_failure_does_not_extend_the_backoff() {
        let gate = Gate::new(Duration::from_secs(60));
        let (a, b) = (gate.admit().unwrap(), gate.admit().unwrap());
        gate.report(a, false);
        let first = *gate.state.lock().unwrap();
        gate.report(b, false);
        assert_eq!(*gate.state.lock().unwrap(), first);
    }
}

//! What collectors tell `sites purge` through the store (contract v5 §5, schema file
//! `005_site_purges.sql`): that each is serving (`collectors`), and that it has deleted a
//! purged site's records from its kept-aside and damaged-segment files (`site_purges`).
//!
//! A store that refuses these writes (without the tables: `migrate` not run yet in a rolling
//! upgrade; a standby; a role without the right) answers "not recorded", never an error: they
//! must not open the circuit breaker that intake's lookups pass through. Only a store that
//! does not answer is an error, as for any call.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::store::{Query, SettingsStore, StoreError};

/// One collector as `sites purge` sees it for a site.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectorPurge {
    /// `HOST:SPOOL_DIR`.
    pub collector: String,
    /// How long ago it last said it serves.
    pub seen_ago: Duration,
    /// How often it says so.
    pub every: Duration,
    /// The rows of the site it deleted from its files, once it has done the site's current
    /// purge; `None` while it has not.
    pub done_rows: Option<i64>,
}

impl CollectorPurge {
    /// Whether it is serving: seen within two of its intervals and 5 s.
    pub fn serving(&self) -> bool {
        self.seen_ago <= self.every * 2 + Duration::from_secs(5)
    }
}

/// Whether the server refused a write with an error of its own (the tables missing, a
/// read-only store, a right missing): nothing recorded, the connection fine.
fn not_recordable(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some()
}

/// Whether `e` says the tables are missing: nothing recorded yet.
fn no_tables(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNDEFINED_TABLE)
}

impl SettingsStore {
    /// Records that `collector` serves and says so every `every`; whether it was recorded.
    pub async fn collector_seen(
        &self,
        collector: &str,
        every: Duration,
    ) -> Result<bool, StoreError> {
        let (collector, every) = (collector.to_owned(), every.as_secs_f64());
        self.call(move |c| -> Query<'_, bool> {
            Box::pin(async move {
                let done = c
                    .query_typed(
                        "INSERT INTO collectors (collector, seen_at, every_s) VALUES ($1, now(), $2) \
                         ON CONFLICT (collector) DO UPDATE SET seen_at = now(), every_s = EXCLUDED.every_s",
                        &[(&collector, Type::TEXT), (&every, Type::FLOAT8)],
                    )
                    .await;
                match done {
                    Ok(_) => Ok(true),
                    Err(e) if not_recordable(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            })
        })
        .await
    }

    /// Records that `collector` has deleted the records of `site` from its files (`rows` of
    /// them), for the site's current purge; a purge it had recorded already keeps its first
    /// record. Whether it was recorded (`false` also when the site is not purged).
    pub async fn purge_done(
        &self,
        site: &str,
        collector: &str,
        rows: i64,
    ) -> Result<bool, StoreError> {
        let (site, collector) = (site.to_owned(), collector.to_owned());
        self.call(move |c| -> Query<'_, bool> {
            Box::pin(async move {
                let done = c
                    .query_typed(
                        "INSERT INTO site_purges (site, collector, purged_at, done_at, rows) \
                         SELECT key, $2, purged_at, now(), $3 FROM sites WHERE key = $1 AND purged_at IS NOT NULL \
                         ON CONFLICT (site, collector) DO UPDATE SET purged_at = EXCLUDED.purged_at, \
                           done_at = EXCLUDED.done_at, rows = EXCLUDED.rows \
                         WHERE site_purges.purged_at IS DISTINCT FROM EXCLUDED.purged_at",
                        &[(&site, Type::TEXT), (&collector, Type::TEXT), (&rows, Type::INT8)],
                    )
                    .await;
                match done {
                    Ok(_) => Ok(true),
                    Err(e) if not_recordable(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            })
        })
        .await
    }

    /// Every collector that ever said it serves, with whether it has done the current purge
    /// of `site`, by name. Empty when the tables are missing.
    pub async fn purges_of(&self, site: &str) -> Result<Vec<CollectorPurge>, StoreError> {
        let site = site.to_owned();
        self.call(move |c| -> Query<'_, Vec<CollectorPurge>> {
            Box::pin(async move {
                let rows = c
                    .query_typed(
                        "SELECT c.collector, extract(epoch FROM now() - c.seen_at)::float8, c.every_s, p.rows \
                         FROM collectors c \
                         LEFT JOIN sites s ON s.key = $1 \
                         LEFT JOIN site_purges p ON p.site = $1 AND p.collector = c.collector \
                           AND p.purged_at = s.purged_at \
                         ORDER BY c.collector",
                        &[(&site, Type::TEXT)],
                    )
                    .await;
                let rows = match rows {
                    Ok(rows) => rows,
                    Err(e) if no_tables(&e) => return Ok(Vec::new()),
                    Err(e) => return Err(e),
                };
                rows.iter()
                    .map(|r| {
                        Ok(CollectorPurge {
                            collector: r.try_get(0)?,
                            seen_ago: Duration::from_secs_f64(r.try_get::<_, f64>(1)?.max(0.0)),
                            every: Duration::from_secs_f64(r.try_get::<_, f64>(2)?.max(0.0)),
                            done_rows: r.try_get(3)?,
                        })
                    })
                    .collect()
            })
        })
        .await
    }
}

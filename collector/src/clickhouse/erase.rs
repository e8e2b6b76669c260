//! Rows that must go (contract v4 §3): a site's rows on request ([`delete_site`]), and rows
//! older than the retention ([`expire`]). Used by `collector sites purge`, `collector
//! retention` and `serve`'s daily retention run, on one server each call.
//!
//! - **Deleting a site** is a mutation (`ALTER TABLE … DELETE WHERE site = …`, ClickHouse 1.1
//!   and later, so 18.16 and 26.x alike), waited for until the server's own parts hold no row
//!   of the site. On a replicated table the mutation reaches the other replicas through
//!   ZooKeeper; it is sent to every reachable replica anyway, so that a replica that was down
//!   gets it when the command runs again. Why not wait for `system.mutations` to show none
//!   undone: a replica of 18.16 that was down and then fetched a part already mutated past
//!   them keeps reporting the mutations undone (`parts_to_do` 1, for ever; seen in the purge
//!   test with a replica down for the first run: 600 s, then exit 1), though none of its parts
//!   holds a row of the site.
//! - **Retention** drops whole monthly partitions (`toYYYYMM(page_view_at)`) whose every row
//!   is older than the retention: ClickHouse 18.16 has no table TTL. Where the server has one
//!   (19.6 and later) the table also gets `TTL page_view_at + INTERVAL N DAY`, so rows of a
//!   partly expired month go at their merge. A row therefore outlives the retention by at most
//!   a month on 18.16 and by at most the merge delay on current releases.

use std::time::Duration;

use serde::Deserialize;

/// Why rows could not be deleted or expired on a server.
#[derive(Debug, thiserror::Error)]
pub enum EraseError {
    /// The server refused a statement or could not be asked (its error chain).
    #[error("{}", crate::logging::chain(.0))]
    ClickHouse(#[from] clickhouse::error::Error),
    /// A site's deletion not done within [`MUTATION_TIMEOUT`]: the rows left and the mutations
    /// the server reports undone (ClickHouse goes on with it).
    #[error("the deletion is not done after {:?} ({left} rows of the site left in {table}, {undone} mutations pending); ClickHouse goes on with it, run the command again to wait for it", MUTATION_TIMEOUT)]
    NotDone {
        /// The table.
        table: String,
        /// Rows of the site still in it.
        left: u64,
        /// Mutations of the table the server reports undone.
        undone: u64,
    },
    /// The server gave no answer within the caller's bound.
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
}

/// The tables that hold a site's rows: this layout's, a v1 table moved aside by `migrate`, and
/// the CrUX view's daily roll-up (figures, not page views, but a purged site leaves nothing;
/// monthly partitions by `day`: the retention drops them too, kept at most [`ROLLUP_KEPT`]).
pub const TABLES: [&str; 4] = [
    "measurements",
    super::schema::V1_TABLE,
    "crux_days",
    "crux_day_marks",
];
/// The longest the CrUX view's roll-up (`crux_days`, `crux_day_marks`) is kept, whatever the
/// retention: the view reads only the 28 days before today, and every day computed again (a
/// merge, a late beacon) leaves its earlier computation behind until its month is dropped. So
/// its monthly partitions go once their month ended more than 62 days ago.
pub const ROLLUP_KEPT: Duration = Duration::from_secs(62 * 86_400);

/// The retention `expire` applies to `table`: the roll-up's is at most [`ROLLUP_KEPT`].
pub fn retention_of(table: &str, retention: Duration) -> Duration {
    if table.starts_with("crux_") {
        retention.min(ROLLUP_KEPT)
    } else {
        retention
    }
}

/// How long one site deletion may take on one server before the command gives up (it can
/// be run again; ClickHouse goes on with the mutation meanwhile).
pub const MUTATION_TIMEOUT: Duration = Duration::from_secs(600);
/// How often the mutation's progress is read.
const MUTATION_POLL: Duration = Duration::from_millis(500);

/// The tables of [`TABLES`] that exist on the server in `database`.
pub async fn existing_tables(
    client: &clickhouse::Client,
    database: &str,
) -> Result<Vec<&'static str>, EraseError> {
    let names: Vec<String> = client
        .query("SELECT name FROM system.tables WHERE database = ?")
        .bind(database)
        .fetch_all()
        .await?;
    Ok(TABLES
        .into_iter()
        .filter(|t| names.iter().any(|n| n == t))
        .collect())
}

/// Deletes every row of `site` from `database.table` and waits until the server's parts hold
/// none (at most [`MUTATION_TIMEOUT`]). `site` is a site key (`A-Za-z0-9._-`), bound as a
/// parameter. Errors: the server's answer, or the timeout (naming the rows left and the
/// mutations the server reports undone).
pub async fn delete_site(
    client: &clickhouse::Client,
    database: &str,
    table: &str,
    site: &str,
) -> Result<(), EraseError> {
    client
        .query(&format!(
            "ALTER TABLE {database}.{table} DELETE WHERE site = ?"
        ))
        .bind(site)
        .execute()
        .await?;
    let deadline = tokio::time::Instant::now() + MUTATION_TIMEOUT;
    loop {
        // The table is the server's own (never a Distributed one): its parts only.
        let left: u64 = client
            .query(&format!(
                "SELECT count() FROM {database}.{table} WHERE site = ?"
            ))
            .bind(site)
            .fetch_one()
            .await?;
        if left == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let undone: u64 = client
                .query(
                    "SELECT count() FROM system.mutations WHERE database = ? AND table = ? AND is_done = 0",
                )
                .bind(database)
                .bind(table)
                .fetch_one()
                .await
                .unwrap_or(0);
            return Err(EraseError::NotDone {
                table: table.to_owned(),
                left,
                undone,
            });
        }
        tokio::time::sleep(MUTATION_POLL).await;
    }
}

/// What [`expire`] did on one table.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Expired {
    /// Monthly partitions dropped (`YYYYMM`).
    pub partitions: Vec<String>,
    /// Whether the table's TTL was set (servers that have table TTLs).
    pub ttl_set: bool,
}

/// Drops the monthly partitions of `database.table` whose every row is older than `retention`
/// (the month ended before now minus `retention`), and, on a server that has table TTLs, sets
/// `TTL page_view_at + INTERVAL <days> DAY` on `measurements` (see the module doc).
pub async fn expire(
    client: &clickhouse::Client,
    database: &str,
    table: &str,
    retention: Duration,
    now_unix: u64,
) -> Result<Expired, EraseError> {
    #[derive(Deserialize, clickhouse::Row)]
    struct Part {
        partition: String,
    }
    let parts: Vec<Part> = client
        .query(
            "SELECT DISTINCT toString(partition) AS partition FROM system.parts \
             WHERE database = ? AND table = ? AND active",
        )
        .bind(database)
        .bind(table)
        .fetch_all()
        .await?;
    let oldest_kept = oldest_kept_month(now_unix, retention);
    let mut done = Expired::default();
    for Part { partition } in parts {
        let month = partition.trim_matches('\'');
        let Ok(yyyymm) = month.parse::<u32>() else {
            continue;
        };
        if yyyymm < oldest_kept {
            client
                .query(&format!(
                    "ALTER TABLE {database}.{table} DROP PARTITION {yyyymm}"
                ))
                .execute()
                .await?;
            done.partitions.push(yyyymm.to_string());
        }
    }
    if table == "measurements" && has_table_ttl(client).await? {
        let days = retention.as_secs().div_ceil(86_400);
        // Only when it differs: the serving collectors' write user may not ALTER
        // (docs/deployment.md, "ClickHouse users"), and its daily run finds it set.
        if !has_ttl_days(client, database, table, days).await? {
            client
                .query(&format!(
                    "ALTER TABLE {database}.{table} MODIFY TTL page_view_at + INTERVAL {days} DAY"
                ))
                .execute()
                .await?;
        }
        done.ttl_set = true;
    }
    Ok(done)
}

/// Whether `database.table` has the TTL [`expire`] sets for `days` already: its `engine_full`
/// shows `TTL page_view_at + toIntervalDay(DAYS)`, as ClickHouse writes `INTERVAL DAYS DAY`
/// back (26.9).
async fn has_ttl_days(
    client: &clickhouse::Client,
    database: &str,
    table: &str,
    days: u64,
) -> Result<bool, clickhouse::error::Error> {
    let engines: Vec<String> = client
        .query("SELECT engine_full FROM system.tables WHERE database = ? AND name = ?")
        .bind(database)
        .bind(table)
        .fetch_all()
        .await?;
    Ok(ttl_of(&engines, days))
}

/// Whether one of `engines` (`system.tables.engine_full`) has the TTL of `days` days.
fn ttl_of(engines: &[String], days: u64) -> bool {
    let ttl = format!("TTL page_view_at + toIntervalDay({days})");
    engines.iter().any(|e| {
        e.split(&ttl)
            .nth(1)
            .is_some_and(|after| !after.starts_with(|c: char| c.is_ascii_digit() || c == ','))
    })
}

/// The earliest month (`YYYYMM`) that still holds a row younger than `retention` at
/// `now_unix`: the month of `now - retention`. Months before it end before the retention's
/// edge and are dropped whole.
pub fn oldest_kept_month(now_unix: u64, retention: Duration) -> u32 {
    let edge = now_unix.saturating_sub(retention.as_secs());
    let date = utc_datetime(edge).date();
    date.year() as u32 * 100 + u32::from(u8::from(date.month()))
}

/// Whether the server has table TTLs (ClickHouse 19.6 and later).
async fn has_table_ttl(client: &clickhouse::Client) -> Result<bool, clickhouse::error::Error> {
    let version: String = client.query("SELECT version()").fetch_one().await?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    Ok((major, minor) >= (19, 6))
}

/// Unix seconds as a UTC date and time; a time past the year 9999 (beyond what the `time`
/// crate represents) reads as the epoch.
pub(crate) fn utc_datetime(unix: u64) -> time::OffsetDateTime {
    i64::try_from(unix)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The roll-up goes after 62 days, or sooner with a shorter retention; rows keep theirs.
    #[test]
    fn the_rollup_is_kept_at_most_62_days() {
        let day = Duration::from_secs(86_400);
        assert_eq!(retention_of("crux_days", day * 395), day * 62);
        assert_eq!(retention_of("crux_day_marks", day * 30), day * 30);
        assert_eq!(retention_of("measurements", day * 395), day * 395);
    }

    #[test]
    fn a_ttl_counts_only_with_its_days_and_alone() {
        let engine = |ttl: &str| {
            vec![format!(
                "ReplacingMergeTree(received_at) PARTITION BY toYYYYMM(page_view_at) ORDER BY (site, id) {ttl}SETTINGS index_granularity = 8192"
            )]
        };
        assert!(ttl_of(
            &engine("TTL page_view_at + toIntervalDay(395) "),
            395
        ));
        assert!(!ttl_of(
            &engine("TTL page_view_at + toIntervalDay(3950) "),
            395
        ));
        assert!(!ttl_of(
            &engine("TTL page_view_at + toIntervalDay(30) "),
            395
        ));
        assert!(!ttl_of(&engine(""), 395));
        // A second TTL expression beside it is not what `expire` sets.
        assert!(!ttl_of(
            &engine("TTL page_view_at + toIntervalDay(395), page_view_at + toIntervalDay(1) "),
            395
        ));
        assert!(!ttl_of(&[], 395));
    }

    #[test]
    fn the_oldest_kept_month_is_that_of_the_retentions_edge() {
        const DAY: u64 = 86_400;
        // 2026-12-03T12:00:00Z
        let now = 1_796_299_200;
        let date = utc_datetime(now).date();
        assert_eq!(
            (date.year(), u8::from(date.month()), date.day()),
            (2026, 12, 3)
        );
        assert_eq!(oldest_kept_month(now, Duration::from_secs(2 * DAY)), 202612);
        assert_eq!(oldest_kept_month(now, Duration::from_secs(3 * DAY)), 202611);
        assert_eq!(
            oldest_kept_month(now, Duration::from_secs(395 * DAY)),
            202511
        );
        assert_eq!(
            oldest_kept_month(now, Duration::from_secs(365 * 100 * DAY)),
            197001,
            "before the epoch: nothing is dropped"
        );
    }
}

//! `collector sites purge KEY`: purges a site (the word is defined in [`crate`]; contract v4
//! §1, §3; GDPR art. 17 and 28(3)(g) for a shop that leaves).
//!
//! In order, so that nothing of the site is written after its rows are deleted:
//! 1. the site is disabled and marked purged in the settings store: intake refuses its
//!    beacons (403), and every collector drops its records still in a spool instead of
//!    inserting them once it has read the mark (within `COLLECTOR_SETTINGS_TTL`);
//! 2. the command waits out that TTL from the mark (a second run does not wait again);
//! 3. on every ClickHouse server of `COLLECTOR_CLICKHOUSE_URLS`, the site's rows are deleted
//!    from `measurements` and from a v1 table moved aside, and the deletion waited for
//!    ([`crate::clickhouse::erase::delete_site`]);
//! 4. its records on this host are deleted from every spool folder's kept-aside files and
//!    damaged-segment copies ([`crate::shards::spool_dirs`]: of every shard, configured or
//!    not; [`crate::spool::hold_kept_aside`]);
//! 5. it waits until every serving collector has recorded in the store that it did the same
//!    with its own files (each does when its settings reload shows the mark:
//!    [`crate::purges`]), at most [`collectors_wait`] of the slowest one's reload interval
//!    after the mark, and names each one: done (with the rows
//!    it deleted), not yet, or not serving (it does it at its next start).
//!
//! A server that cannot be reached, or a serving collector that has not done its files in
//! time, is named on stderr and the command exits 1: running it again finishes the job (each
//! step is idempotent).

use std::time::Duration;

use super::{failed, RunError};
use crate::clickhouse::erase;
use crate::config::Config;
use crate::settings::SettingsStore;

/// Runs the purge of `key` (a valid site key).
pub async fn run(config: &Config, store: &SettingsStore, key: &str) -> Result<(), RunError> {
    let marked_for = store
        .mark_purged(key)
        .await
        .map_err(failed)?
        .ok_or_else(|| RunError::Failed(format!("no site {key:?}")))?;
    let ttl = config.settings.ttl;
    println!("site {key}: disabled and marked erased");
    // A second past the TTL: every collector's full reload has run since the mark.
    let marked_at = tokio::time::Instant::now()
        .checked_sub(marked_for)
        .unwrap_or_else(tokio::time::Instant::now);
    let wait = (ttl + Duration::from_secs(1)).saturating_sub(marked_for);
    if !wait.is_zero() {
        println!(
            "waiting {wait:?} (COLLECTOR_SETTINGS_TTL) for every collector to stop inserting its records"
        );
        tokio::time::sleep(wait).await;
    }
    let mut unreached = Vec::new();
    let results = futures_util::future::join_all(
        config
            .clickhouse
            .urls()
            .map(|url| delete_on(config, url.as_str().trim_end_matches('/'), key)),
    )
    .await;
    for (url, result) in results {
        match result {
            Ok(tables) => println!(
                "clickhouse {url}: rows of {key} deleted from {}",
                tables.join(", ")
            ),
            Err(e) => {
                eprintln!("collector: clickhouse {url}: not done: {e}");
                unreached.push(url);
            }
        }
    }
    let rules = crate::purges::rules_of(store.fetch_all().await.map_err(failed)?);
    // Every spool folder, of a shard configured or not (one an earlier configuration left).
    for (_, dir) in crate::shards::spool_dirs(&config.spool.dir) {
        crate::spool::hold_kept_aside(&dir, &rules)
            .map_err(|e| failed(format!("kept-aside records in {}: {e}", dir.display())))?;
    }
    let kept = rules.dropped_of(key);
    println!("kept-aside: {kept} records of {key} deleted on this host");
    unreached.extend(wait_for_collectors(config, store, key, marked_at).await?);
    if unreached.is_empty() {
        println!("site {key} erased");
        Ok(())
    } else {
        Err(RunError::Failed(format!(
            "site {key}: not erased on {} (run the command again once they answer)",
            unreached.join(", ")
        )))
    }
}

/// Deletes `site`'s rows from every table of [`erase::TABLES`] on the server at `url`; the
/// tables done.
async fn delete_on(
    config: &Config,
    url: &str,
    site: &str,
) -> (String, Result<Vec<&'static str>, erase::EraseError>) {
    let client = crate::clickhouse::client(url, &config.clickhouse, true);
    let database = &config.clickhouse.database;
    let result = async {
        let tables = erase::existing_tables(&client, database).await?;
        for table in &tables {
            erase::delete_site(&client, database, table, site).await?;
        }
        Ok(tables)
    }
    .await;
    (url.to_owned(), result)
}

/// How long after the mark the command waits for a serving collector that reloads its
/// settings every `every` (it says so in the store): two reloads and 10 s for the pass over its
/// files.
pub fn collectors_wait(every: Duration) -> Duration {
    every * 2 + Duration::from_secs(10)
}

/// Waits until every serving collector has done `key`'s purge in its files (each at most
/// [`collectors_wait`] of its own interval, or of `COLLECTOR_SETTINGS_TTL` if longer, after
/// `marked_at`), printing what each one did; the serving ones that have not, named.
async fn wait_for_collectors(
    config: &Config,
    store: &SettingsStore,
    key: &str,
    marked_at: tokio::time::Instant,
) -> Result<Vec<String>, RunError> {
    let mut told = false;
    let collectors = loop {
        let collectors = store.purges_of(key).await.map_err(failed)?;
        let waiting: Vec<_> = collectors
            .iter()
            .filter(|c| c.serving() && c.done_rows.is_none())
            .collect();
        let slowest = waiting
            .iter()
            .map(|c| c.every)
            .fold(config.settings.ttl, Duration::max);
        let deadline = marked_at + collectors_wait(slowest);
        if waiting.is_empty() || tokio::time::Instant::now() >= deadline {
            break collectors;
        }
        if !told {
            told = true;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            println!(
                "waiting up to {}s for {} collector(s) to delete the records of {key} in their files",
                left.as_secs(),
                waiting.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut not_done = Vec::new();
    for c in &collectors {
        match (c.done_rows, c.serving()) {
            (Some(rows), _) => println!(
                "collector {}: {rows} kept-aside and damaged-segment records of {key} deleted",
                c.collector
            ),
            (None, true) => {
                eprintln!(
                    "collector: collector {}: has not deleted the records of {key} in its files yet",
                    c.collector
                );
                not_done.push(format!("collector {}", c.collector));
            }
            (None, false) => println!(
                "collector {}: not serving (last seen {}s ago): deletes them at its next start",
                c.collector,
                c.seen_ago.as_secs()
            ),
        }
    }
    Ok(not_done)
}

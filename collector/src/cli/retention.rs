//! `collector retention`: deletes, once, every row older than `COLLECTOR_RETENTION` on every
//! ClickHouse server (and kept-aside records as old on this host); `serve` runs the same at
//! start and daily ([`run_once`]). How rows go, by server version:
//! [`crate::clickhouse::erase::expire`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::RunError;
use crate::clickhouse::erase;
use crate::config::Config;

/// How often `serve` applies the retention.
pub const EVERY: Duration = Duration::from_secs(24 * 3600);
/// Bound on applying the retention to one server (a server that hangs is tried the next
/// time).
pub const SERVER_TIMEOUT: Duration = Duration::from_secs(60);

/// `collector retention`: exit 0 when every server is done, 1 naming those that are not.
pub async fn run(config: &Config) -> Result<(), RunError> {
    let failed = run_once(
        config,
        |line| println!("{line}"),
        |line| eprintln!("collector: {line}"),
    )
    .await;
    if failed.is_empty() {
        Ok(())
    } else {
        Err(RunError::Failed(format!(
            "retention not applied on {} (run it again once they answer)",
            failed.join(", ")
        )))
    }
}

/// Applies the retention once on every server and to this host's kept-aside files, saying what
/// it did through `done` and what failed through `problem`; the servers it could not finish.
pub async fn run_once(
    config: &Config,
    mut done: impl FnMut(String),
    mut problem: impl FnMut(String),
) -> Vec<String> {
    let retention = config.clickhouse.retention;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut failed = Vec::new();
    for url in config.clickhouse.urls() {
        let url = url.as_str().trim_end_matches('/');
        let client = crate::clickhouse::client(url, &config.clickhouse, true);
        let database = &config.clickhouse.database;
        let work = async {
            let mut report = Vec::new();
            for table in erase::existing_tables(&client, database).await? {
                let kept = erase::retention_of(table, retention);
                let expired = erase::expire(&client, database, table, kept, now).await?;
                report.push(format!(
                    "{table}: {} partitions dropped{}",
                    expired.partitions.len(),
                    if expired.ttl_set { ", TTL set" } else { "" }
                ));
            }
            Ok::<_, erase::EraseError>(report)
        };
        let result = tokio::time::timeout(SERVER_TIMEOUT, work)
            .await
            .unwrap_or(Err(erase::EraseError::NoAnswer(SERVER_TIMEOUT)));
        match result {
            Ok(report) => done(format!(
                "clickhouse {url}: retention {}: {}",
                in_days(retention),
                report.join("; ")
            )),
            Err(e) => {
                problem(format!("clickhouse {url}: retention not applied: {e}"));
                failed.push(url.to_owned());
            }
        }
    }
    // Every spool folder, of a shard configured or not: kept-aside files outlive no retention.
    for (shard, dir) in crate::shards::spool_dirs(&config.spool.dir) {
        match crate::spool::expire_kept_aside(&dir, retention) {
            Ok(n) => done(format!(
                "kept-aside of shard {shard}: {n} files older than the retention deleted"
            )),
            Err(e) => problem(format!("kept-aside files in {}: {e}", dir.display())),
        }
    }
    failed
}

/// A retention as an operator wrote it: whole days (`395 days`; humantime would say
/// `1year 29days 18h`, counting a year as 365.25 days), else humantime's form.
fn in_days(retention: std::time::Duration) -> String {
    let secs = retention.as_secs();
    if secs.is_multiple_of(86_400) && retention.subsec_nanos() == 0 {
        format!("{} days", secs / 86_400)
    } else {
        humantime::format_duration(retention).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::in_days;
    use std::time::Duration;

    #[test]
    fn a_retention_reads_in_days() {
        assert_eq!(in_days(Duration::from_secs(395 * 86_400)), "395 days");
        assert_eq!(in_days(Duration::from_secs(90_000)), "1day 1h");
    }
}

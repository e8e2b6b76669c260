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
//! 4. its kept-aside records on this host are deleted from every spool folder's `kept-aside/`
//!    ([`crate::shards::spool_dirs`]: of every shard, configured or not).
//!
//! A server that cannot be reached is named on stderr and the command exits 1: running it
//! again finishes the job (each step is idempotent).

use std::path::Path;
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
    let mut kept = 0;
    // Every spool folder, of a shard configured or not (one an earlier configuration left).
    for (_, dir) in crate::shards::spool_dirs(&config.spool.dir) {
        kept += purge_kept_aside(&dir.join("kept-aside"), key)
            .map_err(|e| failed(format!("kept-aside records in {}: {e}", dir.display())))?;
    }
    println!("kept-aside: {kept} records of {key} deleted on this host");
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
) -> (String, Result<Vec<&'static str>, String>) {
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

/// Deletes the rows of `site` from the kept-aside files in `dir` (each `{"reason", "measurements":
/// [...]}`), a file left without rows as a whole; the number of rows deleted.
fn purge_kept_aside(dir: &Path, site: &str) -> std::io::Result<usize> {
    let mut deleted = 0;
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let Ok(mut body) = serde_json::from_slice::<serde_json::Value>(&std::fs::read(&path)?)
        else {
            continue;
        };
        let Some(rows) = body.get_mut("measurements").and_then(|m| m.as_array_mut()) else {
            continue;
        };
        let before = rows.len();
        rows.retain(|r| r.get("site").and_then(|s| s.as_str()) != Some(site));
        let gone = before - rows.len();
        if gone == 0 {
            continue;
        }
        deleted += gone;
        if rows.is_empty() {
            std::fs::remove_file(&path)?;
        } else {
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, serde_json::to_vec_pretty(&body).unwrap_or_default())?;
            std::fs::rename(&tmp, &path)?;
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_aside_records_of_the_site_go_and_the_others_stay() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, sites: &[&str]| {
            let rows: Vec<_> = sites
                .iter()
                .map(|s| serde_json::json!({"id": "x", "site": s}))
                .collect();
            std::fs::write(
                dir.path().join(name),
                serde_json::to_vec(&serde_json::json!({"reason": "r", "measurements": rows}))
                    .unwrap(),
            )
            .unwrap();
        };
        file("a.json", &["gone", "gone"]);
        file("b.json", &["gone", "kept"]);
        file("c.json", &["kept"]);
        assert_eq!(purge_kept_aside(dir.path(), "gone").unwrap(), 3);
        assert!(!dir.path().join("a.json").exists());
        let b: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("b.json")).unwrap()).unwrap();
        assert_eq!(b["measurements"].as_array().unwrap().len(), 1);
        assert_eq!(b["reason"], "r");
        assert!(dir.path().join("c.json").exists());
        assert_eq!(
            purge_kept_aside(dir.path(), "gone").unwrap(),
            0,
            "idempotent"
        );
        assert_eq!(
            purge_kept_aside(&dir.path().join("none"), "gone").unwrap(),
            0
        );
    }
}

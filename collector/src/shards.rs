//! The shards' spools (contract v5 §3): one spool per configured shard, so that a shard that
//! is down fills only its own share of the disk bound and holds back only its own sites.
//!
//! Shard `default` (`COLLECTOR_CLICKHOUSE_URLS`, or a shard of that name in
//! `COLLECTOR_CLICKHOUSE_SHARDS`) keeps the spool folder itself, as every release before shards
//! did; shard `NAME` has `COLLECTOR_SPOOL_DIR/shards/NAME/`. Each is a whole spool of its own
//! ([`crate::spool`]): segments, cursor, in-flight record, identity (so insert tokens never
//! collide across shards), group commit and bound (`COLLECTOR_SPOOL_MAX_BYTES` divided
//! equally among the shards). Why not one log with a cursor per shard: a shared log keeps
//! every segment that the slowest shard has not confirmed, so one shard's outage would fill
//! the bound for every shard; the cost of this shape is one `fdatasync` per shard and group
//! (docs/durability.md, "Shards").
//!
//! A spool folder of a shard no longer configured that still holds unconfirmed measurements
//! stops `serve` ([`open`]): nothing acknowledged is abandoned without an operator's word.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, ShardConfig, DEFAULT_SHARD};
use crate::metrics::Metrics;
use crate::spool::{self, AppendError, Record, Spool, SpoolReader};

/// The folder under the spool folder that holds the spools of shards other than `default`.
pub const SHARDS_DIR: &str = "shards";

/// The spool folder of shard `name` under `spool_dir`.
pub fn spool_dir(spool_dir: &Path, name: &str) -> PathBuf {
    if name == DEFAULT_SHARD {
        spool_dir.to_owned()
    } else {
        spool_dir.join(SHARDS_DIR).join(name)
    }
}

/// Every spool folder under `spool_dir` that exists, with its shard's name: the folder itself
/// as `default` when it holds a spool (`segments/` or `kept-aside/`), and each
/// `shards/NAME/`, configured or not, so that what an earlier configuration left is found too
/// (retention, `sites purge`, `spool dump`, [`open`]'s check). Sorted by name.
pub fn spool_dirs(spool_dir: &Path) -> Vec<(String, PathBuf)> {
    let mut dirs = Vec::new();
    if spool_dir.join("segments").is_dir() || spool_dir.join("kept-aside").is_dir() {
        dirs.push((DEFAULT_SHARD.to_owned(), spool_dir.to_owned()));
    }
    if let Ok(entries) = std::fs::read_dir(spool_dir.join(SHARDS_DIR)) {
        for entry in entries.flatten() {
            if entry.path().is_dir() {
                let name = entry.file_name().to_string_lossy().into_owned();
                dirs.push((name, entry.path()));
            }
        }
    }
    dirs.sort();
    dirs
}

/// The appending side of every shard's spool, in the configured order. Cheap to clone.
#[derive(Clone)]
pub struct ShardSpools {
    shards: Arc<[(String, Spool)]>,
}

impl ShardSpools {
    /// The shards and their spools, in the configured order.
    pub fn new(shards: Vec<(String, Spool)>) -> Self {
        ShardSpools {
            shards: shards.into(),
        }
    }

    /// The place of shard `name`, or `None` when this collector does not know it.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.shards.iter().position(|(n, _)| n == name)
    }

    /// The spool of the shard at `index` (from [`ShardSpools::index`]).
    pub fn spool(&self, index: usize) -> &Spool {
        &self.shards[index].1
    }

    /// Every shard's spool.
    pub fn spools(&self) -> impl Iterator<Item = &Spool> {
        self.shards.iter().map(|(_, s)| s)
    }

    /// Adds each record to its shard's open group, all at once, without waiting: the first
    /// half of an append ([`spool::Spool::join`]); [`Appends::wait`] is the second.
    pub fn join(&self, records: Vec<(usize, Record)>, limit: Duration) -> Appends {
        if let [(i, record)] = &records[..] {
            return Appends::One(self.spool(*i).join(record, limit));
        }
        Appends::Many(
            records
                .iter()
                .map(|(i, record)| (*i, self.spool(*i).join(record, limit)))
                .collect(),
        )
    }

    /// Why the spools cannot write, if one cannot: they share the host's disk, so a disk that
    /// refuses one shard's writes refuses every shard's.
    pub fn unwritable(&self) -> Option<&'static str> {
        self.spools().find_map(Spool::unwritable)
    }

    /// Whether some shard's spool has room for `headroom` more bytes: one shard whose spool is
    /// full (its replicas down) costs its own sites only, not the collector's readiness.
    pub fn any_has_room(&self, headroom: impl Fn(&Spool) -> u64) -> bool {
        self.spools().any(|s| s.has_room(headroom(s)))
    }
}

/// One request's records in their shards' open groups ([`ShardSpools::join`]), each joined or
/// refused at once.
pub enum Appends {
    /// The request's measurements all go to one shard (no list to allocate).
    One(Result<spool::Joined, AppendError>),
    /// One record per shard, with the shard's place.
    Many(Vec<(usize, Result<spool::Joined, AppendError>)>),
}

impl Appends {
    /// Waits until every record is durable (at most about the join's `limit`). Errors: the
    /// first refusal, with the shards whose record did become durable (their measurements are
    /// stored: the caller counts them as such, so that the client's retry folds them as
    /// duplicates instead of storing them again).
    pub async fn wait(self) -> Result<(), (AppendError, Vec<usize>)> {
        let joined = match self {
            Appends::One(joined) => return waited(joined).await.map_err(|e| (e, Vec::new())),
            Appends::Many(joined) => joined,
        };
        let waits = joined
            .into_iter()
            .map(|(i, joined)| async move { (i, waited(joined).await) });
        let outcomes = futures_util::future::join_all(waits).await;
        let durable: Vec<usize> = outcomes
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|&(i, _)| i)
            .collect();
        match outcomes.into_iter().find_map(|(_, r)| r.err()) {
            None => Ok(()),
            Some(e) => Err((e, durable)),
        }
    }
}

/// A joined record's outcome, or the refusal of its join.
async fn waited(joined: Result<spool::Joined, AppendError>) -> Result<(), AppendError> {
    joined?.wait().await
}

/// Why the shards' spools did not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A spool folder of a shard that is not configured holds unconfirmed measurements (each
    /// folder named, with its shard and count): a configuration to fix (exit 2).
    #[error("the spool holds measurements of shards that COLLECTOR_CLICKHOUSE_SHARDS does not list: {}; list those shards again until their spools are empty (docs/operations.md, \"Adding a shard\")", .0.join(", "))]
    Orphaned(Vec<String>),
    /// A spool could not be opened or read.
    #[error("{0}")]
    Spool(String),
}

/// Opens the spool of every configured shard, each with an equal share of the bound, after
/// checking that no folder of an unconfigured shard holds unconfirmed measurements; what an
/// earlier release left in each is held to `rules` first ([`spool::at_rest`]). Returns the
/// appending sides and, per shard, its configuration and reading side.
pub fn open(
    config: &Config,
    rules: &dyn spool::AtRest,
    metrics: &Arc<Metrics>,
) -> Result<(ShardSpools, Vec<(ShardConfig, SpoolReader)>), OpenError> {
    let shards = &config.clickhouse.shards;
    refuse_orphans(&config.spool.dir, shards)?;
    let share = config.spool.max_bytes / shards.len() as u64;
    let mut spools = Vec::with_capacity(shards.len());
    let mut readers = Vec::with_capacity(shards.len());
    for shard in shards {
        let dir = spool_dir(&config.spool.dir, &shard.name);
        let (spool, reader) = spool::open_shard(
            &dir,
            &shard.name,
            share,
            crate::measurement::LAYOUTS,
            Some(rules),
            metrics.clone(),
        )
        .map_err(|e| OpenError::Spool(e.to_string()))?;
        spools.push((shard.name.clone(), spool));
        readers.push((shard.clone(), reader));
    }
    Ok((ShardSpools::new(spools), readers))
}

/// Fails naming each spool folder of a shard that is not configured (the folder itself for
/// `default`, `shards/NAME/` for the others) while it holds measurements ClickHouse has not
/// confirmed: they belong to sites of that shard, and only its replicas may have them.
fn refuse_orphans(dir: &Path, shards: &[ShardConfig]) -> Result<(), OpenError> {
    let configured = |name: &str| shards.iter().any(|s| s.name == name);
    let candidates = spool_dirs(dir)
        .into_iter()
        .filter(|(name, _)| !configured(name));
    let mut held = Vec::new();
    for (name, folder) in candidates {
        if !folder.join("segments").is_dir() {
            continue;
        }
        let frames = spool::dump::dump(&folder, false, |_| Ok(()))
            .map_err(|e| OpenError::Spool(format!("spool folder {}: {e}", folder.display())))?
            .frames;
        if frames > 0 {
            held.push(format!(
                "{} (shard {name}: {frames} unconfirmed records)",
                folder.display()
            ));
        }
    }
    if held.is_empty() {
        Ok(())
    } else {
        Err(OpenError::Orphaned(held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spool_folder_is_found_configured_or_not() {
        let root = tempfile::tempdir().unwrap();
        assert!(spool_dirs(root.path()).is_empty());
        for dir in ["kept-aside", "shards/b/segments", "shards/a/kept-aside"] {
            std::fs::create_dir_all(root.path().join(dir)).unwrap();
        }
        let names: Vec<String> = spool_dirs(root.path())
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, ["a", "b", "default"]);
    }

    #[test]
    fn the_default_shard_keeps_the_spool_folder_itself() {
        let root = Path::new("/var/spool/collector");
        assert_eq!(spool_dir(root, "default"), root);
        assert_eq!(spool_dir(root, "b"), root.join("shards/b"));
    }
}

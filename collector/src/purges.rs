//! Every collector's part of holding its files to the rules (contract v5 §5): the rules at rest
//! made from the site settings, and a purge reaching this collector's files.
//!
//! - At start, [`rules`] makes the rules at rest ([`SiteRules`]) from the site settings as
//!   loaded, which [`crate::shards::open`] applies to what an earlier release left in each
//!   spool folder (segments of an earlier layout, kept-aside files, damaged-segment copies).
//! - While serving, [`run`] says in the settings store that this collector serves (every
//!   `COLLECTOR_SETTINGS_TTL`), and whenever the set of purged sites grows, holds the
//!   kept-aside and damaged-segment files of every spool folder here to the rules again (the
//!   purged sites' rows deleted) and records, per purged site, that this collector has done it
//!   ([`crate::settings::purges`]): `collector sites purge` waits for those records and names
//!   the collectors that have not. The site's records still in a spool are dropped by the writer
//!   instead of inserted ([`crate::writer`]), and a batch it keeps aside after the purge leaves
//!   them out.
//!
//! A collector is named `HOST:SPOOL_DIR` ([`name`]): two collectors on one host have two spool
//! folders.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::Config;
use crate::measurement::stored::{Keeps, SiteRules};
use crate::settings::{Site, SiteSettings, SiteSource};

/// The rules at rest for the sites `settings` holds.
pub fn rules(settings: &SiteSettings) -> SiteRules {
    rules_of(settings.known_sites().iter().map(|s| s.site.clone()))
}

/// The rules at rest for `sites`.
pub fn rules_of(sites: impl IntoIterator<Item = Site>) -> SiteRules {
    SiteRules::new(sites.into_iter().map(|s| {
        let keeps = Keeps {
            keep_query: s.keep_query,
            origins: s.allowed_origins,
        };
        (s.key, keeps, s.purged)
    }))
}

/// This collector's name in the store: the host's name and the spool folder (made absolute).
pub fn name(spool_dir: &Path) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    let dir = std::fs::canonicalize(spool_dir).unwrap_or_else(|_| spool_dir.to_owned());
    format!("{host}:{}", dir.display())
}

/// Until `shutdown` turns true: says every `COLLECTOR_SETTINGS_TTL` that this collector serves,
/// and records the purges of `at_open` (each purged site and the rows of it deleted when the
/// spools were opened), then of every site purged since, once its files here are done.
pub async fn run(
    config: Config,
    store: Arc<dyn SiteSource>,
    settings: SiteSettings,
    at_open: Vec<(String, i64)>,
    mut shutdown: watch::Receiver<bool>,
) {
    let me = name(&config.spool.dir);
    let every = config.settings.ttl.max(Duration::from_millis(100));
    let mut purged = settings.purged();
    let mut handled: BTreeSet<String> = at_open.iter().map(|(s, _)| s.clone()).collect();
    // Rows deleted per site not yet recorded (the store may be down): recorded at the next turn.
    let mut unrecorded: HashMap<String, i64> = at_open.into_iter().collect();
    loop {
        let now = purged.borrow_and_update().clone();
        if now.iter().any(|s| !handled.contains(s)) {
            for (site, rows) in hold_files(&config, &settings).await {
                if !handled.contains(&site) {
                    *unrecorded.entry(site).or_default() += rows;
                }
            }
        }
        handled = now.iter().cloned().collect();
        // A site added again is no longer purged: nothing to record for it.
        unrecorded.retain(|site, _| handled.contains(site));
        if let Err(e) = store.collector_seen(&me, every).await {
            tracing::debug!(error = %e, "purge: cannot say this collector serves");
        }
        record(&*store, &me, &mut unrecorded).await;
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            changed = purged.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// Holds the kept-aside and damaged-segment files of every spool folder here to the rules of
/// the settings as they are now: the rows deleted per purged site.
async fn hold_files(config: &Config, settings: &SiteSettings) -> Vec<(String, i64)> {
    let rules = Arc::new(rules(settings));
    let dir = config.spool.dir.clone();
    let counting = rules.clone();
    let held = tokio::task::spawn_blocking(move || {
        for (_, folder) in crate::shards::spool_dirs(&dir) {
            match crate::spool::hold_kept_aside(&folder, &*counting) {
                Ok(held) => tracing::info!(folder = %folder.display(), rewritten = held.rewritten, deleted = held.deleted, rows_deleted = held.rows_dropped, "purge: kept-aside and damaged-segment files held to the rules"),
                Err(e) => tracing::warn!(folder = %folder.display(), error = %e, "purge: cannot read the kept-aside files"),
            }
        }
    })
    .await;
    if held.is_err() {
        tracing::warn!("purge: the pass over the kept-aside files stopped");
    }
    rules
        .purged()
        .map(|s| (s.to_owned(), rules.dropped_of(s) as i64))
        .collect()
}

/// Records in the store each purge of `unrecorded` done here; what could not be recorded stays.
async fn record(store: &dyn SiteSource, me: &str, unrecorded: &mut HashMap<String, i64>) {
    let mut recorded = Vec::new();
    for (site, rows) in unrecorded.iter() {
        match store.purge_done(site, me, *rows).await {
            Ok(true) => recorded.push(site.clone()),
            Ok(false) => {
                crate::logging::warn_limited("purge_unrecorded", || {
                    tracing::warn!(site, "purge: the settings store cannot record that this collector's files are done (read-only, or `collector migrate` not run: no table site_purges); tried again")
                });
                break;
            }
            Err(e) => {
                crate::logging::warn_limited(
                    "purge_record",
                    || tracing::warn!(site, error = %e, "purge: cannot record that this collector's files are done; tried again"),
                );
                break;
            }
        }
    }
    for site in recorded {
        if let Some(rows) = unrecorded.remove(&site) {
            if rows > 0 {
                tracing::info!(
                    site,
                    rows,
                    "purge: the site's kept-aside records here deleted and recorded"
                );
            }
        }
    }
}

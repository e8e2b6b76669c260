//! The prober: checks every replica about once a second, applies the schema to a replica found
//! without it (DDL: the one thing it writes), and feeds [`Replicas::probed`].
//!
//! A replica passes the catch-up check (contract §3) when it answers and, for the
//! measurements table in `system.replicas`, it is not read-only, its ZooKeeper session is not
//! expired, every replication-log entry is pulled (`log_pointer > log_max_index`, or both 0 on
//! a table never written to), no insert is waiting (`inserts_in_queue = 0`) and
//! `absolute_delay` is within `COLLECTOR_CATCHUP_MAX_DELAY`. A table that is not replicated
//! (no row in `system.replicas`) passes when the server answers.

use std::sync::LazyLock;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::watch;

use crate::clickhouse::insert::is_stale_connection;
use crate::measurement::COLUMNS;
use crate::writer::replicas::{Probe, ProbeError, Replicas};

/// Time between probe rounds.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Bound on one probe; a replica that does not answer within it failed the probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// One row of `system.replicas`, cast to fixed types so that the same query works on
/// ClickHouse 18.16 and on current releases.
#[derive(Debug, Clone, Deserialize, clickhouse::Row)]
pub struct ReplicaStatus {
    /// `system.replicas.is_readonly`.
    pub is_readonly: u8,
    /// `system.replicas.is_session_expired`.
    pub is_session_expired: u8,
    /// `system.replicas.log_pointer`: index of the next log entry to pull.
    pub log_pointer: u64,
    /// `system.replicas.log_max_index`: index of the last log entry.
    pub log_max_index: u64,
    /// `system.replicas.inserts_in_queue`: parts still to fetch.
    pub inserts_in_queue: u64,
    /// `system.replicas.absolute_delay`, seconds.
    pub absolute_delay: u64,
}

impl ReplicaStatus {
    /// Whether this replica has caught up (see the module doc).
    pub fn caught_up(&self, max_delay: Duration) -> bool {
        self.is_readonly == 0
            && self.is_session_expired == 0
            && (self.log_pointer > self.log_max_index
                || (self.log_pointer == 0 && self.log_max_index == 0))
            && self.inserts_in_queue == 0
            && self.absolute_delay <= max_delay.as_secs()
    }
}

const STATUS_QUERY: &str = "SELECT toUInt8(is_readonly) AS is_readonly, toUInt8(is_session_expired) AS is_session_expired, \
     toUInt64(log_pointer) AS log_pointer, toUInt64(log_max_index) AS log_max_index, \
     toUInt64(inserts_in_queue) AS inserts_in_queue, toUInt64(absolute_delay) AS absolute_delay \
     FROM system.replicas WHERE database = ? AND table = 'measurements'";

/// Bound on applying the schema to a replica found without it.
pub const SCHEMA_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Deserialize, clickhouse::Row)]
struct ServerInfo {
    version: String,
    columns: u64,
}

/// `version()` and how many of the writer's columns the replica's `measurements` has, in one
/// round trip (a scalar subquery, which 18.16 and current releases both accept). Current
/// releases type a scalar subquery `Nullable` (26.9: `Nullable(UInt64)`, 18.16: `UInt64`), and
/// the writer's client reads without type validation (18.16 lacks the header it needs), so
/// `ifNull` gives both the one type [`ServerInfo`] reads: without it, 26.9's null flag byte
/// shifted the count (23 columns read as 5,888) and a table lacking columns passed.
static INFO_QUERY: LazyLock<String> = LazyLock::new(|| {
    let names = COLUMNS
        .iter()
        .map(|c| format!("'{c}'"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "SELECT version() AS version, toUInt64(ifNull((SELECT count() FROM system.columns \
         WHERE database = ? AND table = 'measurements' AND name IN ({names})), 0)) AS columns"
    )
});

/// Whether a `version()` string is ClickHouse 22.2 or later, which knows
/// `insert_deduplication_token` (ClickHouse changelog, 22.2).
pub fn knows_dedup_token(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (22, 2)
}

async fn check(
    client: &clickhouse::Client,
    database: &str,
    max_delay: Duration,
) -> Result<Probe, clickhouse::error::Error> {
    let info: ServerInfo = client.query(&INFO_QUERY).bind(database).fetch_one().await?;
    let dedup_token = knows_dedup_token(&info.version);
    if info.columns < COLUMNS.len() as u64 {
        return Ok(Probe {
            caught_up: false,
            dedup_token,
            schema: false,
            replicated: false,
        });
    }
    let rows: Vec<ReplicaStatus> = client
        .query(STATUS_QUERY)
        .bind(database)
        .fetch_all()
        .await?;
    Ok(Probe {
        caught_up: rows.iter().all(|r| r.caught_up(max_delay)),
        dedup_token,
        schema: true,
        replicated: !rows.is_empty(),
    })
}

/// Probes replica `i` once: what it found, or why it did not answer in [`PROBE_TIMEOUT`]
/// (the error with its causes). Applies nothing: [`round`] applies the schema to a replica
/// found without it.
pub async fn probe(replicas: &Replicas, i: usize, options: &Options) -> Result<Probe, ProbeError> {
    let (database, max_delay) = (options.database.as_str(), options.max_delay);
    // The `system` database, not the measurements' one, which may not exist yet.
    let client = replicas.client(i).clone().with_database("system");
    let run = async {
        match check(&client, database, max_delay).await {
            Err(e) if is_stale_connection(&e) => {
                let fresh = replicas.fresh_client(i).clone().with_database("system");
                check(&fresh, database, max_delay).await
            }
            other => other,
        }
    };
    match tokio::time::timeout(PROBE_TIMEOUT, run).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(ProbeError::Timeout(PROBE_TIMEOUT)),
    }
}

/// Applies the schema to replica `i` (within [`SCHEMA_TIMEOUT`]) and says how it went in the
/// log; the replica still counts as lacking it until a probe sees it.
async fn apply_schema(replicas: &Replicas, i: usize, options: &Options) {
    let client = replicas.client(i).clone().with_database("system");
    let apply =
        crate::clickhouse::schema::apply_clickhouse(&client, &options.database, options.form);
    match tokio::time::timeout(SCHEMA_TIMEOUT, apply).await {
        Ok(Ok(applied)) => {
            if applied.moved_v1_aside {
                tracing::warn!(replica = %replicas.url(i), "clickhouse: moved the v1 measurements table aside to measurements_v1 and created v2; run `collector migrate` to copy its rows");
            }
            tracing::info!(replica = %replicas.url(i), "clickhouse: applied the schema to a replica that lacked it; not written to until it has caught up");
            if let Some((cluster, expected)) = &options.distributed {
                let made = crate::clickhouse::cluster::apply_distributed(
                    &client,
                    &options.database,
                    cluster,
                    expected,
                );
                match tokio::time::timeout(SCHEMA_TIMEOUT, made).await {
                    Ok(Ok(())) => {
                        tracing::info!(replica = %replicas.url(i), "clickhouse: made measurements_all on it")
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(replica = %replicas.url(i), error = %e, "clickhouse: no measurements_all on it (collector migrate says why)")
                    }
                    Err(_) => {
                        tracing::warn!(replica = %replicas.url(i), "clickhouse: making measurements_all timed out")
                    }
                }
            }
        }
        Ok(Err(e)) => {
            crate::logging::warn_limited(
                "schema_apply",
                || tracing::warn!(replica = %replicas.url(i), error = %e, "clickhouse: cannot apply the schema to a replica that lacks it"),
            );
        }
        Err(_) => {
            crate::logging::warn_limited(
                "schema_apply",
                || tracing::warn!(replica = %replicas.url(i), "clickhouse: applying the schema timed out"),
            );
        }
    }
}

/// What the prober needs to know.
#[derive(Debug, Clone)]
pub struct Options {
    /// The ClickHouse database holding `measurements`.
    pub database: String,
    /// Most replication delay a replica may have and still count as caught up.
    pub max_delay: Duration,
    /// The form a replica found without the table gets it in.
    pub form: crate::config::TableForm,
    /// With several shards (contract v5 §3): the cluster and where this shard stands in it,
    /// so that a replica given the table also gets `measurements_all`
    /// ([`crate::clickhouse::cluster`]) when its cluster matches.
    pub distributed: Option<(String, crate::clickhouse::cluster::Expected)>,
}

/// One round over every replica, probed concurrently. `initial` trusts a single result.
///
/// The schema is applied to at most one replica a round: of those that answered without it,
/// the one whose URL sorts first. On a replicated table an `ALTER` made on one replica reaches
/// the others through ZooKeeper, and the same `ALTER`s sent to two replicas at once overlap:
/// on ClickHouse 18.16 that aborted a server ("columns changed before this ALTER finished;
/// overlapping ALTER-s ...", then "pure virtual method called", found in a fresh-clone CI run
/// of `tests/tests/upgrade.rs`). The next round probes the others again, and applies it to one
/// that still lacks it (not replicated, or another shard). The choice does not depend on the
/// configured order, which differs between collectors (each prefers its own replica): every
/// collector that sees the same replicas lacking it picks the same one, where the server
/// serialises their `ALTER`s. Collectors that see different ones (a probe failed for one of
/// them) can still overlap: `collector migrate` before the collectors start (as compose.yaml
/// runs it) is the way to upgrade the table.
pub async fn round(replicas: &Replicas, options: &Options, initial: bool) {
    let probes = (0..replicas.len()).map(|i| async move { (i, probe(replicas, i, options).await) });
    let results = futures_util::future::join_all(probes).await;
    let lacking = results
        .iter()
        .filter(|(_, result)| matches!(result, Ok(found) if !found.schema))
        .map(|&(i, _)| i)
        .min_by(|&a, &b| replicas.url(a).cmp(replicas.url(b)));
    if let Some(i) = lacking {
        apply_schema(replicas, i, options).await;
    }
    for (i, result) in results {
        replicas.probed(i, result, initial);
    }
}

/// Probes every [`PROBE_INTERVAL`] until `shutdown` turns true.
pub async fn run(replicas: Replicas, options: Options, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(PROBE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Biased towards the shutdown, and a round cut by it: after a round that took longer
    // than the interval (a hanging replica costs PROBE_TIMEOUT) the next tick is due at
    // once, and a fair choice ran another round half the time, holding the writer's thread
    // (found by the in-process tier: SIGINT took 2 to 14 s instead of at most one round).
    loop {
        tokio::select! {
            biased;
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        tokio::select! {
            biased;
            _ = shutdown.changed() => return,
            () = round(&replicas, &options, false) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> ReplicaStatus {
        ReplicaStatus {
            is_readonly: 0,
            is_session_expired: 0,
            log_pointer: 5,
            log_max_index: 4,
            inserts_in_queue: 0,
            absolute_delay: 0,
        }
    }

    #[test]
    fn catch_up_rules() {
        let zero = Duration::ZERO;
        assert!(status().caught_up(zero));
        assert!(
            ReplicaStatus {
                log_pointer: 0,
                log_max_index: 0,
                ..status()
            }
            .caught_up(zero),
            "never written to"
        );
        assert!(
            !ReplicaStatus {
                log_pointer: 4,
                ..status()
            }
            .caught_up(zero),
            "log not pulled"
        );
        assert!(!ReplicaStatus {
            is_readonly: 1,
            ..status()
        }
        .caught_up(zero));
        assert!(!ReplicaStatus {
            is_session_expired: 1,
            ..status()
        }
        .caught_up(zero));
        assert!(!ReplicaStatus {
            inserts_in_queue: 2,
            ..status()
        }
        .caught_up(zero));
        assert!(!ReplicaStatus {
            absolute_delay: 3,
            ..status()
        }
        .caught_up(zero));
        assert!(ReplicaStatus {
            absolute_delay: 3,
            ..status()
        }
        .caught_up(Duration::from_secs(3)));
    }

    #[test]
    fn dedup_token_support_by_version() {
        assert!(!knows_dedup_token("18.16.1"));
        assert!(!knows_dedup_token("22.1.3.7"));
        assert!(knows_dedup_token("22.2.2.1"));
        assert!(knows_dedup_token("24.8.1"));
        assert!(!knows_dedup_token("garbage"));
    }
}

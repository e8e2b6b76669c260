//! `collector migrate`: applies `schema/postgres/` to PostgreSQL and the ClickHouse schema
//! ([`crate::clickhouse::schema`]) to every ClickHouse replica of every shard, with the
//! `Distributed` table over them ([`crate::clickhouse::cluster`]), then copies a v1 table's
//! rows, and holds every shard's stored rows to today's rules
//! ([`crate::clickhouse::minimise`]).

use super::{cli_store, RunError};
use crate::clickhouse::cluster::{
    apply_distributed, DistributedError, Expected, DISTRIBUTED_TABLE,
};
use crate::clickhouse::schema::{apply_clickhouse, copy_v1, SchemaError, V1_TABLE};
use crate::config::{Config, TableForm};

/// PostgreSQL schema files, in order.
pub const POSTGRES: &[(&str, &str)] = &[
    (
        "001_sites.sql",
        include_str!("../../../schema/postgres/001_sites.sql"),
    ),
    (
        "002_sites_v4.sql",
        include_str!("../../../schema/postgres/002_sites_v4.sql"),
    ),
    (
        "003_sites_shard.sql",
        include_str!("../../../schema/postgres/003_sites_shard.sql"),
    ),
    (
        "004_sites_trusted_proxies.sql",
        include_str!("../../../schema/postgres/004_sites_trusted_proxies.sql"),
    ),
    (
        "005_site_purges.sql",
        include_str!("../../../schema/postgres/005_site_purges.sql"),
    ),
];

/// Bound on applying the schema to one ClickHouse replica (a hung replica must not hold a
/// deploy).
pub const REPLICA_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Pause between two attempts on a replica that did not take the schema yet.
const RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The setting's word for `form`.
fn form_name(form: TableForm) -> &'static str {
    match form {
        TableForm::Replicated => "replicated",
        TableForm::Single => "single",
    }
}

/// Applies the PostgreSQL schema, then the ClickHouse schema to every replica of every shard
/// in turn, each within [`REPLICA_TIMEOUT`], and on each the `Distributed` table
/// `measurements_all` once its cluster is found to list the configured shards
/// ([`crate::clickhouse::cluster`]). One replica down must not block a deploy (contract §1):
/// the replicas that could not be reached are named on stderr, and the run succeeds when
/// PostgreSQL and at least one replica have the schema and no server's cluster differs from
/// the configured shards. The collector applies the local table to the others when they
/// return. Then a v1 table's rows are copied, and every shard's stored rows are minimised by
/// today's rules ([`minimise_stored_rows`]); that fails the run only when a partition still
/// takes rows to change. A bad [`CHUNK_ROWS_SETTING`] is a usage error before anything is done.
pub async fn run(config: &Config) -> Result<(), RunError> {
    // A bad value is a usage error before anything is done.
    let chunk_rows = chunk_rows()?;
    let postgres = apply_postgres(config).await;
    match &postgres {
        Ok(()) => println!("postgres: schema applied"),
        Err(e) => eprintln!("collector: {e}"),
    }
    // One shard from COLLECTOR_CLICKHOUSE_URLS, as before shards: its servers need no cluster
    // (a single 26.x server has none, a cluster of an earlier deployment may list more
    // servers than a collector writes to, and its user may not read system.clusters);
    // measurements_all is made where one matches, and what stops it is said, not fatal. With
    // COLLECTOR_CLICKHOUSE_SHARDS it is fatal.
    let one_default_shard = !config.clickhouse.sharded();
    let mut any_applied = false;
    let mut cluster_differs = Vec::new();
    let mut distributed_failed = Vec::new();
    let mut copies = Vec::new();
    for (position, shard) in config.clickhouse.shards.iter().enumerate() {
        let applied = apply_shard(config, shard).await;
        any_applied |= !applied.is_empty();
        let expected = Expected {
            shard: position,
            replicas: config
                .clickhouse
                .shards
                .iter()
                .map(|s| s.urls.len())
                .collect(),
        };
        for (url, client) in &applied {
            let cluster = &config.clickhouse.cluster;
            match apply_distributed(client, &config.clickhouse.database, cluster, &expected).await {
                Ok(()) => println!("clickhouse {url}: {DISTRIBUTED_TABLE} over cluster {cluster}"),
                Err(e) if one_default_shard => println!(
                    "clickhouse {url}: no {DISTRIBUTED_TABLE} ({e}); one shard needs none: read measurements"
                ),
                Err(e) => {
                    eprintln!("collector: clickhouse {url}: no {DISTRIBUTED_TABLE}: {e}");
                    match e {
                        DistributedError::Failed(_) => distributed_failed.push(url.clone()),
                        _ => cluster_differs.push(url.clone()),
                    }
                }
            }
        }
        let missed = shard.urls.len() - applied.len();
        copies.push((applied.into_iter().next(), missed));
    }
    postgres?;
    if !any_applied {
        return Err(RunError::Failed(
            "no ClickHouse server has the schema (every replica of every shard failed, see above)"
                .into(),
        ));
    }
    for (first, missed) in &copies {
        if let Some((url, client)) = first {
            copy_v1_rows(url, client, &config.clickhouse.database, *missed).await?;
        }
    }
    minimise_stored_rows(config, &copies, chunk_rows).await?;
    if !cluster_differs.is_empty() {
        return Err(RunError::Failed(format!(
            "the cluster {} of {} does not list the configured shards (see above): fix remote_servers or COLLECTOR_CLICKHOUSE_CLUSTER",
            config.clickhouse.cluster,
            cluster_differs.join(", ")
        )));
    }
    if !distributed_failed.is_empty() {
        return Err(RunError::Failed(format!(
            "{DISTRIBUTED_TABLE} not made on {} (see above; run migrate again)",
            distributed_failed.join(", ")
        )));
    }
    Ok(())
}

/// Applies the ClickHouse schema to every replica of `shard`, one after the other: the same
/// `ALTER`s on two replicas of a replicated table at once overlap, which aborted a ClickHouse
/// 18.16 server (see `writer::probe::round`); each is waited for up to [`REPLICA_TIMEOUT`] from
/// its turn (in a fresh `docker compose up` the replicas may still be starting). A replica
/// that hangs past its turn may still run its `ALTER` when it wakes; the next replica's may
/// then overlap it. Returns the replicas that have the schema, in order.
async fn apply_shard(
    config: &Config,
    shard: &crate::config::ShardConfig,
) -> Vec<(String, clickhouse::Client)> {
    let mut applied = Vec::new();
    for url in &shard.urls {
        let (url, client, result) = apply_replica(url, config).await;
        if report_replica(&url, config.clickhouse.table_form, result) {
            applied.push((url, client));
        }
    }
    if applied.is_empty() {
        eprintln!(
            "collector: shard {}: no replica has the schema; the collector applies it when one answers",
            shard.name
        );
    }
    applied
}

/// Applies `schema/postgres/` in order; the first failure, named by its file.
async fn apply_postgres(config: &Config) -> Result<(), RunError> {
    let store = cli_store(config)?;
    for (name, sql) in POSTGRES {
        // "already exists, skipping" notices are the normal case of an idempotent migration.
        // `SET LOCAL`: one simple-protocol message runs as one implicit transaction, and the
        // setting ends with it instead of staying on a server connection that a
        // transaction-mode pooler (PgBouncer) then hands to other clients.
        store
            .apply(&format!("SET LOCAL client_min_messages = warning;\n{sql}"))
            .await
            .map_err(|e| RunError::Failed(format!("postgres {name}: {e}")))?;
    }
    Ok(())
}

/// What applying the schema to one replica came to: what was done, or why not and whether the
/// collector can still apply it later (`true`) or trying again cannot help (`false`).
type ReplicaOutcome = Result<crate::clickhouse::schema::Applied, (String, bool)>;

/// Applies the ClickHouse schema to the replica at `url`, tried again every [`RETRY_EVERY`]
/// until it answers or [`REPLICA_TIMEOUT`] has passed.
async fn apply_replica(
    url: &url::Url,
    config: &Config,
) -> (String, clickhouse::Client, ReplicaOutcome) {
    let url = url.as_str().trim_end_matches('/').to_owned();
    let client = crate::clickhouse::client(&url, &config.clickhouse, true);
    let deadline = tokio::time::Instant::now() + REPLICA_TIMEOUT;
    let mut last: Option<String> = None;
    let result = loop {
        let apply = apply_clickhouse(
            &client,
            &config.clickhouse.database,
            config.clickhouse.table_form,
        );
        let failed = match tokio::time::timeout_at(deadline, apply).await {
            Ok(Ok(done)) => break Ok(done),
            // Trying again cannot help: say so at once.
            Ok(Err(SchemaError::NoReplication(text))) => break Err((text, false)),
            Ok(Err(SchemaError::Failed(text))) => text,
            Err(_) => {
                let why = match &last {
                    Some(e) => {
                        format!("no answer within {REPLICA_TIMEOUT:?}; the attempt before: {e}")
                    }
                    None => format!("no answer within {REPLICA_TIMEOUT:?}"),
                };
                break Err((why, true));
            }
        };
        if tokio::time::Instant::now() + RETRY_EVERY >= deadline {
            break Err((failed, true));
        }
        last = Some(failed);
        tokio::time::sleep(RETRY_EVERY).await;
    };
    (url, client, result)
}

/// Says what applying the schema to the replica at `url` came to; whether it has the schema.
fn report_replica(url: &str, form: TableForm, result: ReplicaOutcome) -> bool {
    match result {
        Ok(done) => {
            if done.moved_v1_aside {
                println!("clickhouse {url}: the v1 measurements table moved aside to {V1_TABLE}");
            }
            match done.form {
                Some(found) if found != form => eprintln!(
                    "collector: clickhouse {url}: measurements exists in the {} form, not the {} form that COLLECTOR_CLICKHOUSE_TABLE_FORM asks for; it is kept as it is (the writer works on both)",
                    form_name(found),
                    form_name(form)
                ),
                _ => println!("clickhouse {url}: schema applied ({} form)", form_name(form)),
            }
            true
        }
        Err((e, true)) => {
            eprintln!("collector: clickhouse {url}: not applied ({e}); the collector applies it when the replica answers");
            false
        }
        Err((e, false)) => {
            eprintln!("collector: clickhouse {url}: not applied: {e}");
            false
        }
    }
}

/// Copies a v1 table's rows into v2, once, through one replica (the copy replicates like any
/// insert): every reachable replica writes to v2 now. `missed` replicas did not answer.
async fn copy_v1_rows(
    url: &str,
    client: &clickhouse::Client,
    database: &str,
    missed: usize,
) -> Result<(), RunError> {
    let copied = copy_v1(client, database)
        .await
        .map_err(|e| RunError::Failed(format!("clickhouse {url}: copying {V1_TABLE}: {e} (run migrate again: it copies only what is missing)")))?;
    if copied.months > 0 {
        println!(
            "clickhouse {url}: {V1_TABLE} copied into measurements: {} rows in {} months, {} copied now, {} there already",
            copied.v1_rows, copied.months, copied.copied, copied.already_there
        );
        if missed > 0 {
            eprintln!("collector: {missed} replica(s) did not answer and may still take writes into v1: run migrate again once they are back");
        } else {
            println!("clickhouse: {V1_TABLE} is kept; drop it on every replica once no collector of an earlier release runs (docs/storage.md: moving a v1 table to v2)");
        }
    }
    Ok(())
}

/// The setting that bounds the rows `migrate` reads per chunk while it minimises stored rows
/// (one INSERT and one progress line each).
pub const CHUNK_ROWS_SETTING: &str = "COLLECTOR_MIGRATE_CHUNK_ROWS";

/// Rows per chunk: [`CHUNK_ROWS_SETTING`], 1 to 1,000,000, else
/// [`DEFAULT_CHUNK_ROWS`](crate::clickhouse::minimise::DEFAULT_CHUNK_ROWS).
fn chunk_rows() -> Result<usize, RunError> {
    match std::env::var(CHUNK_ROWS_SETTING) {
        Err(_) => Ok(crate::clickhouse::minimise::DEFAULT_CHUNK_ROWS),
        Ok(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=1_000_000).contains(n))
            .ok_or_else(|| {
                RunError::Usage(format!(
                    "{CHUNK_ROWS_SETTING}={v:?}: a number of rows from 1 to 1000000"
                ))
            }),
    }
}

/// Minimises the rows earlier releases stored (contract v5 §5), shard by shard through the
/// first replica that took the schema (the rewrites replicate like any insert), with each
/// site's settings from PostgreSQL. Fails when a partition still takes rows to change after
/// its checks; partitions are marked done only where every replica of the shard answered
/// (the next run reads the others again). A shard none of whose replicas took the schema was
/// named already and is left to the next run.
async fn minimise_stored_rows(
    config: &Config,
    shards: &[(Option<(String, clickhouse::Client)>, usize)],
    chunk_rows: usize,
) -> Result<(), RunError> {
    use crate::clickhouse::minimise::{minimise_rows, Options};
    let (sites, purged) = sites_from(config).await?;
    let mut left = Vec::new();
    for (first, missed) in shards {
        let Some((url, client)) = first else { continue };
        let opts = Options {
            database: &config.clickhouse.database,
            form: config.clickhouse.table_form,
            chunk_rows,
            sites: &sites,
            mark: *missed == 0,
            url,
            purged: &*purged,
        };
        let started = std::time::Instant::now();
        let done = minimise_rows(client, &opts).await.map_err(|e| {
            RunError::Failed(format!(
                "clickhouse {url}: minimising stored rows: {e} (run migrate again: it goes on where it stopped)"
            ))
        })?;
        let secs = started.elapsed().as_secs_f64();
        println!(
            "clickhouse {url}: stored rows minimised (rules v{}): {} partitions, {} done before, {} rows read, {} rewritten in {secs:.1} s ({:.0} rows/s)",
            crate::clickhouse::minimise::RULES,
            done.partitions,
            done.skipped,
            done.rows_read,
            done.rewritten,
            done.rows_read as f64 / secs.max(1e-3)
        );
        if *missed > 0 {
            eprintln!("collector: clickhouse {url}: {missed} replica(s) of its shard did not answer: the rows are minimised through this one, and the next migrate checks again what they may hold");
        }
        if !done.unsettled.is_empty() {
            left.push(format!(
                "{url}: {} still take rows to minimise (a collector of an earlier release still writing?)",
                done.unsettled.join(", ")
            ));
        }
    }
    if left.is_empty() {
        return Ok(());
    }
    Err(RunError::Failed(format!(
        "stored rows not all minimised yet; run migrate again: {}",
        left.join("; ")
    )))
}

/// What each site keeps of a URL, read once from the settings store, and a reader of the
/// purged sites' keys that asks it again at each call ([`Options::purged`](crate::clickhouse::minimise::Options::purged)).
async fn sites_from(
    config: &Config,
) -> Result<
    (
        crate::measurement::stored::SiteRules,
        Box<crate::clickhouse::minimise::PurgedSites>,
    ),
    RunError,
> {
    use crate::measurement::stored::{Keeps, SiteRules};
    let store = std::sync::Arc::new(cli_store(config)?);
    let sites = store
        .fetch_all()
        .await
        .map_err(|e| RunError::Failed(format!("reading the sites to minimise their rows: {e}")))?;
    let sites = SiteRules::new(sites.into_iter().map(|s| {
        let keeps = Keeps {
            keep_query: s.keep_query,
            origins: s.allowed_origins,
        };
        (s.key, keeps, s.purged)
    }));
    let purged = move || {
        let store = store.clone();
        Box::pin(async move {
            let sites = store.fetch_all().await?;
            Ok(sites
                .into_iter()
                .filter(|s| s.purged)
                .map(|s| s.key)
                .collect())
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>
    };
    Ok((sites, Box::new(purged)))
}

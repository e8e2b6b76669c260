//! Rows an earlier release stored, held to today's rules (contract v5 §5): `collector migrate`
//! reads every partition of `measurements` and of the `measurements_v1` copy, minimises each
//! row in Rust as intake minimises a measurement now
//! ([`crate::measurement::stored::minimise_row`], with its site's `--keep-query` and origins
//! from PostgreSQL), and inserts the rows that changed
//! again, so that the `ReplacingMergeTree` replaces the old version by the new one.
//!
//! Why so, and why it is safe while collectors write (docs/privacy.md, "Data stored before v5"):
//!
//! - **Replaced, never deleted.** A rewritten row keeps its sorting key (`site`, the day of
//!   `page_view_at`, `id`; `id` alone in v1) and its partition: only strings change. The table
//!   has no version column, so of the rows of one key the one inserted last is kept (under
//!   `FINAL`, and when the parts merge): the rewrite. Nothing is deleted, so a row a collector
//!   inserts meanwhile is never lost, and one key stays one row under `FINAL`, so nothing is
//!   doubled. A mutation (`ALTER TABLE … UPDATE`) cannot run this module's masking (Rust).
//! - **`FINAL`, partition by partition.** The version each key shows now is the one minimised.
//!   A resend a collector inserts between the read and the rewrite loses to the rewritten
//!   earlier send (both are one page view: one row stays, which send was never promised). The rows are streamed (RowBinary),
//!   [`Options::chunk_rows`] at a time: one INSERT and one progress line on stderr per chunk.
//! - **Inserts without deduplication** (`insert_deduplicate = 0`): a block equal to one
//!   inserted before (by a run that was killed, the same rows minimised the same way) must
//!   not be dropped as a retry; a row inserted twice folds by its key.
//! - **Marked when done.** A table `minimised` (schema/clickhouse/003_minimised.sql; replicated
//!   like `measurements`, so a shard's replicas share it) holds, per table and partition, the
//!   rules' version ([`RULES`]) and the partition's highest block number when it was found
//!   clean. Every insert takes a higher block number (per partition, from ZooKeeper on a
//!   replicated table; a merge or a mutation keeps the numbers of its parts), so a partition
//!   whose highest number is the marked one holds nothing new: skipped. One that took inserts
//!   since is checked only in the parts holding a number above the mark (without `FINAL`: any
//!   version a rule would change is found, and its key rewritten from its `FINAL` version).
//! - **What came in during the scan.** After its scan a partition's parts above the highest
//!   block number seen before it are checked the same way (they hold the rewrites and what
//!   collectors inserted meanwhile), up to [`SETTLE_ROUNDS`] times, until none holds a row to
//!   change: only then is the partition marked. A partition that still takes rows to change
//!   (a collector of an earlier release still writing) is named and left unmarked.
//! - **Resumable.** A run stopped midway left its rewrites in place and marked only finished
//!   partitions; the next run skips those, reads the others again and rewrites only what is
//!   not minimised yet.
//! - **Old versions on disk.** The versions a rewrite replaced stay in their parts until
//!   ClickHouse merges them; `OPTIMIZE … PARTITION … FINAL` is asked for each partition that
//!   was rewritten, so that they go now.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use crate::config::TableForm;
use crate::measurement::stored::SiteRules;
use crate::measurement::{layouts, Measurement, RowDecodeError, COLUMNS};
use crate::settings::StoreError;

/// Why minimising one server's rows stopped (what was rewritten before stays: run it again).
#[derive(Debug, thiserror::Error)]
pub enum MinimiseError {
    /// A query refused or unanswered (ClickHouse's error chain).
    #[error("{}", crate::logging::chain(.0))]
    ClickHouse(#[from] clickhouse::error::Error),
    /// The table of marks could not be created (`database.minimised`).
    #[error("creating {table}: {}", crate::logging::chain(.source))]
    CreateMarks {
        /// `database.minimised`.
        table: String,
        /// ClickHouse's error.
        source: clickhouse::error::Error,
    },
    /// A partition whose id is not a month: not a layout `migrate` knows.
    #[error(
        "{table} partition {partition:?} is not a month (YYYYMM): not the layout migrate knows"
    )]
    NotAMonth {
        /// The table.
        table: String,
        /// The partition's id.
        partition: String,
    },
    /// A finished partition could not be marked.
    #[error("marking {table} {partition}: {}", crate::logging::chain(.source))]
    Mark {
        /// The table.
        table: String,
        /// The partition's id.
        partition: String,
        /// ClickHouse's error.
        source: clickhouse::error::Error,
    },
    /// Reading the rows of `label` (`table partition`) failed.
    #[error("reading {label}: {source}")]
    Reading {
        /// `table partition`.
        label: String,
        /// Why.
        source: Box<MinimiseError>,
    },
    /// Inserting the minimised rows of `label` (`table partition`) failed.
    #[error("rewriting {label}: {source}")]
    Rewriting {
        /// `table partition`.
        label: String,
        /// Why.
        source: Box<MinimiseError>,
    },
    /// Reading the parts of `table` written since its mark failed.
    #[error("reading the new parts of {table}: {source}")]
    ReadingNewParts {
        /// The table.
        table: String,
        /// Why.
        source: Box<MinimiseError>,
    },
    /// The answer ended within a row.
    #[error("a row cut off: {0}")]
    CutOff(RowDecodeError),
    /// The purged sites could not be read from the settings store ([`Options::purged`]).
    #[error("reading the purged sites: {0}")]
    Purged(#[from] StoreError),
}

/// The version of the minimisation rules the marks are for: contract v5's §2. A release that
/// changes what the rules remove raises it, and `migrate` then reads every partition again.
pub const RULES: u32 = 5;

/// The table of marks.
pub const MARKS: &str = "minimised";

/// Rows per chunk (one INSERT, one progress line) unless `COLLECTOR_MIGRATE_CHUNK_ROWS` says.
pub const DEFAULT_CHUNK_ROWS: usize = 10_000;

/// How many times a partition's new parts are checked after its scan before it is left
/// unmarked as still taking rows to change.
pub const SETTLE_ROUNDS: usize = 4;

/// The DDL of [`MARKS`], with `{database}` and `{engine}` to fill in.
const MARKS_DDL: &str = include_str!("../../../../schema/clickhouse/003_minimised.sql");

/// Ids per `IN (…)` list when keys are rewritten by id.
const IDS_PER_QUERY: usize = 1_000;

/// A table whose rows are minimised: its name, how many of the field table's columns it has
/// (a prefix, in order) and the expression it is partitioned by.
struct Stored {
    name: &'static str,
    columns: usize,
    partition_by: &'static str,
}

/// The tables, in the order they are minimised: the v1 copy first (what `copy_v1` takes from).
fn tables() -> [Stored; 2] {
    [
        Stored {
            name: super::schema::V1_TABLE,
            columns: layouts::columns_in(2).expect("the table knows its own layouts"),
            partition_by: "toYYYYMM(received_at)",
        },
        Stored {
            name: "measurements",
            columns: COLUMNS.len(),
            partition_by: "toYYYYMM(page_view_at)",
        },
    ]
}

/// How one server's rows are minimised.
pub struct Options<'a> {
    /// `COLLECTOR_CLICKHOUSE_DATABASE`.
    pub database: &'a str,
    /// The configured form of `measurements`; the marks table takes the form the table has.
    pub form: TableForm,
    /// Rows read per chunk, at least 1.
    pub chunk_rows: usize,
    /// The sites' settings: what each keeps of a URL.
    pub sites: &'a SiteRules,
    /// Whether finished partitions may be marked: every replica of the shard answered (one
    /// that was down may hold parts this one has not fetched yet).
    pub mark: bool,
    /// The server, as it is named in progress lines.
    pub url: &'a str,
    /// The keys of the sites purged now (`collector sites purge`), asked before every INSERT:
    /// their rows are never written again.
    pub purged: &'a PurgedSites,
}

/// Reads the keys of the purged sites (from the settings store); errors say why not.
pub type PurgedSites = dyn Fn() -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<HashSet<String>, StoreError>> + Send>,
    > + Sync;

/// What minimising one server's rows did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Partitions looked at.
    pub partitions: usize,
    /// Partitions marked before and untouched since: not read.
    pub skipped: usize,
    /// Rows read.
    pub rows_read: u64,
    /// Rows inserted again, minimised.
    pub rewritten: u64,
    /// `table partition` of each partition that still took rows to change after
    /// [`SETTLE_ROUNDS`] checks: not done.
    pub unsettled: Vec<String>,
    /// Partitions done but not marked (not every replica answered, or this one had not
    /// fetched every part): the next run reads them again.
    pub unmarked: usize,
}

/// One server's connection and what is needed for every query.
struct Ctx<'a> {
    client: &'a clickhouse::Client,
    opts: &'a Options<'a>,
    /// Settings for the INSERTs: no deduplication, and synchronous where the server knows
    /// `async_insert` (current releases turn it on by default).
    insert_settings: Vec<(&'static str, &'static str)>,
}

/// Minimises every stored row of `database` on the server `client` talks to (see the module
/// doc), with a progress line on stderr per chunk and per partition. Errors name the table and
/// partition and carry ClickHouse's message; what was rewritten before stays (run it again).
pub async fn minimise_rows(
    client: &clickhouse::Client,
    opts: &Options<'_>,
) -> Result<Summary, MinimiseError> {
    let knows_async = client
        .query("SELECT count() FROM system.settings WHERE name = 'async_insert'")
        .fetch_one::<u64>()
        .await?
        > 0;
    let mut insert_settings = vec![("insert_deduplicate", "0")];
    if knows_async {
        insert_settings.push(("async_insert", "0"));
    }
    let ctx = Ctx {
        client,
        opts,
        insert_settings,
    };
    create_marks(&ctx).await?;
    let mut summary = Summary::default();
    for table in tables() {
        let found = super::schema::layout(client, opts.database, table.name).await?;
        if found != super::schema::Layout::Missing {
            minimise_table(&ctx, &table, &mut summary).await?;
        }
    }
    Ok(summary)
}

/// Creates [`MARKS`] in the form `measurements` has on this server (which may be the other
/// one than configured: `migrate` keeps a table as it found it), else the configured one.
async fn create_marks(ctx: &Ctx<'_>) -> Result<(), MinimiseError> {
    let db = ctx.opts.database;
    let found: Vec<String> = ctx
        .client
        .query("SELECT engine FROM system.tables WHERE database = ? AND name = 'measurements'")
        .bind(db)
        .fetch_all()
        .await?;
    let form = match found.first() {
        Some(engine) if engine.starts_with("Replicated") => TableForm::Replicated,
        Some(_) => TableForm::Single,
        None => ctx.opts.form,
    };
    let engine = match form {
        TableForm::Replicated => format!(
            "ReplicatedReplacingMergeTree('/clickhouse/tables/{{shard}}/{db}/{MARKS}', '{{replica}}', done_at)"
        ),
        TableForm::Single => "ReplacingMergeTree(done_at)".to_owned(),
    };
    let sql = MARKS_DDL
        .replace("{database}", db)
        .replace("{engine}", &engine);
    ctx.client
        .query(sql.trim())
        .execute()
        .await
        .map_err(|source| MinimiseError::CreateMarks {
            table: format!("{db}.{MARKS}"),
            source,
        })
}

#[derive(Debug, serde::Deserialize, clickhouse::Row)]
struct Partition {
    partition_id: String,
    max_block: i64,
    rows: u64,
}

#[derive(Debug, serde::Deserialize, clickhouse::Row)]
struct Mark {
    partition_id: String,
    max_block: i64,
}

/// The partitions of `table` with their highest block number and rows, from its active parts.
async fn partitions(ctx: &Ctx<'_>, table: &str) -> Result<Vec<Partition>, MinimiseError> {
    ctx.client
        .query(
            "SELECT partition_id, toInt64(max(max_block_number)) AS max_block, \
             toUInt64(sum(rows)) AS rows FROM system.parts \
             WHERE database = ? AND table = ? AND active GROUP BY partition_id ORDER BY partition_id",
        )
        .bind(ctx.opts.database)
        .bind(table)
        .fetch_all()
        .await
        .map_err(MinimiseError::from)
}

/// The highest block number of one partition of `table` now (0 when it has no part).
async fn max_block(ctx: &Ctx<'_>, table: &str, partition: &str) -> Result<i64, MinimiseError> {
    let found = partitions(ctx, table).await?;
    Ok(found
        .iter()
        .find(|p| p.partition_id == partition)
        .map_or(0, |p| p.max_block))
}

/// How long [`caught_up`] waits for a replica that is a little behind (its own and other
/// collectors' inserts of the last moments).
const CATCH_UP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether the replica has every part of `table` the shard's log names (not replicated: yes):
/// its replication log pulled and no part waiting to be fetched, asked again for up to
/// [`CATCH_UP_WAIT`]. Said on stderr when it is not.
async fn caught_up(ctx: &Ctx<'_>, table: &str) -> Result<bool, MinimiseError> {
    let deadline = Instant::now() + CATCH_UP_WAIT;
    loop {
        let behind = ctx
            .client
            .query(
                "SELECT count() FROM system.replicas WHERE database = ? AND table = ? \
                 AND (inserts_in_queue > 0 OR (log_max_index > 0 AND log_pointer <= log_max_index))",
            )
            .bind(ctx.opts.database)
            .bind(table)
            .fetch_one::<u64>()
            .await?;
        if behind == 0 {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            eprintln!(
                "clickhouse {}: {table}: this replica has not fetched every part yet: its partitions are minimised but not marked (the next run reads them again)",
                ctx.opts.url
            );
            return Ok(false);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Minimises every partition of `table` not marked as done with what it holds now.
async fn minimise_table(
    ctx: &Ctx<'_>,
    table: &Stored,
    summary: &mut Summary,
) -> Result<(), MinimiseError> {
    let marks: Vec<Mark> = ctx
        .client
        .query(&format!(
            "SELECT partition_id, max_block FROM {}.{MARKS} FINAL WHERE table_name = ? AND rules = ?",
            ctx.opts.database
        ))
        .bind(table.name)
        .bind(RULES)
        .fetch_all()
        .await?;
    let marks: HashMap<String, i64> = marks
        .into_iter()
        .map(|m| (m.partition_id, m.max_block))
        .collect();
    let may_mark = ctx.opts.mark && caught_up(ctx, table.name).await?;
    let url = ctx.opts.url;
    for p in partitions(ctx, table.name).await? {
        summary.partitions += 1;
        let marked = marks.get(&p.partition_id).copied();
        if marked == Some(p.max_block) {
            summary.skipped += 1;
            eprintln!(
                "clickhouse {url}: {} {}: minimised already ({} rows, nothing written since)",
                table.name, p.partition_id, p.rows
            );
            continue;
        }
        let before = (summary.rows_read, summary.rewritten);
        match minimise_partition(ctx, table, &p, marked, summary).await? {
            Some(settled) if may_mark => {
                let done = (summary.rows_read - before.0, summary.rewritten - before.1);
                mark(ctx, table, &p.partition_id, settled, done).await?
            }
            Some(_) => summary.unmarked += 1,
            None => summary
                .unsettled
                .push(format!("{} {}", table.name, p.partition_id)),
        }
    }
    Ok(())
}

/// Minimises one partition: in whole (under `FINAL`) when it was never marked, else only the
/// keys of the rows its new parts hold that a rule changes; then until its new parts hold none
/// ([`SETTLE_ROUNDS`]). The highest block number up to which it is clean, or `None` when it
/// did not settle.
async fn minimise_partition(
    ctx: &Ctx<'_>,
    table: &Stored,
    p: &Partition,
    marked: Option<i64>,
    summary: &mut Summary,
) -> Result<Option<i64>, MinimiseError> {
    let month: u32 = p
        .partition_id
        .parse()
        .map_err(|_| MinimiseError::NotAMonth {
            table: table.name.to_owned(),
            partition: p.partition_id.clone(),
        })?;
    let in_partition = format!("{} = {month}", table.partition_by);
    let label = format!("{} {}", table.name, p.partition_id);
    let started = Instant::now();
    let (read_before, rewritten_before) = (summary.rows_read, summary.rewritten);
    let mut from = match marked {
        Some(b) => b,
        None => {
            let select = format!("FINAL WHERE {in_partition}");
            rewrite(ctx, table, &select, &label, summary).await?;
            p.max_block
        }
    };
    let mut settled = None;
    for _ in 0..SETTLE_ROUNDS {
        let now = max_block(ctx, table.name, &p.partition_id).await?;
        if now == from {
            settled = Some(now);
            break;
        }
        let ids = changed_ids(ctx, table, &in_partition, from, summary).await?;
        if ids.is_empty() {
            settled = Some(now);
            break;
        }
        for group in ids.chunks(IDS_PER_QUERY) {
            let list = group
                .iter()
                .map(|id| format!("'{id}'"))
                .collect::<Vec<_>>()
                .join(",");
            let select = format!("FINAL WHERE {in_partition} AND id IN ({list})");
            rewrite(ctx, table, &select, &label, summary).await?;
        }
        from = now;
    }
    let rewritten = summary.rewritten - rewritten_before;
    if rewritten > 0 {
        optimize(ctx, table, &p.partition_id).await;
    }
    let read = summary.rows_read - read_before;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "clickhouse {}: {label}: {} ({read} rows read, {rewritten} rewritten, {secs:.1} s, {:.0} rows/s)",
        ctx.opts.url,
        if settled.is_some() {
            "done"
        } else {
            "still taking rows to minimise"
        },
        read as f64 / secs.max(1e-3)
    );
    Ok(settled)
}

/// Records that `table`'s `partition` is clean up to block number `settled`, with the rows
/// this run read and rewrote in it (`done`).
async fn mark(
    ctx: &Ctx<'_>,
    table: &Stored,
    partition: &str,
    settled: i64,
    done: (u64, u64),
) -> Result<(), MinimiseError> {
    ctx.client
        .query(&format!(
            "INSERT INTO {}.{MARKS} (table_name, partition_id, rules, max_block, rows_read, rewritten, done_at) \
             VALUES (?, ?, ?, ?, ?, ?, now())",
            ctx.opts.database
        ))
        .bind(table.name)
        .bind(partition)
        .bind(RULES)
        .bind(settled)
        .bind(done.0)
        .bind(done.1)
        .execute()
        .await
        .map_err(|source| MinimiseError::Mark {
            table: table.name.to_owned(),
            partition: partition.to_owned(),
            source,
        })
}

/// Asks ClickHouse to merge a rewritten partition now, so that the versions replaced leave the
/// disk; a refusal (a busy server, a replica that is not the leader on 18.16) is said and left
/// to ClickHouse's own merges.
async fn optimize(ctx: &Ctx<'_>, table: &Stored, partition: &str) {
    let sql = format!(
        "OPTIMIZE TABLE {}.{} PARTITION {partition} FINAL",
        ctx.opts.database, table.name
    );
    if let Err(e) = ctx.client.query(&sql).execute().await {
        eprintln!(
            "clickhouse {}: {} {partition}: not merged now ({}); the versions replaced go when ClickHouse merges the parts",
            ctx.opts.url,
            table.name,
            crate::logging::chain(&e)
        );
    }
}

/// The columns of `table`, for a SELECT or an INSERT.
fn column_list(table: &Stored) -> String {
    COLUMNS[..table.columns].join(", ")
}

/// Streams the rows of `table` that `rest` selects (`FINAL WHERE …`) as RowBinary, minimises
/// each and inserts those that changed, [`Options::chunk_rows`] at a time, with a progress line
/// per chunk.
async fn rewrite(
    ctx: &Ctx<'_>,
    table: &Stored,
    rest: &str,
    label: &str,
    summary: &mut Summary,
) -> Result<(), MinimiseError> {
    let sql = format!(
        "SELECT {} FROM {}.{} {rest}",
        column_list(table),
        ctx.opts.database,
        table.name
    );
    let mut rows = RowStream::new(ctx.client.query(&sql).fetch_bytes("RowBinary")?);
    // Each changed row's site and bytes.
    let (mut batch, mut in_chunk) = (Vec::<(String, Vec<u8>)>::new(), 0usize);
    loop {
        let row = rows
            .next(table.columns)
            .await
            .map_err(|e| MinimiseError::Reading {
                label: label.to_owned(),
                source: Box::new(e),
            })?;
        let end = row.is_none();
        if let Some((raw, m)) = row {
            in_chunk += 1;
            let site = m.site.to_string();
            if let Some(bytes) = minimised(ctx.opts.sites, m, &raw, table.columns) {
                batch.push((site, bytes));
            }
        }
        if in_chunk > 0 && (in_chunk >= ctx.opts.chunk_rows || end) {
            let changed = insert_unpurged(ctx, table, std::mem::take(&mut batch))
                .await
                .map_err(|e| MinimiseError::Rewriting {
                    label: label.to_owned(),
                    source: Box::new(e),
                })?;
            summary.rows_read += in_chunk as u64;
            summary.rewritten += changed;
            eprintln!(
                "clickhouse {}: {label}: {in_chunk} rows read, {changed} rewritten ({} read in all)",
                ctx.opts.url, summary.rows_read
            );
            in_chunk = 0;
        }
        if end {
            return Ok(());
        }
    }
}

/// The ids of the rows, in the parts of `table` holding a block number above `above` within
/// `in_partition`, that a rule changes (any version of a key, not only its `FINAL` one).
async fn changed_ids(
    ctx: &Ctx<'_>,
    table: &Stored,
    in_partition: &str,
    above: i64,
    summary: &mut Summary,
) -> Result<Vec<uuid::Uuid>, MinimiseError> {
    // A part is named PARTITION_MINBLOCK_MAXBLOCK_LEVEL[_MUTATION] on 18.16 and current
    // releases alike.
    let sql = format!(
        "SELECT {} FROM {}.{} WHERE {in_partition} \
         AND toInt64(splitByChar('_', _part)[3]) > {above}",
        column_list(table),
        ctx.opts.database,
        table.name
    );
    let mut rows = RowStream::new(ctx.client.query(&sql).fetch_bytes("RowBinary")?);
    let mut ids = HashSet::new();
    while let Some((raw, m)) =
        rows.next(table.columns)
            .await
            .map_err(|e| MinimiseError::ReadingNewParts {
                table: table.name.to_owned(),
                source: Box::new(e),
            })?
    {
        summary.rows_read += 1;
        let id = m.id;
        if minimised(ctx.opts.sites, m, &raw, table.columns).is_some() {
            ids.insert(id);
        }
    }
    Ok(ids.into_iter().collect())
}

/// `m` (whose RowBinary encoding of its first `columns` columns is `raw`) minimised by its
/// site's rules: the encoding of those columns when it changed, `None` when it did not.
fn minimised(
    sites: &SiteRules,
    mut m: Measurement<'static>,
    raw: &[u8],
    columns: usize,
) -> Option<Vec<u8>> {
    sites.minimise(&mut m);
    let mut bytes = Vec::with_capacity(raw.len());
    m.encode(&mut bytes);
    if columns < COLUMNS.len() {
        // RowBinary is one column after the other: the first columns' bytes are a prefix.
        let mut rest = &bytes[..];
        Measurement::decode_prefix(&mut rest, columns).ok()?;
        let prefix = bytes.len() - rest.len();
        bytes.truncate(prefix);
    }
    (bytes != raw).then_some(bytes)
}

/// Inserts the rows of `batch` (each its site and RowBinary bytes) but those of a site purged
/// by now, read from the settings store just before ([`Options::purged`]): a row read before a
/// `sites purge` deleted its site's rows must not come back after it. Every insert follows its
/// check by far less than the settings' TTL that a purge waits before it deletes, so a purge
/// marked after the check deletes what this inserts. How many rows were inserted.
async fn insert_unpurged(
    ctx: &Ctx<'_>,
    table: &Stored,
    batch: Vec<(String, Vec<u8>)>,
) -> Result<u64, MinimiseError> {
    if batch.is_empty() {
        return Ok(0);
    }
    let purged = (ctx.opts.purged)().await?;
    let mut rows = Vec::new();
    let mut n = 0;
    for (site, bytes) in batch {
        if !purged.contains(&site) {
            rows.extend_from_slice(&bytes);
            n += 1;
        }
    }
    insert(ctx, table, rows).await?;
    Ok(n)
}

/// Inserts RowBinary rows of `table`'s columns; nothing when `rows` is empty.
async fn insert(ctx: &Ctx<'_>, table: &Stored, rows: Vec<u8>) -> Result<(), MinimiseError> {
    if rows.is_empty() {
        return Ok(());
    }
    let sql = format!(
        "INSERT INTO {}.{} ({}) FORMAT RowBinary",
        ctx.opts.database,
        table.name,
        column_list(table)
    );
    let mut insert = ctx.client.insert_formatted_with(sql);
    for (name, value) in &ctx.insert_settings {
        insert = insert.with_setting(*name, *value);
    }
    insert.send(rows.into()).await?;
    Ok(insert.end().await?)
}

/// Rows of a RowBinary answer, one at a time, each with its bytes.
struct RowStream {
    cursor: clickhouse::query::BytesCursor,
    pending: Vec<u8>,
    at: usize,
    ended: bool,
}

impl RowStream {
    fn new(cursor: clickhouse::query::BytesCursor) -> RowStream {
        RowStream {
            cursor,
            pending: Vec::new(),
            at: 0,
            ended: false,
        }
    }

    /// The next row of `columns` columns (the field table's first), with its bytes; `None`
    /// at the end of the answer. A row cut off at the end is an error.
    async fn next(
        &mut self,
        columns: usize,
    ) -> Result<Option<(Vec<u8>, Measurement<'static>)>, MinimiseError> {
        loop {
            let mut input = &self.pending[self.at..];
            if !input.is_empty() {
                let before = input.len();
                match Measurement::decode_prefix(&mut input, columns) {
                    Ok(m) => {
                        let used = before - input.len();
                        let raw = self.pending[self.at..self.at + used].to_vec();
                        self.at += used;
                        return Ok(Some((raw, m)));
                    }
                    Err(e) if self.ended => return Err(MinimiseError::CutOff(e)),
                    Err(_) => {}
                }
            } else if self.ended {
                return Ok(None);
            }
            self.pending.drain(..self.at);
            self.at = 0;
            match self.cursor.next().await? {
                Some(chunk) => self.pending.extend_from_slice(&chunk),
                None => self.ended = true,
            }
        }
    }
}

#[cfg(test)]
mod tests;

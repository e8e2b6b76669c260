//! The ClickHouse schema: the statements of `schema/clickhouse/`, their two table forms, and
//! applying them to one server (used by `collector migrate` for every replica and by the
//! prober for a replica found without the table), with the move of a v1 table to v2.
//!
//! Idempotent and safe to run on every start: every `CREATE` is `IF NOT EXISTS`, and an
//! `ALTER TABLE ... ADD COLUMN` (for a table created by an older release) counts as applied
//! when ClickHouse answers that the column already exists, because ClickHouse 18.16 does not
//! know `ADD COLUMN IF NOT EXISTS` (its parser fails at `EXISTS`; measured on Debian's
//! 18.16.1). On a replicated table the `ALTER` reaches every replica through ZooKeeper, so
//! the next replica usually answers "already exists" too. The
//! ClickHouse files contain the placeholder `{database}`, replaced with
//! `COLLECTOR_CLICKHOUSE_DATABASE` (a checked identifier) before sending; `{shard}` and
//! `{replica}` are server macros and are left to ClickHouse, so the same DDL runs unchanged on
//! every replica.
//!
//! **Two table forms** ([`TableForm`](crate::config::TableForm), `COLLECTOR_CLICKHOUSE_TABLE_FORM`): the files hold the
//! replicated form; the single-server form is the same statement with [`REPLICATED_ENGINE`]
//! replaced by `ReplacingMergeTree` and, where the server knows it (22.x and later),
//! `non_replicated_deduplication_window` = [`SINGLE_DEDUP_WINDOW`] added to its `SETTINGS`.

use crate::config::TableForm;

/// ClickHouse schema files, in order; one statement each: the database, then v2 of
/// `measurements` (the layout of contract §3 v3: site first in the sorting key).
pub const CLICKHOUSE: &[(&str, &str)] = &[
    (
        "001_database.sql",
        include_str!("../../../schema/clickhouse/001_database.sql"),
    ),
    (
        "002_measurements.sql",
        include_str!("../../../schema/clickhouse/002_measurements.sql"),
    ),
];

/// The tables of the CrUX view's daily roll-up (`crux_days`, `crux_day_marks`:
/// [`crate::report::crux_days`]), one statement each. One per server in both table forms: a
/// cache of `measurements` that each server computes from its own rows, so not replicated.
pub const CRUX_ROLLUP: &[(&str, &str)] = &[
    (
        "004_crux_days.sql",
        include_str!("../../../schema/clickhouse/004_crux_days.sql"),
    ),
    (
        "005_crux_day_marks.sql",
        include_str!("../../../schema/clickhouse/005_crux_day_marks.sql"),
    ),
];

/// The engine clause of `002_measurements.sql` (exactly once in it), which the single-server
/// form replaces.
pub const REPLICATED_ENGINE: &str =
    "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/measurements_v2', '{replica}')";

/// How many recent inserts' tokens a single-server table remembers
/// (`non_replicated_deduplication_window`, in blocks: one per batch here). The replicated
/// form's `replicated_deduplication_window` defaults to 1000 on current releases (100 before
/// 23.x): a batch resent after a restart is far within either.
pub const SINGLE_DEDUP_WINDOW: u32 = 1000;

/// The MergeTree setting that makes a non-replicated table deduplicate inserts by token
/// (ClickHouse 20.x and later; default 0: no deduplication).
pub const SINGLE_DEDUP_SETTING: &str = "non_replicated_deduplication_window";

/// v1 of `measurements` (sorted by `id` alone), as releases before v2 created it: kept for the
/// tests of the move to v2 and for reference; never applied by `migrate`.
pub const V1_TABLE_DDL: &str = include_str!("../../../schema/clickhouse/v1/measurements.sql");

/// The `sample_rate` column that v1 tables of the oldest releases lack, added before such a
/// table is moved aside so that its rows copy in the one v1 layout.
const V1_SAMPLE_RATE: &str = include_str!("../../../schema/clickhouse/v1/sample_rate.sql");

/// The name a v1 `measurements` table is moved to when v2 takes its place. It is kept, and
/// still replicated, until the operator drops it (docs/storage.md, "Moving a v1 table to v2").
pub const V1_TABLE: &str = "measurements_v1";

/// A column that v2 has and v1 lacks: how a v1 table is told apart.
const V2_COLUMN: &str = "page_view_at";

/// ClickHouse 18.16 creates `LowCardinality` columns only with this setting (it was
/// experimental then). Current releases no longer know it and refuse a query that sets it
/// (26.9: `Code: 115 ... Unknown setting 'allow_experimental_low_cardinality_type'`), so it
/// is set only where `system.settings` lists it.
pub(crate) const LOW_CARDINALITY: (&str, &str) = ("allow_experimental_low_cardinality_type", "1");

/// Whether the server knows [`LOW_CARDINALITY`]'s setting.
pub(crate) async fn knows_low_cardinality_setting(
    client: &clickhouse::Client,
) -> Result<bool, clickhouse::error::Error> {
    let n = client
        .query("SELECT count() FROM system.settings WHERE name = ?")
        .bind(LOW_CARDINALITY.0)
        .fetch_one::<u64>()
        .await?;
    Ok(n > 0)
}

/// What `ADD COLUMN` answers for a column that is there, with "column with this name already
/// exists": ILLEGAL_COLUMN (44) on 18.16, DUPLICATE_COLUMN (15) on current releases (measured
/// on 26.9.2.1; codes from `src/Common/ErrorCodes.cpp`).
const COLUMN_EXISTS_CODES: [u32; 2] = [44, 15];

/// Whether a failed statement was an `ADD COLUMN` whose column exists already: applied.
fn already_applied(sql: &str, error: &clickhouse::error::Error) -> bool {
    let text = error.to_string();
    sql.contains(" ADD COLUMN ")
        && super::errors::exception_code(&text).is_some_and(|c| COLUMN_EXISTS_CODES.contains(&c))
        && text.contains("already exists")
}

/// A schema file's statement for `database`.
fn statement(sql: &str, database: &str) -> String {
    sql.replace("{database}", database)
        .trim()
        .trim_end_matches(';')
        .to_owned()
}

/// The ClickHouse statements for `database` in the replicated form, in order.
pub fn clickhouse_statements(database: &str) -> Vec<String> {
    CLICKHOUSE
        .iter()
        .map(|(_, sql)| statement(sql, database))
        .collect()
}

/// The `CREATE TABLE` of `measurements` for `database` in `form`; `dedup_window`: add the
/// single-server form's deduplication window (the server knows [`SINGLE_DEDUP_SETTING`]).
pub fn measurements_statement(database: &str, form: TableForm, dedup_window: bool) -> String {
    let sql = statement(CLICKHOUSE[1].1, database);
    match form {
        TableForm::Replicated => sql,
        TableForm::Single => {
            let engine = REPLICATED_ENGINE.replace("{database}", database);
            let mut sql = sql.replace(&engine, "ReplacingMergeTree");
            if dedup_window {
                sql.push_str(&format!(", {SINGLE_DEDUP_SETTING} = {SINGLE_DEDUP_WINDOW}"));
            }
            sql
        }
    }
}

/// The layout of the field table whose columns v2 of the table was first made with; every
/// column after them (the attribution of contract v3, and any added since) is added to a table
/// of an earlier release by [`added_column_statements`].
pub const TABLE_V2_LAYOUT: u16 = 3;

/// `ALTER TABLE ... ADD COLUMN` of each column after those of [`TABLE_V2_LAYOUT`], for a
/// `measurements` an earlier release created; the column list of `002_measurements.sql`,
/// which a new table gets, is the same (a unit test checks the file against the row).
pub fn added_column_statements(database: &str) -> Vec<String> {
    let first = crate::measurement::layouts::columns_in(TABLE_V2_LAYOUT)
        .expect("the table knows its own layouts");
    crate::measurement::columns()[first..]
        .iter()
        .map(|(name, ty)| format!("ALTER TABLE {database}.measurements ADD COLUMN {name} {ty}"))
        .collect()
}

/// Those of [`added_column_statements`] whose column is not among `present` (the names of
/// the table's columns).
fn missing_column_statements(database: &str, present: &[String]) -> Vec<String> {
    added_column_statements(database)
        .into_iter()
        .filter(|sql| {
            !present
                .iter()
                .any(|c| sql.contains(&format!(" ADD COLUMN {c} ")))
        })
        .collect()
}

/// Whether the server knows MergeTree setting `name`.
async fn knows_merge_tree_setting(
    client: &clickhouse::Client,
    name: &str,
) -> Result<bool, clickhouse::error::Error> {
    let n = client
        .query("SELECT count() FROM system.merge_tree_settings WHERE name = ?")
        .bind(name)
        .fetch_one::<u64>()
        .await?;
    Ok(n > 0)
}

/// Why the replicated form cannot be created on this server, when its configuration says so:
/// no `{shard}` or `{replica}` macro. `None` when both are there (or it cannot tell).
async fn replication_missing(client: &clickhouse::Client) -> Option<String> {
    let n = client
        .query("SELECT count() FROM system.macros WHERE macro IN ('shard', 'replica')")
        .fetch_one::<u64>()
        .await
        .ok()?;
    (n < 2).then(|| {
        "this server has no {shard} and {replica} macros, so no replication is configured: \
         for one server without ZooKeeper or Keeper set COLLECTOR_CLICKHOUSE_TABLE_FORM=single"
            .to_owned()
    })
}

/// The engine of `database.measurements` (`system.tables.engine`), if the table exists.
async fn engine_of(
    client: &clickhouse::Client,
    database: &str,
) -> Result<Option<String>, clickhouse::error::Error> {
    let engines = client
        .query("SELECT engine FROM system.tables WHERE database = ? AND name = 'measurements'")
        .bind(database)
        .fetch_all::<String>()
        .await?;
    Ok(engines.into_iter().next())
}

/// The layout of a table found on a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// No such table.
    Missing,
    /// v1: sorted by `id` alone, without `page_view_at`.
    V1,
    /// v2: the current layout.
    V2,
}

#[derive(Debug, serde::Deserialize, clickhouse::Row)]
struct Found {
    tables: u64,
    v2_columns: u64,
}

/// The layout of `database.table` on the replica `client` talks to.
pub async fn layout(
    client: &clickhouse::Client,
    database: &str,
    table: &str,
) -> Result<Layout, clickhouse::error::Error> {
    let found: Found = client
        .query(
            // ifNull: current releases type a scalar subquery Nullable (see the prober's
            // INFO_QUERY), and this client reads without type validation.
            "SELECT toUInt64(ifNull((SELECT count() FROM system.tables WHERE database = ? AND name = ?), 0)) AS tables, \
             toUInt64(ifNull((SELECT count() FROM system.columns WHERE database = ? AND table = ? AND name = ?), 0)) AS v2_columns",
        )
        .bind(database)
        .bind(table)
        .bind(database)
        .bind(table)
        .bind(V2_COLUMN)
        .fetch_one()
        .await?;
    Ok(match (found.tables, found.v2_columns) {
        (0, _) => Layout::Missing,
        (_, 0) => Layout::V1,
        _ => Layout::V2,
    })
}

/// What applying the schema to one replica did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Applied {
    /// A v1 `measurements` was found and moved aside to [`V1_TABLE`] (its rows are copied by
    /// [`copy_v1`]).
    pub moved_v1_aside: bool,
    /// The form `measurements` has now: the one asked for, unless the table existed in the
    /// other (`CREATE ... IF NOT EXISTS` leaves it; the writer works the same on both).
    pub form: Option<TableForm>,
}

/// Why the schema could not be applied to a server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The replicated form on a server without replication configured (no `{shard}` and
    /// `{replica}` macros), with the hint to set `COLLECTOR_CLICKHOUSE_TABLE_FORM=single`:
    /// trying again cannot help.
    #[error("{0}")]
    NoReplication(String),
    /// Anything else (the server unreachable or still starting, a statement refused): worth
    /// trying again.
    #[error("{0}")]
    Failed(String),
}

impl From<String> for SchemaError {
    fn from(text: String) -> Self {
        SchemaError::Failed(text)
    }
}

/// Applies the ClickHouse schema for `database` through `client` (whose own database, if
/// set, must exist: use `system`): the database; a v1 `measurements` moved aside to
/// [`V1_TABLE`] (`RENAME`, per replica: a rename is not replicated); v2 created; the CrUX
/// roll-up's tables ([`CRUX_ROLLUP`]) created. Safe to run
/// from several collectors and `migrate` at once: a rename that lost the race is checked
/// against what the winner left. Errors name the file and carry ClickHouse's message.
pub async fn apply_clickhouse(
    client: &clickhouse::Client,
    database: &str,
    form: TableForm,
) -> Result<Applied, SchemaError> {
    let low_cardinality = knows_low_cardinality_setting(client)
        .await
        .map_err(|e| format!("reading system.settings: {}", crate::logging::chain(&e)))?;
    let run = |sql: String| async move {
        let mut query = client.query(&sql);
        if low_cardinality {
            query = query.with_setting(LOW_CARDINALITY.0, LOW_CARDINALITY.1);
        }
        match query.execute().await {
            Err(e) if !already_applied(&sql, &e) => Err(crate::logging::chain(&e)),
            _ => Ok(()),
        }
    };
    let statements = clickhouse_statements(database);
    run(statements[0].clone())
        .await
        .map_err(|e| format!("{}: {e}", CLICKHOUSE[0].0))?;
    let mut applied = Applied::default();
    let found = layout(client, database, "measurements")
        .await
        .map_err(|e| {
            format!(
                "reading the layout of measurements: {}",
                crate::logging::chain(&e)
            )
        })?;
    if found == Layout::V1 {
        run(statement(V1_SAMPLE_RATE, database))
            .await
            .map_err(|e| format!("v1/sample_rate.sql: {e}"))?;
        let rename = format!("RENAME TABLE {database}.measurements TO {database}.{V1_TABLE}");
        if let Err(e) = run(rename).await {
            // Another collector or migrate renamed it first: fine when it is gone now.
            let now = layout(client, database, "measurements").await;
            if matches!(now, Ok(Layout::V1)) || now.is_err() {
                return Err(format!("moving the v1 table aside to {V1_TABLE}: {e}").into());
            }
        } else {
            applied.moved_v1_aside = true;
        }
    }
    let dedup_window = wants_dedup_window(client, form).await?;
    if let Err(e) = run(measurements_statement(database, form, dedup_window)).await {
        let hint = match form {
            TableForm::Replicated => replication_missing(client).await,
            TableForm::Single => None,
        };
        return Err(match hint {
            Some(hint) => SchemaError::NoReplication(format!("{}: {e} ({hint})", CLICKHOUSE[1].0)),
            None => SchemaError::Failed(format!("{}: {e}", CLICKHOUSE[1].0)),
        });
    }
    // The columns added since v2 of the table, added to a table an earlier release made (one
    // statement each, so that one found there does not hide another that is missing). Only
    // those it lacks: the serving collectors' write user, which applies the schema to a
    // replica that returns without the table, may not ALTER (docs/deployment.md, "ClickHouse
    // users"); one added meanwhile by another collector counts as applied.
    let present = columns_of_measurements(client, database).await?;
    for sql in missing_column_statements(database, &present) {
        run(sql.clone()).await.map_err(|e| format!("{sql}: {e}"))?;
    }
    for (file, sql) in CRUX_ROLLUP {
        run(statement(sql, database))
            .await
            .map_err(|e| format!("{file}: {e}"))?;
    }
    applied.form = form_of_measurements(client, database).await?;
    Ok(applied)
}

/// Whether `measurements` in `form` gets the single-server deduplication window: the
/// single-server form, on a server that knows [`SINGLE_DEDUP_SETTING`].
async fn wants_dedup_window(
    client: &clickhouse::Client,
    form: TableForm,
) -> Result<bool, SchemaError> {
    if form != TableForm::Single {
        return Ok(false);
    }
    knows_merge_tree_setting(client, SINGLE_DEDUP_SETTING)
        .await
        .map_err(|e| {
            SchemaError::Failed(format!(
                "reading system.merge_tree_settings: {}",
                crate::logging::chain(&e)
            ))
        })
}

/// The columns `database.measurements` has (`system.columns`).
async fn columns_of_measurements(
    client: &clickhouse::Client,
    database: &str,
) -> Result<Vec<String>, SchemaError> {
    client
        .query("SELECT name FROM system.columns WHERE database = ? AND table = 'measurements'")
        .bind(database)
        .fetch_all()
        .await
        .map_err(|e| {
            SchemaError::Failed(format!(
                "reading the columns of measurements: {}",
                crate::logging::chain(&e)
            ))
        })
}

/// The form `database.measurements` was made in, by its engine; `None` without the table.
async fn form_of_measurements(
    client: &clickhouse::Client,
    database: &str,
) -> Result<Option<TableForm>, SchemaError> {
    let engine = engine_of(client, database).await.map_err(|e| {
        SchemaError::Failed(format!(
            "reading the engine of measurements: {}",
            crate::logging::chain(&e)
        ))
    })?;
    Ok(engine.map(|e| {
        if e.starts_with("Replicated") {
            TableForm::Replicated
        } else {
            TableForm::Single
        }
    }))
}

/// What [`copy_v1`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Copied {
    /// Months (`YYYYMM`, UTC) of the v1 table looked at.
    pub months: usize,
    /// Rows the v1 table holds.
    pub v1_rows: u64,
    /// Rows copied into v2 by this run.
    pub copied: u64,
    /// Rows of v1 whose id was in v2 already (copied by an earlier run, or written by a
    /// collector since): not copied again.
    pub already_there: u64,
}

async fn insert_v2(
    client: &clickhouse::Client,
    sql: &str,
    rows: Vec<u8>,
) -> Result<(), clickhouse::error::Error> {
    let mut insert = client.insert_formatted_with(sql.to_owned());
    insert.send(rows.into()).await?;
    insert.end().await
}

/// Rows per INSERT while copying (each a ClickHouse block of its own).
const COPY_BATCH_ROWS: usize = 50_000;

/// Copies every row of [`V1_TABLE`] whose id `measurements` (v2) lacks, month by month of
/// `received_at` (UTC), with the columns v2 adds derived as intake derives them
/// ([`crate::measurement::layouts::decode_one`]: the page view's time, the parsed user agent). The
/// rows are read as RowBinary in v1's column order and written as v2 RowBinary, as the
/// writer writes; nothing is decoded as text.
///
/// Resumable and idempotent: a run that was killed halfway leaves some rows copied, and the
/// next run copies only the ids still missing (`id NOT IN` the v2 ids of the months a v1 month
/// can reach: a stored `ts` is at most 7 days before and 5 minutes after `received_at`), so
/// every id is present once. Rows written into v1 after a run (by a collector of an earlier
/// release still writing to a replica not yet switched) are copied by the next run. Does
/// nothing when there is no v1 table.
pub async fn copy_v1(client: &clickhouse::Client, database: &str) -> Result<Copied, CopyError> {
    let mut done = Copied::default();
    if layout(client, database, V1_TABLE).await? == Layout::Missing {
        return Ok(done);
    }
    let insert_sql = format!(
        "INSERT INTO {database}.measurements ({}) FORMAT RowBinary",
        crate::measurement::COLUMNS.join(", ")
    );
    for Month { month, rows } in v1_months(client, database).await? {
        let copied = copy_month(client, database, month, &insert_sql).await?;
        done.months += 1;
        done.v1_rows += rows;
        done.copied += copied;
        done.already_there += rows.saturating_sub(copied);
        println!(
            "clickhouse: {V1_TABLE} month {month}: {rows} rows, {copied} copied, {} already in measurements",
            rows.saturating_sub(copied)
        );
    }
    Ok(done)
}

/// Why [`copy_v1`] stopped (what it copied stays; the next run copies only what is missing).
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// A query refused or unanswered (ClickHouse's error chain).
    #[error("{}", crate::logging::chain(.0))]
    ClickHouse(#[from] clickhouse::error::Error),
    /// The answer for the v1 month `month` (`YYYYMM`) is not v1 RowBinary rows.
    #[error("reading {v1} month {month}: {source}", v1 = V1_TABLE)]
    Row {
        /// The month read.
        month: u32,
        /// Why the bytes are not a row.
        source: crate::measurement::RowDecodeError,
    },
}

/// The month of a v1 row, by its `received_at` in UTC (`YYYYMM`).
const V1_UTC_MONTH: &str = "toYYYYMM(toDateTime(received_at, 'UTC'))";

/// A month (`YYYYMM`, UTC) of [`V1_TABLE`] and the rows it holds.
#[derive(Debug, serde::Deserialize, clickhouse::Row)]
struct Month {
    month: u32,
    rows: u64,
}

/// The months of [`V1_TABLE`] with their rows (under `FINAL`), in order.
async fn v1_months(
    client: &clickhouse::Client,
    database: &str,
) -> Result<Vec<Month>, clickhouse::error::Error> {
    client
        .query(&format!(
            "SELECT toUInt32({V1_UTC_MONTH}) AS month, count() AS rows FROM {database}.{V1_TABLE} FINAL \
             GROUP BY month ORDER BY month"
        ))
        .fetch_all()
        .await
}

/// Copies the rows of [`V1_TABLE`]'s `month` whose id v2 lacks, [`COPY_BATCH_ROWS`] per
/// INSERT (`insert_sql`); how many were copied.
async fn copy_month(
    client: &clickhouse::Client,
    database: &str,
    month: u32,
    insert_sql: &str,
) -> Result<u64, CopyError> {
    let v1_columns = &crate::measurement::COLUMNS
        [..crate::measurement::layouts::columns_in(2).expect("the table knows its own layouts")];
    let (year, m) = (month / 100, month % 100);
    let start = format!("toDateTime('{year:04}-{m:02}-01 00:00:00', 'UTC')");
    let select = format!(
        // FINAL: copies of one id that v1 has not merged yet may differ in their receipt,
        // and so in the day they file under in v2, where they would never fold.
        "SELECT {} FROM {database}.{V1_TABLE} FINAL WHERE {V1_UTC_MONTH} = {month} \
         AND id NOT IN (SELECT id FROM {database}.measurements \
         WHERE page_view_at >= {start} - INTERVAL 8 DAY \
         AND page_view_at < {start} + INTERVAL 1 MONTH + INTERVAL 1 DAY)",
        v1_columns.join(", ")
    );
    let mut cursor = client.query(&select).fetch_bytes("RowBinary")?;
    let (mut pending, mut batch, mut in_batch, mut copied) =
        (Vec::<u8>::new(), Vec::<u8>::new(), 0usize, 0u64);
    loop {
        let chunk = cursor.next().await?;
        let end = chunk.is_none();
        if let Some(chunk) = chunk {
            pending.extend_from_slice(&chunk);
        }
        let used = v1_rows_as_v2(&pending, end, &mut batch, &mut in_batch)
            .map_err(|source| CopyError::Row { month, source })?;
        pending.drain(..used);
        if in_batch >= COPY_BATCH_ROWS || (end && in_batch > 0) {
            insert_v2(client, insert_sql, std::mem::take(&mut batch)).await?;
            copied += in_batch as u64;
            in_batch = 0;
        }
        if end {
            return Ok(copied);
        }
    }
}

/// Decodes the whole v1 rows at the start of `pending`, appending each to `batch` as a v2 row
/// and counting it in `in_batch`; the bytes used. A row cut off waits for more bytes, unless
/// the answer has `end`ed: then it is an error.
fn v1_rows_as_v2(
    pending: &[u8],
    end: bool,
    batch: &mut Vec<u8>,
    in_batch: &mut usize,
) -> Result<usize, crate::measurement::RowDecodeError> {
    let mut input = pending;
    loop {
        let before = input;
        match crate::measurement::layouts::decode_one(2, &mut input) {
            Ok(row) => {
                row.encode(batch);
                *in_batch += 1;
            }
            Err(_) if !end => {
                input = before;
                break;
            }
            Err(e) if !before.is_empty() => return Err(e),
            Err(_) => break,
        }
        if input.is_empty() {
            break;
        }
    }
    Ok(pending.len() - input.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_column_counts_as_added_on_both_engines() {
        let sql = "ALTER TABLE db.measurements ADD COLUMN sample_rate Float64 DEFAULT 1";
        let answer = |text: &str| clickhouse::error::Error::BadResponse(text.into());
        assert!(already_applied(sql, &answer("Code: 44, e.displayText() = DB::Exception: Cannot add column sample_rate: column with this name already exists")));
        assert!(already_applied(sql, &answer("Code: 15. DB::Exception: Cannot add column `sample_rate`: column with this name already exists. (DUPLICATE_COLUMN) (version 26.9.2.1)")));
        assert!(!already_applied(
            sql,
            &answer("Code: 60. DB::Exception: Table db.measurements does not exist")
        ));
        assert!(!already_applied(
            "CREATE TABLE x",
            &answer("Code: 15. already exists")
        ));
    }

    #[test]
    fn only_the_columns_a_table_lacks_are_added() {
        let all = added_column_statements("db");
        assert!(!all.is_empty());
        assert_eq!(missing_column_statements("db", &[]), all);
        let names: Vec<String> = crate::measurement::columns()
            .iter()
            .map(|(name, _)| name.to_string())
            .collect();
        assert!(missing_column_statements("db", &names).is_empty());
        let first = all[0].split(" ADD COLUMN ").nth(1).unwrap();
        let first = first.split(' ').next().unwrap().to_owned();
        assert_eq!(missing_column_statements("db", &[first]), all[1..]);
    }

    #[test]
    fn the_single_server_form_is_the_replicated_statement_without_replication() {
        assert_eq!(CLICKHOUSE[1].1.matches(REPLICATED_ENGINE).count(), 1);
        let replicated = measurements_statement("db", TableForm::Replicated, true);
        assert!(replicated.contains("ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/db/measurements_v2', '{replica}')"));
        assert!(!replicated.contains(SINGLE_DEDUP_SETTING));
        let single = measurements_statement("db", TableForm::Single, true);
        assert!(single.contains("ENGINE = ReplacingMergeTree\n"), "{single}");
        assert!(!single.contains("{shard}") && !single.contains("Replicated"));
        assert!(single.ends_with(
            "SETTINGS index_granularity = 8192, non_replicated_deduplication_window = 1000"
        ));
        let old = measurements_statement("db", TableForm::Single, false);
        assert!(old.ends_with("SETTINGS index_granularity = 8192"), "{old}");
        // Same columns, partition and sort key.
        let body = |sql: &str| sql[..sql.find("ENGINE").unwrap()].to_owned();
        assert_eq!(body(&single), body(&replicated));
        assert!(single.contains("ORDER BY (site, toDate(page_view_at), id)"));
    }
}

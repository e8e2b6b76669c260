//! `collector migrate`: applies `schema/` to PostgreSQL and to every ClickHouse replica.
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

use crate::config::Settings;
use crate::RunError;

/// PostgreSQL schema files, in order.
pub const POSTGRES: &[(&str, &str)] = &[(
    "001_sites.sql",
    include_str!("../../schema/postgres/001_sites.sql"),
)];

/// ClickHouse schema files, in order; one statement each.
pub const CLICKHOUSE: &[(&str, &str)] = &[
    (
        "001_database.sql",
        include_str!("../../schema/clickhouse/001_database.sql"),
    ),
    (
        "002_measurements.sql",
        include_str!("../../schema/clickhouse/002_measurements.sql"),
    ),
    (
        "003_sample_rate.sql",
        include_str!("../../schema/clickhouse/003_sample_rate.sql"),
    ),
];

/// ClickHouse's ILLEGAL_COLUMN (`src/Common/ErrorCodes.cpp`), which `ADD COLUMN` answers, with
/// "column with this name already exists", for a column that is there (18.16 and current).
const ILLEGAL_COLUMN: u32 = 44;

/// Whether a failed statement was an `ADD COLUMN` whose column exists already: applied.
fn already_applied(sql: &str, error: &clickhouse::error::Error) -> bool {
    let text = error.to_string();
    sql.contains(" ADD COLUMN ")
        && crate::writer::exception_code(&text) == Some(ILLEGAL_COLUMN)
        && text.contains("already exists")
}

/// The ClickHouse statements for `database`, in order.
pub fn clickhouse_statements(database: &str) -> Vec<String> {
    CLICKHOUSE
        .iter()
        .map(|(_, sql)| {
            sql.replace("{database}", database)
                .trim()
                .trim_end_matches(';')
                .to_owned()
        })
        .collect()
}

/// Bound on applying the schema to one ClickHouse replica (a hung replica must not hold a
/// deploy).
pub const REPLICA_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Pause between two attempts on a replica that did not take the schema yet.
const RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Applies the ClickHouse schema for `database` through `client` (whose own database, if
/// set, must exist: use `system`). Errors name the file and carry ClickHouse's message.
pub async fn apply_clickhouse(client: &clickhouse::Client, database: &str) -> Result<(), String> {
    for ((name, _), sql) in CLICKHOUSE.iter().zip(clickhouse_statements(database)) {
        match client.query(&sql).execute().await {
            Err(e) if !already_applied(&sql, &e) => {
                return Err(format!("{name}: {}", crate::logging::chain(&e)))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Applies the PostgreSQL schema, then the ClickHouse schema to every replica, each within
/// [`REPLICA_TIMEOUT`]. One replica down must not block a deploy (contract §1): the replicas
/// that could not be reached are named on stderr, and the run succeeds when PostgreSQL and at
/// least one replica have the schema. The collector applies it to the others when they
/// return.
pub async fn run(settings: &Settings) -> Result<(), RunError> {
    let store = crate::cli_store(settings)?;
    let mut postgres = Ok(());
    for (name, sql) in POSTGRES {
        // "already exists, skipping" notices are the normal case of an idempotent migration.
        // `SET LOCAL`: one simple-protocol message runs as one implicit transaction, and the
        // setting ends with it instead of staying on a server connection that a
        // transaction-mode pooler (PgBouncer) then hands to other clients.
        if let Err(e) = store
            .apply(&format!("SET LOCAL client_min_messages = warning;\n{sql}"))
            .await
        {
            postgres = Err(format!("postgres {name}: {e}"));
            break;
        }
    }
    match &postgres {
        Ok(()) => println!("postgres: schema applied"),
        Err(e) => eprintln!("collector: {e}"),
    }
    // All replicas at once, each tried again until it answers or REPLICA_TIMEOUT has passed:
    // in a fresh `docker compose up` the replicas may still be starting (compose does not
    // wait for them to be healthy, so that one replica down cannot block a deploy).
    let attempts = settings.clickhouse_urls.iter().map(|url| async move {
        let url = url.as_str().trim_end_matches('/').to_owned();
        let client = clickhouse::Client::default()
            .with_url(&url)
            .with_validation(false);
        let deadline = tokio::time::Instant::now() + REPLICA_TIMEOUT;
        let result = loop {
            let apply = apply_clickhouse(&client, &settings.clickhouse_database);
            let result = match tokio::time::timeout_at(deadline, apply).await {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {REPLICA_TIMEOUT:?}")),
            };
            match result {
                Err(_) if tokio::time::Instant::now() + RETRY_EVERY < deadline => {
                    tokio::time::sleep(RETRY_EVERY).await
                }
                done => break done,
            }
        };
        (url, result)
    });
    let mut applied = 0;
    for (url, result) in futures_util::future::join_all(attempts).await {
        match result {
            Ok(()) => {
                applied += 1;
                println!("clickhouse {url}: schema applied");
            }
            Err(e) => eprintln!(
                "collector: clickhouse {url}: not applied ({e}); the collector applies it when the replica answers"
            ),
        }
    }
    postgres.map_err(RunError::Failed)?;
    if applied == 0 {
        return Err(RunError::Failed(
            "no ClickHouse replica has the schema (every one listed in COLLECTOR_CLICKHOUSE_URLS failed)".into(),
        ));
    }
    Ok(())
}

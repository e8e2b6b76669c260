//! `collector migrate`: applies `schema/` to PostgreSQL and to every ClickHouse replica.
//!
//! Idempotent (every statement is `IF NOT EXISTS`) and safe to run on every start. The
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
];

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

/// Applies every schema file; stops at the first failure, naming the server and file.
pub async fn run(settings: &Settings) -> Result<(), RunError> {
    let store = crate::cli_store(settings)?;
    for (name, sql) in POSTGRES {
        // "already exists, skipping" notices are the normal case of an idempotent migration.
        store
            .apply(&format!("SET client_min_messages = warning;\n{sql}"))
            .await
            .map_err(|e| RunError::Failed(format!("postgres {name}: {e}")))?;
    }
    println!("postgres: schema applied");
    for url in &settings.clickhouse_urls {
        let client = clickhouse::Client::default()
            .with_url(url.as_str().trim_end_matches('/'))
            .with_validation(false);
        for ((name, _), sql) in CLICKHOUSE
            .iter()
            .zip(clickhouse_statements(&settings.clickhouse_database))
        {
            client
                .query(&sql)
                .execute()
                .await
                .map_err(|e| RunError::Failed(format!("clickhouse {url} {name}: {e}")))?;
        }
        println!("clickhouse {url}: schema applied");
    }
    Ok(())
}

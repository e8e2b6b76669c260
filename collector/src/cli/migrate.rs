//! `collector migrate`: applies `schema/postgres/` to PostgreSQL and the ClickHouse schema
//! ([`crate::clickhouse::schema`]) to every ClickHouse replica, then copies a v1 table's rows.

use super::{cli_store, RunError};
use crate::clickhouse::schema::{apply_clickhouse, copy_v1, SchemaError, V1_TABLE};
use crate::config::{Config, TableForm};

/// PostgreSQL schema files, in order.
pub const POSTGRES: &[(&str, &str)] = &[(
    "001_sites.sql",
    include_str!("../../../schema/postgres/001_sites.sql"),
)];

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

/// Applies the PostgreSQL schema, then the ClickHouse schema to every replica, each within
/// [`REPLICA_TIMEOUT`]. One replica down must not block a deploy (contract §1): the replicas
/// that could not be reached are named on stderr, and the run succeeds when PostgreSQL and at
/// least one replica have the schema. The collector applies it to the others when they
/// return.
pub async fn run(config: &Config) -> Result<(), RunError> {
    let store = cli_store(config)?;
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
    let attempts = config.clickhouse.urls.iter().map(|url| async move {
        let url = url.as_str().trim_end_matches('/').to_owned();
        let client = clickhouse::Client::default()
            .with_url(&url)
            .with_validation(false);
        let deadline = tokio::time::Instant::now() + REPLICA_TIMEOUT;
        // Err((why, whether the collector can still apply it later)).
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
                    break Err((
                        match &last {
                            Some(e) => {
                                format!(
                                    "no answer within {REPLICA_TIMEOUT:?}; the attempt before: {e}"
                                )
                            }
                            None => format!("no answer within {REPLICA_TIMEOUT:?}"),
                        },
                        true,
                    ))
                }
            };
            if tokio::time::Instant::now() + RETRY_EVERY >= deadline {
                break Err((failed, true));
            }
            last = Some(failed);
            tokio::time::sleep(RETRY_EVERY).await;
        };
        (url, client, result)
    });
    let mut applied = Vec::new();
    let mut missed = 0;
    for (url, client, result) in futures_util::future::join_all(attempts).await {
        match result {
            Ok(done) => {
                if done.moved_v1_aside {
                    println!(
                        "clickhouse {url}: the v1 measurements table moved aside to {V1_TABLE}"
                    );
                }
                let form = config.clickhouse.table_form;
                match done.form {
                    Some(found) if found != form => eprintln!(
                        "collector: clickhouse {url}: measurements exists in the {} form, not the {} form that COLLECTOR_CLICKHOUSE_TABLE_FORM asks for; it is kept as it is (the writer works on both)",
                        form_name(found),
                        form_name(form)
                    ),
                    _ => println!("clickhouse {url}: schema applied ({} form)", form_name(form)),
                }
                applied.push((url, client));
            }
            Err((e, true)) => {
                missed += 1;
                eprintln!(
                    "collector: clickhouse {url}: not applied ({e}); the collector applies it when the replica answers"
                )
            }
            Err((e, false)) => {
                missed += 1;
                eprintln!("collector: clickhouse {url}: not applied: {e}")
            }
        }
    }
    postgres.map_err(RunError::Failed)?;
    let Some((url, client)) = applied.first() else {
        return Err(RunError::Failed(
            "no ClickHouse server has the schema (every one listed in COLLECTOR_CLICKHOUSE_URLS failed, see above)".into(),
        ));
    };
    // Every reachable replica writes to v2 now; the v1 rows are copied once, through one
    // replica (the copy replicates like any insert).
    let copied = copy_v1(client, &config.clickhouse.database)
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

//! The INSERT: RowBinary rows as the spool holds them, sent in chunks with their
//! deduplication token, over a pooled or a fresh connection.

use std::time::Duration;

use bytes::Bytes;

/// Bound on sending one batch.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on ClickHouse finishing one INSERT once sent.
pub const END_TIMEOUT: Duration = Duration::from_secs(20);

/// What one INSERT sends: RowBinary rows and the deduplication token that names them.
#[derive(Debug, Clone)]
pub struct InsertBody {
    /// `insert_deduplication_token`: equal for every retry of these rows, unique otherwise.
    pub token: String,
    /// The rows.
    pub rows: Bytes,
}

/// Bytes handed to the ClickHouse client per `send` (each is one LZ4 block on the wire).
const SEND_CHUNK_BYTES: usize = 1024 * 1024;

/// The INSERT statement: every column, in the order of the rows' RowBinary.
pub fn insert_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        format!(
            "INSERT INTO measurements ({}) FORMAT RowBinary",
            crate::measurement::COLUMNS.join(", ")
        )
    })
}

/// Sends `body`'s rows as they are: the spool holds them in the format of the INSERT.
pub async fn insert_rows(
    client: &clickhouse::Client,
    body: &InsertBody,
    token: Option<String>,
) -> Result<(), clickhouse::error::Error> {
    let mut insert = client.insert_formatted_with(insert_sql());
    if let Some(token) = token {
        // A server that knows tokens (22.2+) knows `async_insert` too (21.11+), which current
        // releases turn on by default (26.3+). Off for our inserts: a batch is already large,
        // an asynchronous one would wait for the server's buffer flush, share a part (and a
        // failure) with other clients' rows, and fold a resent token only as
        // `async_insert_deduplicate` says. Synchronous, the answer is about these rows alone.
        insert = insert
            .with_setting("insert_deduplication_token", token)
            .with_setting("async_insert", "0");
    }
    let mut insert = insert.with_timeouts(Some(SEND_TIMEOUT), Some(END_TIMEOUT));
    let mut at = 0;
    while at < body.rows.len() {
        let end = (at + SEND_CHUNK_BYTES).min(body.rows.len());
        insert.send(body.rows.slice(at..end)).await?;
        at = end;
    }
    insert.end().await
}

/// Whether `error` is what a connection closed by the server while idle in the pool looks
/// like: a network error after connecting (reset, broken pipe, the connection closed before
/// a response), as opposed to a refused or timed-out connect, a timeout, or an answer.
pub fn is_stale_connection(error: &clickhouse::error::Error) -> bool {
    let clickhouse::error::Error::Network(inner) = error else {
        return false;
    };
    if let Some(e) = inner.downcast_ref::<hyper_util::client::legacy::Error>() {
        if e.is_connect() {
            return false;
        }
    }
    true
}

//! Clients of the servers the tests talk to: HTTP (one shared client, or one from a chosen
//! loopback address), ClickHouse over HTTP and PostgreSQL.

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

/// Runs `sql` on a ClickHouse HTTP endpoint with `FORMAT JSON`; the `data` rows.
pub async fn clickhouse_query(url: &str, sql: &str) -> Result<Vec<Value>, String> {
    let text = body_of(http().post(url).body(format!("{sql} FORMAT JSON"))).await?;
    data_rows(&text)
}

/// Runs a statement on a ClickHouse HTTP endpoint.
pub async fn clickhouse_exec(url: &str, sql: &str) -> Result<(), String> {
    body_of(http().post(url).body(sql.to_owned()))
        .await
        .map(drop)
}

/// Sends `request`: the answer's body when its status is a success, else `STATUS: BODY`
/// (trimmed), or why there is no answer (the error's whole chain).
pub async fn body_of(request: reqwest::RequestBuilder) -> Result<String, String> {
    let resp = request.send().await.map_err(|e| format!("{e:?}"))?;
    let status = resp.status();
    let text = resp
        .text()
        .await
        .map_err(|e| format!("{status}, its body cannot be read: {e}"))?;
    if status.is_success() {
        Ok(text)
    } else {
        Err(format!("{status}: {}", text.trim()))
    }
}

/// The `data` rows of ClickHouse's `FORMAT JSON` answer `text`, or why there are none (the
/// text is not JSON, or has no `data` array), with the text.
pub fn data_rows(text: &str) -> Result<Vec<Value>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("{e}: {text}"))?;
    v["data"]
        .as_array()
        .cloned()
        .ok_or_else(|| format!("no data rows in ClickHouse's answer: {text}"))
}

/// GETs `url` with [`http`]; the response, whatever its status. Panics when there is no
/// answer (within [`http`]'s 30 s timeout).
pub async fn http_get(url: impl reqwest::IntoUrl) -> reqwest::Response {
    http().get(url).send().await.unwrap()
}

/// A shared HTTP client for tests, without a connection pool: each test has its own tokio
/// runtime, and a pooled connection's task dies with the runtime that opened it, so reusing
/// it from another test fails ("runtime dropped the dispatch task").
pub fn http() -> reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(0)
                .no_gzip()
                .build()
                .unwrap()
        })
        .clone()
}

/// An HTTP client whose connections come from `source` (a loopback address such as
/// 127.0.0.5), so that tests can play several clients.
pub fn client_from(source: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(source.parse::<std::net::IpAddr>().unwrap())
        .timeout(Duration::from_secs(30))
        .no_gzip()
        .build()
        .unwrap()
}

/// A client of the PostgreSQL (or PgBouncer) at `url`, without TLS, its connection driven on a
/// task of its own; panics naming `what` (e.g. "the pgbouncer admin console") and `url` when it
/// cannot connect.
pub async fn pg_connect(url: &str, what: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to {what} ({url}): {e}"));
    tokio::spawn(conn);
    client
}

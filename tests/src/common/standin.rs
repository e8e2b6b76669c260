//! A test-only stand-in for current ClickHouse behaviour that Debian's ClickHouse 18.16 cannot
//! show, put in front of a real 18.16 replica as an HTTP proxy.
//!
//! **Why it is still here, beside a real 26.x server** (`tests/tests/ch26.rs`). The 26.x
//! server of the tests is clickhouse-local, which cannot replicate; what the stand-in keeps is
//! what only *replicas* of a current release show, or what that server would not produce:
//! - the token memory of a replicated table, shared by every replica (it lives in Keeper):
//!   two collectors writing through different replicas must never share a token. The real
//!   26.x server proves the memory for one table on one server;
//! - `version()`, only so that the collector sends tokens to these 18.16 replicas;
//! - an INSERT failing after `200 OK`: no way was found to make 26.9 do it for an INSERT.
//!
//! What the real 26.x server shows is tested there and has no mode here: a `CHECK`
//! constraint's refusal, an insert that stores part of its rows before failing, a seen token
//! storing nothing.
//!
//! Everything the stand-in does not name below is the real 18.16 server's answer: queries,
//! inserts, replication, `system.replicas`. It changes only what current releases do
//! differently, as their documentation states:
//!
//! - **`version()`** reports [`VERSION`] (a 25.3 LTS release) by rewriting `version()` in the
//!   query text to that literal, so the collector takes the server for a current one and
//!   sends `insert_deduplication_token`. Source: the `version()` function reference,
//!   <https://clickhouse.com/docs/sql-reference/functions/other-functions#version>, and the
//!   22.2 changelog that introduced the setting
//!   (<https://clickhouse.com/docs/whats-new/changelog/2022#222>).
//! - **`insert_deduplication_token`** as a replicated table applies it: "the setting allows a
//!   user to provide own deduplication semantic in MergeTree/ReplicatedMergeTree", and an
//!   INSERT whose token was already seen is deduplicated: nothing is written and the answer is
//!   `200` (<https://clickhouse.com/docs/operations/settings/settings#insert_deduplication_token>,
//!   <https://clickhouse.com/docs/guides/developer/deduplicating-inserts-on-retries>). The
//!   memory of tokens belongs to the table in ZooKeeper/Keeper, so it is shared by every
//!   replica and every client: stand-ins built on one [`TokenMemory`] share it. It holds the
//!   last [`DEDUP_WINDOW`] tokens, the default of `replicated_deduplication_window` in current
//!   releases (<https://clickhouse.com/docs/reference/settings/merge-tree-settings/replicated-deduplication-window>;
//!   raised from 100 to 1000 by ClickHouse PR 57335). The setting (and `async_insert=0`, which
//!   the collector sends with it) is removed before the INSERT is forwarded, because 18.16
//!   refuses settings it does not know.
//! - **A failure after the status line**: in [`InsertMode::ExceptionHeader`] every INSERT is
//!   answered `200 OK` with the error only in the `X-ClickHouse-Exception-Code` header and the
//!   body, and nothing is written. Current releases send that header when an exception is
//!   thrown before the body is sent (ClickHouse PR 8786), and answer `200` when the status line
//!   has already gone out ("HTTP response codes caveats",
//!   <https://clickhouse.com/docs/interfaces/http#http_response_codes_caveats>; ClickHouse
//!   issue 65117 and PR 60252, where exceptions were answered with 200). 18.16 never sends the
//!   header.
//!
//! A `CHECK` constraint's refusal (code 469) was a mode here once; the real ClickHouse 26.x
//! server shows it now (`tests/tests/ch26.rs`), and the mode is gone.
//!
//! The stand-in runs inside the test process (a Tokio task), so a test switches its mode and
//! reads its counters directly.

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// What `version()` answers through the stand-in.
pub const VERSION: &str = "25.3.2.39";
/// Tokens a table remembers: `replicated_deduplication_window`'s default in current releases.
pub const DEDUP_WINDOW: usize = 1000;

/// The deduplication memory of one replicated table, shared by the stand-ins of its replicas.
#[derive(Default)]
pub struct TokenMemory {
    inner: Mutex<(VecDeque<String>, HashSet<String>)>,
}

impl TokenMemory {
    /// An empty memory, to share between stand-ins.
    pub fn new() -> Arc<TokenMemory> {
        Arc::new(TokenMemory::default())
    }

    fn seen(&self, token: &str) -> bool {
        self.inner.lock().unwrap().1.contains(token)
    }

    fn remember(&self, token: &str) {
        let mut inner = self.inner.lock().unwrap();
        if inner.1.insert(token.to_owned()) {
            inner.0.push_back(token.to_owned());
            if inner.0.len() > DEDUP_WINDOW {
                let old = inner.0.pop_front().unwrap();
                inner.1.remove(&old);
            }
        }
    }
}

/// How the stand-in answers INSERTs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsertMode {
    /// Forward them (after applying the deduplication token).
    Forward,
    /// Answer `200 OK` with `X-ClickHouse-Exception-Code: code` and the exception text in the
    /// body; write nothing.
    ExceptionHeader(u32),
}

/// What a stand-in did, counted since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StandInStats {
    /// INSERTs forwarded to the real server and answered 200 by it.
    pub inserts_written: u64,
    /// INSERTs dropped because their token was seen, answered 200.
    pub inserts_deduplicated: u64,
    /// INSERTs answered 200 with an exception header.
    pub inserts_failed_after_status: u64,
    /// INSERTs that carried `insert_deduplication_token`.
    pub inserts_with_token: u64,
    /// Queries whose `version()` was answered with [`VERSION`].
    pub version_rewrites: u64,
}

#[derive(Default)]
struct Counters {
    written: AtomicU64,
    deduplicated: AtomicU64,
    failed_after_status: AtomicU64,
    with_token: AtomicU64,
    version_rewrites: AtomicU64,
}

struct Shared {
    upstream: String,
    tokens: Arc<TokenMemory>,
    mode: Mutex<InsertMode>,
    counters: Counters,
    client: reqwest::Client,
}

/// A running stand-in; stopped when dropped.
pub struct StandIn {
    /// Its URL, to give the collector instead of the replica's.
    pub url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl StandIn {
    /// Starts a stand-in on a free loopback port in front of the ClickHouse HTTP endpoint
    /// `upstream`, with the table deduplication memory `tokens`.
    pub async fn start(upstream: &str, tokens: Arc<TokenMemory>) -> StandIn {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the stand-in");
        let addr: SocketAddr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_owned(),
            tokens,
            mode: Mutex::new(InsertMode::Forward),
            counters: Counters::default(),
            client: reqwest::Client::builder()
                .no_gzip()
                .timeout(std::time::Duration::from_secs(60))
                .build()
                .unwrap(),
        });
        let serving = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(&shared, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        StandIn {
            url: format!("http://{addr}"),
            shared,
            task,
        }
    }

    /// Sets how INSERTs are answered from now on.
    pub fn set_insert_mode(&self, mode: InsertMode) {
        *self.shared.mode.lock().unwrap() = mode;
    }

    /// Counters so far.
    pub fn stats(&self) -> StandInStats {
        let c = &self.shared.counters;
        StandInStats {
            inserts_written: c.written.load(Ordering::SeqCst),
            inserts_deduplicated: c.deduplicated.load(Ordering::SeqCst),
            inserts_failed_after_status: c.failed_after_status.load(Ordering::SeqCst),
            inserts_with_token: c.with_token.load(Ordering::SeqCst),
            version_rewrites: c.version_rewrites.load(Ordering::SeqCst),
        }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Answer = Response<Full<Bytes>>;

fn answer(status: StatusCode, headers: &[(&str, String)], body: impl Into<Bytes>) -> Answer {
    let mut resp = Response::builder().status(status);
    for (k, v) in headers {
        resp = resp.header(*k, v);
    }
    resp.body(Full::new(body.into())).unwrap()
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Answer {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return answer(StatusCode::BAD_REQUEST, &[], format!("stand-in: {e}")),
    };
    let mut params: Vec<(String, String)> = parts
        .uri
        .query()
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .into_owned()
                .collect()
        })
        .unwrap_or_default();
    let query_param = params
        .iter()
        .find(|(k, _)| k == "query")
        .map(|(_, v)| v.clone());
    let is_insert = query_param
        .as_deref()
        .is_some_and(|q| q.trim_start().to_ascii_uppercase().starts_with("INSERT"));
    let mut body = body;

    if is_insert {
        let token = params
            .iter()
            .find(|(k, _)| k == "insert_deduplication_token")
            .map(|(_, v)| v.clone());
        // 18.16 knows neither the token nor `async_insert` (21.11+), which the collector
        // turns off next to a token.
        params.retain(|(k, _)| k != "insert_deduplication_token" && k != "async_insert");
        if token.is_some() {
            shared.counters.with_token.fetch_add(1, Ordering::SeqCst);
        }
        let mode = shared.mode.lock().unwrap().clone();
        if let InsertMode::ExceptionHeader(code) = mode {
            shared
                .counters
                .failed_after_status
                .fetch_add(1, Ordering::SeqCst);
            return answer(
                StatusCode::OK,
                &[("X-ClickHouse-Exception-Code", code.to_string())],
                format!(
                    "Code: {code}. DB::Exception: stand-in: failed after the status line. (TIMEOUT_EXCEEDED) (version {VERSION} (official build))\n"
                ),
            );
        }
        if let Some(token) = &token {
            if shared.tokens.seen(token) {
                shared.counters.deduplicated.fetch_add(1, Ordering::SeqCst);
                return answer(StatusCode::OK, &[], Bytes::new());
            }
        }
        let resp = forward(shared, &parts, &params, body).await;
        if resp.status() == StatusCode::OK {
            shared.counters.written.fetch_add(1, Ordering::SeqCst);
            if let Some(token) = &token {
                shared.tokens.remember(token);
            }
        }
        return resp;
    }

    // Not an INSERT: the query is in the `query` parameter, the body, or both.
    let mut rewritten = false;
    for (k, v) in params.iter_mut() {
        if k == "query" && v.contains("version()") {
            *v = v.replace("version()", &format!("'{VERSION}'"));
            rewritten = true;
        }
    }
    if let Ok(text) = std::str::from_utf8(&body) {
        if text.contains("version()") {
            body = Bytes::from(text.replace("version()", &format!("'{VERSION}'")));
            rewritten = true;
        }
    }
    if rewritten {
        shared
            .counters
            .version_rewrites
            .fetch_add(1, Ordering::SeqCst);
    }
    forward(shared, &parts, &params, body).await
}

async fn forward(
    shared: &Shared,
    parts: &hyper::http::request::Parts,
    params: &[(String, String)],
    body: Bytes,
) -> Answer {
    let mut url = format!("{}{}", shared.upstream, parts.uri.path());
    if !params.is_empty() {
        let query: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish();
        url = format!("{url}?{query}");
    }
    let mut req = shared
        .client
        .request(parts.method.clone(), url)
        .body(body.clone());
    for (name, value) in &parts.headers {
        if !matches!(
            name.as_str(),
            "host" | "content-length" | "connection" | "transfer-encoding"
        ) {
            req = req.header(name, value);
        }
    }
    match req.send().await {
        Ok(resp) => {
            let status = resp.status();
            let headers = answer_headers(&resp);
            let bytes = match resp.bytes().await {
                Ok(b) => b,
                Err(e) => {
                    return answer(
                        StatusCode::BAD_GATEWAY,
                        &[],
                        format!("stand-in: upstream body from {}: {e}", shared.upstream),
                    )
                }
            };
            let mut out = Response::builder().status(status.as_u16());
            for (k, v) in headers {
                out = out.header(k, v);
            }
            out.body(Full::new(bytes)).unwrap()
        }
        Err(e) => answer(
            StatusCode::BAD_GATEWAY,
            &[],
            format!("stand-in: upstream {}: {e}", shared.upstream),
        ),
    }
}

/// The headers of an upstream answer to pass on to the client: all but those of the
/// connection and the body's length, which the proxy's own answer sets.
pub fn answer_headers(resp: &reqwest::Response) -> Vec<(String, String)> {
    resp.headers()
        .iter()
        .filter(|(n, _)| {
            !matches!(
                n.as_str(),
                "content-length" | "connection" | "transfer-encoding" | "keep-alive"
            )
        })
        .filter_map(|(n, v)| Some((n.to_string(), v.to_str().ok()?.to_owned())))
        .collect()
}

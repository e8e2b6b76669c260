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
//!   last [`crate::tokens::DEDUP_WINDOW`] tokens, the default of `replicated_deduplication_window` in current
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::Request;

use crate::proxy::Upstream;
use crate::request::{is_insert, param, params};
use crate::serve::{answer, Answer, Outcome, Server};
pub use crate::tokens::TokenMemory;

/// What `version()` answers through the stand-in.
pub const VERSION: &str = "25.3.2.39";

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
    upstream: Upstream,
    tokens: Arc<TokenMemory>,
    mode: Mutex<InsertMode>,
    counters: Counters,
}

/// A running stand-in; stopped when dropped.
pub struct StandIn {
    /// Its URL, to give the collector instead of the replica's.
    pub url: String,
    shared: Arc<Shared>,
    _server: Server,
}

impl StandIn {
    /// Starts a stand-in on a free loopback port in front of the ClickHouse HTTP endpoint
    /// `upstream`, with the table deduplication memory `tokens`.
    pub async fn start(upstream: &str, tokens: Arc<TokenMemory>) -> StandIn {
        let shared = Arc::new(Shared {
            upstream: Upstream::new(upstream),
            tokens,
            mode: Mutex::new(InsertMode::Forward),
            counters: Counters::default(),
        });
        let server = Server::start(shared.clone(), |shared, req| async move {
            Ok::<_, String>(handle(&shared, req).await)
        })
        .await;
        StandIn {
            url: server.url(),
            shared,
            _server: server,
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

async fn handle(shared: &Shared, req: Request<Incoming>) -> Answer {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return answer(400, &[], format!("stand-in: {e}")),
    };
    let mut params = params(parts.uri.query());
    if is_insert(&params) {
        return insert(shared, &parts, params, body).await;
    }
    // Not an INSERT: the query is in the `query` parameter, the body, or both.
    let mut body = body;
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

async fn insert(
    shared: &Shared,
    parts: &hyper::http::request::Parts,
    mut params: Vec<(String, String)>,
    body: Bytes,
) -> Answer {
    let token = param(&params, "insert_deduplication_token");
    // 18.16 knows neither the token nor `async_insert` (21.11+), which the collector turns
    // off next to a token.
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
            200,
            &[("X-ClickHouse-Exception-Code", code.to_string())],
            format!(
                "Code: {code}. DB::Exception: stand-in: failed after the status line. (TIMEOUT_EXCEEDED) (version {VERSION} (official build))\n"
            ),
        );
    }
    if let Some(token) = &token {
        if shared.tokens.seen(token) {
            shared.counters.deduplicated.fetch_add(1, Ordering::SeqCst);
            return answer(200, &[], Bytes::new());
        }
    }
    let resp = forward(shared, parts, &params, body).await;
    if resp.status() == 200 {
        shared.counters.written.fetch_add(1, Ordering::SeqCst);
        if let Some(token) = &token {
            shared.tokens.remember(token);
        }
    }
    resp
}

async fn forward(
    shared: &Shared,
    parts: &hyper::http::request::Parts,
    params: &[(String, String)],
    body: Bytes,
) -> Answer {
    let sent: Outcome = shared.upstream.send(parts, params, body).await;
    sent.unwrap_or_else(|e| answer(502, &[], format!("stand-in: {e}")))
}

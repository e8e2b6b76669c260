//! A network fault, not an engine behaviour: an HTTP proxy in front of a real ClickHouse server
//! that passes everything through unchanged, except that the answers of the next `n` INSERTs
//! are lost. Each such INSERT is forwarded whole and the server's answer awaited (the server
//! has stored the rows), then the client's connection is closed without an answer, as a
//! connection cut after the server committed looks to the client. The client must send the
//! same rows again; with `insert_deduplication_token` the server folds the second copy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::Request;

use crate::proxy::Upstream;
use crate::request::{is_insert, params};
use crate::serve::{Outcome, Server};

struct Shared {
    upstream: Upstream,
    /// INSERT answers still to lose.
    to_lose: AtomicU64,
    lost: AtomicU64,
    inserts: AtomicU64,
}

/// The proxy; stops when dropped.
pub struct LostAnswers {
    /// Its URL, to give the collector instead of the server's.
    pub url: String,
    shared: Arc<Shared>,
    _server: Server,
}

impl LostAnswers {
    /// Starts it on a free loopback port in front of `upstream`, losing nothing yet.
    pub async fn start(upstream: &str) -> LostAnswers {
        let shared = Arc::new(Shared {
            upstream: Upstream::new(upstream),
            to_lose: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
        });
        // An error from the handler closes the connection without an answer.
        let server = Server::start(shared.clone(), |shared, req| async move {
            handle(&shared, req).await
        })
        .await;
        LostAnswers {
            url: server.url(),
            shared,
            _server: server,
        }
    }

    /// Loses the answers of the next `n` INSERTs.
    pub fn lose_next_inserts(&self, n: u64) {
        self.shared.to_lose.store(n, Ordering::SeqCst);
    }

    /// INSERT answers lost so far, and INSERTs forwarded so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.shared.lost.load(Ordering::SeqCst),
            self.shared.inserts.load(Ordering::SeqCst),
        )
    }
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Outcome {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    let params = params(parts.uri.query());
    let resp = shared.upstream.send(&parts, &params, body).await?;
    if is_insert(&params) {
        shared.inserts.fetch_add(1, Ordering::SeqCst);
        let lose = shared
            .to_lose
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lose {
            shared.lost.fetch_add(1, Ordering::SeqCst);
            let status = resp.status();
            return Err(format!("answer lost on purpose (the server said {status})"));
        }
    }
    Ok(resp)
}

//! A network fault, not an engine behaviour: an HTTP proxy in front of a real ClickHouse server
//! that passes everything through unchanged, except that the answers of the next `n` INSERTs
//! are lost. Each such INSERT is forwarded whole and the server's answer awaited (the server
//! has stored the rows), then the client's connection is closed without an answer, as a
//! connection cut after the server committed looks to the client. The client must send the
//! same rows again; with `insert_deduplication_token` the server folds the second copy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

struct Shared {
    upstream: String,
    client: reqwest::Client,
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
    task: tokio::task::JoinHandle<()>,
}

impl LostAnswers {
    /// Starts it on a free loopback port in front of `upstream`, losing nothing yet.
    pub async fn start(upstream: &str) -> LostAnswers {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client: reqwest::Client::builder()
                .no_gzip()
                .timeout(std::time::Duration::from_secs(60))
                .build()
                .unwrap(),
            to_lose: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
        });
        let serving = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let shared = shared.clone();
                        async move { handle(&shared, req).await }
                    });
                    // An error from the service closes the connection without an answer.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        LostAnswers { url, shared, task }
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

impl Drop for LostAnswers {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, String> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    let query = parts.uri.query().unwrap_or("");
    let is_insert = url::form_urlencoded::parse(query.as_bytes())
        .any(|(k, v)| k == "query" && v.trim_start().to_ascii_uppercase().starts_with("INSERT"));
    let mut forward = shared
        .client
        .request(
            parts.method.clone(),
            format!("{}{}", shared.upstream, parts.uri),
        )
        .body(body);
    for (name, value) in &parts.headers {
        if !matches!(
            name.as_str(),
            "host" | "content-length" | "connection" | "transfer-encoding"
        ) {
            forward = forward.header(name, value);
        }
    }
    let resp = forward.send().await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let headers = super::standin::answer_headers(&resp);
    let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
    if is_insert {
        shared.inserts.fetch_add(1, Ordering::SeqCst);
        let lose = shared
            .to_lose
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lose {
            shared.lost.fetch_add(1, Ordering::SeqCst);
            return Err(format!("answer lost on purpose (the server said {status})"));
        }
    }
    let mut out = Response::builder().status(status.as_u16());
    for (k, v) in headers {
        out = out.header(k, v);
    }
    Ok(out.body(Full::new(bytes)).unwrap())
}

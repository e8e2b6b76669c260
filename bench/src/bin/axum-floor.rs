//! The axum floor (issue 53): what the HTTP stack the collector is built on costs alone. axum
//! 0.8 on hyper, the collector's runtime shape (tokio's multi-thread runtime with its default
//! worker count: one per core the process may run on, so one under `taskset -c 0`) and
//! allocator (jemalloc), answering every request with 202 after reading its whole body; nothing
//! else: no parsing, no judging, no spool. The ablation (`scripts/bench.sh --ablation`) runs it
//! beside nginx and the collector, pinned the same way.
//!
//! Usage: `axum-floor ADDR` (e.g. `127.0.0.1:8099`). Exits 1 when it cannot listen.

use axum::{body::Bytes, http::StatusCode, Router};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// 202 once the body is read (axum's `Bytes` extractor reads it whole; its default limit, 2 MiB,
/// is above any beacon the bench sends).
async fn accept(_body: Bytes) -> StatusCode {
    StatusCode::ACCEPTED
}

fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8099".into());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addr).await?;
        axum::serve(listener, Router::new().fallback(accept)).await
    });
    if let Err(e) = served {
        eprintln!("axum-floor: {addr}: {e}");
        std::process::exit(1);
    }
}

//! The HTTP server: shared state, routes, the accept loop with its limits, and drain.
//!
//! Only this module wires the stations together; each endpoint gets what it needs through
//! [`AppState`].

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::MatchedPath;
use axum::http::uri::PathAndQuery;
use axum::http::{Request, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::Service;

use ipnet::IpNet;

use crate::dedup::Dedup;
use crate::endpoints;
use crate::error::error_response;
use crate::limits::Limits;
use crate::metrics::{Metrics, RouteLabel, RouteOnly};
use crate::script::Script;
use crate::settings::SiteSettings;
use crate::spool::Spool;

/// Largest request header section accepted, in bytes (contract §2: up to 16 KiB must pass,
/// more is answered 431).
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Largest request head (request line and headers) hyper parses; beyond, it answers 431
/// itself. The exact 16 KiB header rule is applied after parsing ([`MAX_HEADER_BYTES`]).
const MAX_HEAD_BYTES: usize = MAX_HEADER_BYTES + 8 * 1024;
/// hyper's read buffer bound per connection.
const READ_BUFFER_BYTES: usize = MAX_HEAD_BYTES + 8 * 1024;
/// Most request header lines accepted (hyper answers 431 beyond); 16 KiB of ordinary
/// headers is far fewer lines.
pub const MAX_HEADERS: usize = 512;
/// On shutdown, how long in-flight requests may take to finish.
pub const CONNECTION_DRAIN: Duration = Duration::from_secs(10);
/// Spool room below which `/readyz` answers 503: one full request, re-encoded (or a quarter
/// of a smaller spool).
pub const READY_SPOOL_HEADROOM: u64 = 256 * 1024;

/// State shared by every endpoint. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

/// What [`AppState`] holds.
pub struct Inner {
    /// Site settings (cache over the store).
    pub settings: SiteSettings,
    /// Dedup window.
    pub dedup: Dedup,
    /// Spool appender.
    pub spool: Spool,
    /// Tracking script.
    pub script: Script,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Rate limits and the in-flight bound.
    pub limits: Limits,
    /// Peers whose forwarding headers are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// Bound on receiving a request body.
    pub body_timeout: Duration,
    /// Set once drain begins.
    pub(crate) draining: AtomicBool,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl AppState {
    /// Assembles the shared state.
    pub fn new(inner: Inner) -> Self {
        AppState {
            inner: Arc::new(inner),
        }
    }

    /// Whether drain has begun.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Begins drain: `/readyz` answers 503 from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Why `/readyz` should answer 503, if it should.
    pub fn not_ready_reason(&self) -> Option<&'static str> {
        if self.draining() {
            Some("draining\n")
        } else if let Some(reason) = self.spool.unwritable() {
            Some(reason)
        } else if !self
            .spool
            .has_room(READY_SPOOL_HEADROOM.min(self.spool.max_bytes() / 4))
        {
            Some("spool full\n")
        } else if !self.settings.is_loaded() {
            Some("site settings not loaded\n")
        } else {
            None
        }
    }
}

/// The routes. Every error answer, 404 and 405 included, has a JSON body; no route
/// redirects (a browser would replay a redirected POST as a bodiless GET).
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/script.js", get(endpoints::script::get))
        .route("/api/v1/sites/{key}", get(endpoints::sites::get))
        .route(
            "/api/v1/measurements",
            axum::routing::post(endpoints::intake::post).options(endpoints::intake::preflight),
        )
        .route("/healthz", get(endpoints::ops::healthz))
        .route("/readyz", get(endpoints::ops::readyz))
        .route("/metrics", get(endpoints::ops::metrics))
        .fallback(|| async { error_response(StatusCode::NOT_FOUND, "not found") })
        .method_not_allowed_fallback(|| async {
            error_response(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        })
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

/// Counts every request by route and status and times it.
async fn observe(
    axum::extract::State(state): axum::extract::State<AppState>,
    req: Request<Body>,
    next: Next,
) -> Response {
    let route: &'static str = match req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str)
    {
        Some("/script.js") => "/script.js",
        Some("/api/v1/sites/{key}") => "/api/v1/sites",
        Some("/api/v1/measurements") => "/api/v1/measurements",
        Some("/healthz") => "/healthz",
        Some("/readyz") => "/readyz",
        Some("/metrics") => "/metrics",
        _ => "other",
    };
    let start = Instant::now();
    let response = next.run(req).await;
    state
        .metrics
        .http_requests
        .get_or_create(&RouteLabel {
            route,
            status: response.status().as_u16(),
        })
        .inc();
    state
        .metrics
        .http_duration
        .get_or_create(&RouteOnly { route })
        .observe(start.elapsed().as_secs_f64());
    response
}

/// Connection-level limits of [`serve`].
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Open connections at most; more are closed at accept.
    pub max_connections: usize,
    /// Time to send complete request headers, and keep-alive idle timeout.
    pub header_timeout: Duration,
}

/// Serves `router` on `listener` until `close` resolves; then stops accepting, lets in-flight
/// requests finish (at most [`CONNECTION_DRAIN`]) and returns.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    close: impl Future<Output = ()>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    // hyper starts the header timer whenever it waits for a request head, including between
    // keep-alive requests, so it also closes idle connections.
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(MAX_HEAD_BYTES)
        .max_buf_size(READ_BUFFER_BYTES)
        .max_headers(MAX_HEADERS)
        .keep_alive(true);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(close);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    crate::logging::warn_limited("accept", || tracing::warn!(error = %e, "accept failed"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut close => break,
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            metrics.connections_refused.inc();
            crate::logging::warn_limited("connection_limit", || {
                tracing::warn!("connection limit reached; closing new connections")
            });
            drop(stream);
            continue;
        };
        metrics.open_connections.inc();
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let mut router = router.clone();
            async move {
                if header_bytes(&req) > MAX_HEADER_BYTES {
                    return Ok(error_response(
                        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                        "request headers larger than 16 KiB",
                    ));
                }
                normalise_path(req.uri_mut());
                router.call(req.map(Body::new)).await
            }
        });
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _ = conn.await;
            metrics.open_connections.dec();
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(CONNECTION_DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("in-flight requests did not finish within the drain limit");
    }
}

/// Collapses repeated slashes and drops a trailing one (`//api/v1/measurements/` is
/// `/api/v1/measurements`), before routing: proxies and hand-written URLs produce both, and
/// the contract (§2) wants them to reach the endpoint rather than a 404 or a redirect.
fn normalise_path(uri: &mut Uri) {
    let path = uri.path();
    if !path.contains("//") && (path.len() == 1 || !path.ends_with('/')) {
        return;
    }
    let mut normal = String::with_capacity(path.len());
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        normal.push('/');
        normal.push_str(segment);
    }
    if normal.is_empty() {
        normal.push('/');
    }
    if let Some(query) = uri.query() {
        normal.push('?');
        normal.push_str(query);
    }
    let mut parts = std::mem::take(uri).into_parts();
    // Made of the pieces of a valid path and query: it parses.
    parts.path_and_query = PathAndQuery::from_maybe_shared(normal).ok();
    *uri = Uri::from_parts(parts).unwrap_or_default();
}

fn header_bytes<B>(req: &Request<B>) -> usize {
    req.headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_with_repeated_and_trailing_slashes_are_normalised() {
        for (sent, routed) in [
            ("/api/v1/measurements", "/api/v1/measurements"),
            ("//api/v1/measurements", "/api/v1/measurements"),
            ("/api/v1/measurements/", "/api/v1/measurements"),
            ("//api//v1///measurements//", "/api/v1/measurements"),
            ("/script.js?v=2", "/script.js?v=2"),
            ("//script.js/?v=2", "/script.js?v=2"),
            ("/", "/"),
            ("//", "/"),
        ] {
            let mut uri: Uri = sent.parse().unwrap();
            normalise_path(&mut uri);
            assert_eq!(uri.to_string(), routed, "{sent}");
        }
        let mut absolute: Uri = "http://collector.example//readyz/".parse().unwrap();
        normalise_path(&mut absolute);
        assert_eq!(absolute.to_string(), "http://collector.example/readyz");
    }
}

//! `GET /healthz`, `GET /readyz`, `GET /metrics` (contract §2, "Operations").

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::error_response;
use crate::state::AppState;

/// Spool room below which `/readyz` answers 503: one full request, re-encoded (or a quarter
/// of a smaller spool).
pub const READY_SPOOL_HEADROOM: u64 = 256 * 1024;

/// 200 while the process runs.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// The operations listener's `/readyz`: 200 while the collector accepts traffic; 503 (with the
/// JSON error body every error answer has, naming the reason) while draining or unable to
/// accept durably: every shard's spool full, a spool unable to write (a full disk), the site
/// settings never loaded.
pub async fn readyz(State(state): State<AppState>) -> Response {
    match not_ready_reason(&state) {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(reason) => error_response(StatusCode::SERVICE_UNAVAILABLE, reason.trim_end()),
    }
}

/// The public listener's `/readyz` (what load balancers ask): the same status, no reason in
/// the body (contract v4: why a collector cannot accept is for its operators).
pub async fn readyz_status(State(state): State<AppState>) -> Response {
    match not_ready_reason(&state) {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(_) => error_response(StatusCode::SERVICE_UNAVAILABLE, "not ready"),
    }
}

/// Why `/readyz` should answer 503, if it should.
fn not_ready_reason(state: &AppState) -> Option<&'static str> {
    if state.draining() {
        Some("draining\n")
    } else if let Some(reason) = state.storage.spools.unwritable() {
        Some(reason)
    } else if !state
        .storage
        .spools
        .any_has_room(|s| READY_SPOOL_HEADROOM.min(s.max_bytes() / 4))
    {
        // One shard's spool full (its replicas down) is that shard's sites' 503, not a
        // reason to take the collector out of the balancer (contract v5 §3).
        Some("spool full\n")
    } else if !state.sites.settings.is_loaded() {
        Some("site settings not loaded\n")
    } else {
        None
    }
}

/// Prometheus text exposition.
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

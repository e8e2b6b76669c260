//! `GET /healthz`, `GET /readyz`, `GET /metrics` (contract §2, "Operations").

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::error_response;

use crate::server::AppState;

/// 200 while the process runs.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// 200 while the collector accepts traffic; 503 (with the JSON error body every error answer
/// has, naming the reason) while draining or unable to accept durably: the spool full, the
/// spool unable to write (a full disk), the site settings never loaded.
pub async fn readyz(State(state): State<AppState>) -> Response {
    match state.not_ready_reason() {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(reason) => error_response(StatusCode::SERVICE_UNAVAILABLE, reason.trim_end()),
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

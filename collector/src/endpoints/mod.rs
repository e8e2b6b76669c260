//! The routes, and one file per endpoint, as in Sentry Relay: each handler reads
//! [`crate::state::AppState`] and answers; intake errors go through
//! [`crate::error::IntakeError`].
//!
//! [`router`] is what [`crate::server::serve`] serves; the server knows nothing of the routes
//! or the state, and nothing here knows the server.

pub mod intake;
pub mod ops;
pub mod script;
pub mod sites;

use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, State};
use axum::http::{Request, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

use crate::error::error_response;
use crate::metrics::{RouteLabel, RouteOnly};
use crate::state::AppState;

/// The public routes (`COLLECTOR_LISTEN`): the script, site settings, intake, and `/healthz`
/// and `/readyz` with their status only (contract v4: `/metrics` is 404 here). Every error
/// answer, 404 and 405 included, has a JSON body; no route redirects (a browser would replay
/// a redirected POST as a bodiless GET).
pub fn router(state: AppState) -> Router {
    finish(
        Router::new()
            .route("/script.js", get(script::get))
            .route("/api/v1/sites/{key}", get(sites::get))
            .route(
                "/api/v1/measurements",
                post(intake::post).options(intake::preflight),
            )
            .route("/healthz", get(ops::healthz))
            .route("/readyz", get(ops::readyz_status)),
        state,
    )
}

/// The operations routes (`COLLECTOR_ADMIN_LISTEN`, private): `/metrics`, `/healthz`, and
/// `/readyz` with its reason.
pub fn admin_router(state: AppState) -> Router {
    finish(
        Router::new()
            .route("/healthz", get(ops::healthz))
            .route("/readyz", get(ops::readyz))
            .route("/metrics", get(ops::metrics)),
        state,
    )
}

/// The JSON 404 and 405, the counting of every request, the state.
fn finish(routes: Router<AppState>, state: AppState) -> Router {
    routes
        .fallback(|| async { error_response(StatusCode::NOT_FOUND, "not found") })
        .method_not_allowed_fallback(|| async {
            error_response(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        })
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

/// Counts every request by route and status and times it.
async fn observe(State(state): State<AppState>, req: Request<Body>, next: Next) -> Response {
    let route: &'static str = match req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str)
    {
        Some("/script.js") => "/script.js",
        Some("/api/v1/sites/{key}") => "/api/v1/sites",
        Some("/api/v1/measurements") => crate::metrics::INTAKE_ROUTE,
        Some("/healthz") => "/healthz",
        Some("/readyz") => "/readyz",
        Some("/metrics") => "/metrics",
        _ => "other",
    };
    let start = Instant::now();
    let response = next.run(req).await;
    state
        .metrics
        .http
        .requests
        .get_or_create(&RouteLabel {
            route,
            status: response.status().as_u16(),
        })
        .inc();
    state
        .metrics
        .http
        .duration
        .get_or_create(&RouteOnly { route })
        .observe(start.elapsed().as_secs_f64());
    response
}

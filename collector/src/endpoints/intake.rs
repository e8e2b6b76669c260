//! `POST /api/v1/measurements` and its `OPTIONS` preflight (contract §2).
//!
//! The one way through: headers → body (bounded) → decode → validate → site settings and
//! origin → dedup claim → spool append (durable) → 202. Nothing is stored unless the request
//! as a whole is answered 202, and a 202 is only sent once the spool holds every measurement
//! it counts as accepted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::beacon::{self, Context, Valid, MAX_BODY_BYTES};
use crate::client_ip::client_ip;
use crate::dedup::{Claim, ClaimGuard};
use crate::error::{IntakeError, Rejected};
use crate::server::AppState;
use crate::settings::{Lookup, Site};
use crate::spool::AppendError;

/// How long a request waits for its spool append to become durable before answering 503.
pub const APPEND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request waits for another request that holds the same id.
pub const CLAIM_WAIT: Duration = Duration::from_secs(5);
/// `Retry-After` of a 503.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The 202 answer.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Accepted {
    /// Measurements made durable by this request.
    pub accepted: usize,
    /// Measurements already durable from an earlier request.
    pub duplicates: usize,
    /// Measurements rejected, with why.
    pub rejected: Vec<RejectedItem>,
    /// Optional fields dropped as invalid.
    pub dropped_fields: Vec<DroppedField>,
}

/// One rejected measurement in a 202 body.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RejectedItem {
    /// Index in the request array.
    pub index: usize,
    /// Reason.
    pub error: String,
}

/// One dropped field in a 202 body.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DroppedField {
    /// Index in the request array.
    pub index: usize,
    /// Field name.
    pub field: String,
}

/// Query parameters of the preflight: `site` lets it judge the origin by that site's list.
#[derive(Debug, Deserialize)]
pub struct PreflightQuery {
    site: Option<String>,
}

/// `POST /api/v1/measurements`.
pub async fn post(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let origin = headers.get(header::ORIGIN).cloned();
    let client = client_ip(peer.ip(), &headers, &state.trusted_proxies);
    let result = match state.limits.check_client(client) {
        Ok(()) => accept(&state, &headers, body).await,
        Err(wait) => Err(IntakeError::RateLimited(wait)),
    };
    if matches!(result, Err(IntakeError::RateLimited(_))) {
        state.metrics.rate_limited.inc();
    }
    let mut response = match result {
        Ok(body) => (StatusCode::ACCEPTED, axum::Json(body)).into_response(),
        Err(e) => {
            if e.status().is_server_error() {
                crate::logging::warn_limited(
                    "intake_unavailable",
                    || tracing::warn!(error = %e, "intake answered 503"),
                );
            }
            e.into_response()
        }
    };
    if let Some(origin) = origin {
        if response.status() != StatusCode::FORBIDDEN {
            cors(response.headers_mut(), origin);
        }
    }
    response
}

/// Echoes an origin (never `*`: `sendBeacon` sends credentials, and a wildcard would be
/// refused for credentialed requests by the CORS rules of the Fetch Standard).
fn cors(headers: &mut HeaderMap, origin: HeaderValue) {
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
        HeaderValue::from_static("true"),
    );
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
}

/// `OPTIONS /api/v1/measurements`: answered for allowed origins. Without `?site=` the origin
/// cannot be judged yet; the POST itself is then checked against the site's list.
pub async fn preflight(
    State(state): State<AppState>,
    Query(q): Query<PreflightQuery>,
    headers: HeaderMap,
) -> Response {
    let Some(origin) = headers.get(header::ORIGIN).cloned() else {
        return StatusCode::NO_CONTENT.into_response();
    };
    if let Some(site) = q.site.as_deref().filter(|s| beacon::is_site_key(s)) {
        let allowed = match state.settings.lookup(site).await {
            Lookup::Known(s) => s.enabled && s.allows_origin(origin.to_str().ok()),
            Lookup::Unknown => false,
            Lookup::Unavailable => true,
        };
        if !allowed {
            return StatusCode::FORBIDDEN.into_response();
        }
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    let h = response.headers_mut();
    cors(h, origin);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("POST, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("Content-Type, Content-Encoding"),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    response
}

async fn accept(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Accepted, IntakeError> {
    if !beacon::content_type_ok(headers.get(header::CONTENT_TYPE).map(HeaderValue::as_bytes)) {
        return Err(IntakeError::UnsupportedMedia("Content-Type"));
    }
    let encoding = beacon::encoding(
        headers
            .get(header::CONTENT_ENCODING)
            .map(HeaderValue::as_bytes),
    )
    .ok_or(IntakeError::UnsupportedMedia("Content-Encoding"))?;
    // While draining, intake goes on until the listener closes: /readyz already turned 503 so
    // that load balancers move traffic away, and a beacon refused now would not be resent.

    // The body limit applies to the bytes on the wire too: at most 64 KiB are ever buffered.
    let raw = match tokio::time::timeout(
        state.body_timeout,
        axum::body::to_bytes(body, MAX_BODY_BYTES),
    )
    .await
    {
        Ok(Ok(raw)) => raw,
        Ok(Err(e)) if is_length_limit(&e) => return Err(IntakeError::TooLarge),
        Ok(Err(_)) => return Err(IntakeError::Malformed("body could not be read".into())),
        Err(_) => return Err(IntakeError::Malformed("body not received in time".into())),
    };
    let inflated = beacon::inflate(&raw, encoding)?;
    let items = beacon::parse(&inflated)?;

    let received_at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let user_agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let ctx = Context {
        received_at_ms,
        user_agent,
    };

    let mut rejected: Vec<Rejected> = Vec::new();
    let mut valid: Vec<(usize, Valid)> = Vec::with_capacity(items.len());
    for (index, item) in items.into_iter().enumerate() {
        match beacon::validate(item, &ctx) {
            Ok(v) => valid.push((index, v)),
            Err(error) => rejected.push(Rejected { index, error }),
        }
    }

    // Site settings, once per distinct site in the request.
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    let mut sites: HashMap<&str, Option<Arc<Site>>> = HashMap::new();
    for (_, v) in &valid {
        let key = v.measurement.site.as_str();
        if sites.contains_key(key) {
            continue;
        }
        let site = match state.settings.lookup(key).await {
            Lookup::Known(site) if site.enabled => Some(site),
            Lookup::Known(_) | Lookup::Unknown => None,
            Lookup::Unavailable => {
                return Err(IntakeError::Unavailable(
                    "settings store unavailable",
                    RETRY_AFTER,
                ))
            }
        };
        if let Some(site) = &site {
            if !site.allows_origin(origin) {
                return Err(IntakeError::OriginNotAllowed(site.key.clone()));
            }
        }
        sites.insert(key, site);
    }
    let known: Vec<bool> = valid
        .iter()
        .map(|(_, v)| sites[v.measurement.site.as_str()].is_some())
        .collect();
    let mut site_rejected = false;
    let mut keep = known.iter();
    valid.retain(|(index, _)| {
        let ok = *keep.next().expect("same length");
        if !ok {
            rejected.push(Rejected {
                index: *index,
                error: "unknown or disabled site",
            });
            site_rejected = true;
        }
        ok
    });
    rejected.sort_by_key(|r| r.index);
    if valid.is_empty() {
        for r in &rejected {
            state.metrics.reject(r.error);
        }
        return Err(if site_rejected {
            IntakeError::UnknownSite(rejected)
        } else {
            IntakeError::NoValidMeasurement(rejected)
        });
    }

    // Per-site rates, counted in measurements.
    let mut per_site: HashMap<&String, u32> = HashMap::new();
    for (_, v) in &valid {
        *per_site.entry(&v.measurement.site).or_default() += 1;
    }
    for (site, n) in per_site {
        state
            .limits
            .check_site(site, n)
            .map_err(IntakeError::RateLimited)?;
    }

    // Dedup: claim each id; within one request a repeated id is a duplicate of the first.
    let mut duplicates = 0;
    let mut guards: Vec<ClaimGuard> = Vec::with_capacity(valid.len());
    let mut to_store = Vec::with_capacity(valid.len());
    let mut seen = std::collections::HashSet::with_capacity(valid.len());
    let mut dropped_fields = Vec::new();
    let mut skewed = 0;
    for (index, v) in valid {
        for field in &v.dropped {
            dropped_fields.push(DroppedField {
                index,
                field: (*field).to_owned(),
            });
        }
        skewed += v.clock_skewed as u64;
        if !seen.insert(v.measurement.id) {
            duplicates += 1;
            continue;
        }
        match state.dedup.claim(v.measurement.id) {
            Claim::New(guard) => {
                guards.push(guard);
                to_store.push(v.measurement);
            }
            Claim::Duplicate => duplicates += 1,
            Claim::InFlight(other) => {
                if other.wait(CLAIM_WAIT).await {
                    duplicates += 1;
                } else {
                    to_store.push(v.measurement);
                }
            }
        }
    }

    if !to_store.is_empty() {
        match state.spool.append(&to_store, APPEND_TIMEOUT).await {
            Ok(()) => {}
            Err(AppendError::Full) => {
                return Err(IntakeError::Unavailable("spool full", RETRY_AFTER))
            }
            Err(AppendError::Overloaded) => {
                state.metrics.shed.inc();
                return Err(IntakeError::Unavailable("overloaded", RETRY_AFTER));
            }
            Err(AppendError::Io) => {
                return Err(IntakeError::Unavailable("spool write failed", RETRY_AFTER))
            }
        }
    }
    for guard in guards {
        guard.commit();
    }

    let m = &state.metrics;
    m.accepted.inc_by(to_store.len() as u64);
    m.duplicate.inc_by(duplicates as u64);
    m.clock_skew.inc_by(skewed);
    for r in &rejected {
        m.reject(r.error);
    }
    for d in &dropped_fields {
        m.drop_field(&d.field);
    }
    Ok(Accepted {
        accepted: to_store.len(),
        duplicates,
        rejected: rejected
            .into_iter()
            .map(|r| RejectedItem {
                index: r.index,
                error: r.error.to_owned(),
            })
            .collect(),
        dropped_fields,
    })
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}

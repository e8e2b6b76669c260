//! `POST /api/v1/measurements` and its `OPTIONS` preflight (contract §2).
//!
//! The one way through, one station per function of [`accept`]: receive (headers, bounded
//! body) → decode → validate → site settings and origin → rates → dedup claim → spool append
//! (durable) → 202. Nothing is stored unless the request as a whole is answered 202, and a
//! 202 is only sent once the spool holds every measurement it counts as accepted.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::beacon::{self, Context, Encoding, Item, Valid, MAX_BODY_BYTES};
use crate::client_ip::client_ip;
use crate::dedup::{Claim, ClaimGuard};
use crate::error::{IntakeError, Rejected};
use crate::measurement::{EncodedRows, Measurement};
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
    let result = accept(&state, peer.ip(), &headers, body).await;
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
    // Every answer is readable by the page, a 403 too: it says only that the site or origin
    // is refused, and a script that cannot read it takes it for a network error and sends
    // again (three requests per page view on a refused origin).
    if let Some(origin) = origin {
        cors(response.headers_mut(), origin);
    }
    response
}

/// Echoes an origin (never `*`: `sendBeacon` sends credentials, and a wildcard would be
/// refused for credentialed requests by the CORS rules of the Fetch Standard).
pub(crate) fn cors(headers: &mut HeaderMap, origin: HeaderValue) {
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
        HeaderValue::from_static("true"),
    );
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
    // The script waits `Retry-After` before its one retry of a 429 or 503; a cross-origin
    // script can read only the headers listed here (Fetch Standard, CORS-safelisted
    // response-header names).
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("Retry-After"),
    );
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
            return IntakeError::OriginNotAllowed(site.to_owned()).into_response();
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

/// The stations of an intake request, in order; each returns what the next one needs or the
/// answer that ends the request.
async fn accept(
    state: &AppState,
    peer: IpAddr,
    headers: &HeaderMap,
    body: Body,
) -> Result<Accepted, IntakeError> {
    let (raw, encoding) = receive(state, headers, body).await?;
    // `COLLECTOR_MAX_IN_FLIGHT` bounds the work, not the waiting: a request still sending its
    // body (bounded by the body timeout and the connection limit) holds no slot, so a few
    // slow senders cannot make every other beacon a 503. Beyond the bound: 503 at once.
    let _permit = state.limits.enter().ok_or_else(|| {
        state.metrics.shed.inc();
        IntakeError::Unavailable("overloaded", std::time::Duration::from_secs(1))
    })?;
    let inflated = beacon::inflate(&raw, encoding)?;
    let text = beacon::text(&inflated);
    let items = beacon::parse(&text)?;
    let mut report = Report::default();
    let user_agent = beacon::user_agent(headers.get(header::USER_AGENT).map(HeaderValue::as_bytes));
    let valid = validate(items, &user_agent, &mut report);
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    let valid = judge_sites(state, origin, valid, &mut report).await?;
    check_rates(state, peer, headers, &valid)?;
    let (to_store, guards) = claim(state, valid, &mut report).await;
    append(state, &to_store).await?;
    for guard in guards {
        guard.commit();
    }
    Ok(report.finish(state, to_store.len()))
}

/// Judges the headers and reads the body, at most [`MAX_BODY_BYTES`] of it, within the body
/// timeout. A `Content-Length` over the limit is answered 413 before any of the
/// body is read: a client announcing a large body is not kept waiting for it.
async fn receive(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Bytes, Encoding), IntakeError> {
    if !beacon::content_type_ok(headers.get(header::CONTENT_TYPE).map(HeaderValue::as_bytes)) {
        return Err(IntakeError::UnsupportedMedia("Content-Type"));
    }
    let encoding = beacon::encoding(
        headers
            .get(header::CONTENT_ENCODING)
            .map(HeaderValue::as_bytes),
    )
    .ok_or(IntakeError::UnsupportedMedia("Content-Encoding"))?;
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        // A client told to wait (`Expect: 100-continue`) sends nothing more; any other may be
        // sending still, and closing on unread bytes makes the kernel reset the connection,
        // which can destroy the 413 before the client reads it ("lingering close", as nginx
        // does it): so the rest is read and thrown away, bounded, after the answer.
        if !headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
        {
            tokio::spawn(discard(body, state.body_timeout));
        }
        return Err(IntakeError::TooLarge);
    }
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
    Ok((raw, encoding))
}

/// Most bytes of a refused body read and thrown away after its 413 ([`discard`]).
pub const DISCARD_MAX_BYTES: usize = 1024 * 1024;

/// Reads and drops a body, at most [`DISCARD_MAX_BYTES`] of it and for at most `limit`.
async fn discard(mut body: Body, limit: Duration) {
    use http_body_util::BodyExt;
    let mut left = DISCARD_MAX_BYTES;
    let _ = tokio::time::timeout(limit, async {
        while let Some(Ok(frame)) = body.frame().await {
            let n = frame.data_ref().map_or(0, |d| d.len());
            if n >= left {
                return;
            }
            left -= n;
        }
    })
    .await;
}

/// What the 202 reports besides the count accepted, gathered station by station.
#[derive(Default)]
struct Report {
    rejected: Vec<Rejected>,
    dropped_fields: Vec<DroppedField>,
    clock_skewed: u64,
    duplicates: usize,
}

impl Report {
    /// Counts everything in the metrics and makes the 202 body.
    fn finish(mut self, state: &AppState, accepted: usize) -> Accepted {
        self.rejected.sort_by_key(|r| r.index);
        let m = &state.metrics;
        m.accepted.inc_by(accepted as u64);
        m.duplicate.inc_by(self.duplicates as u64);
        m.clock_skew.inc_by(self.clock_skewed);
        for r in &self.rejected {
            m.reject(r.error);
        }
        for d in &self.dropped_fields {
            m.drop_field(&d.field);
        }
        Accepted {
            accepted,
            duplicates: self.duplicates,
            rejected: self
                .rejected
                .into_iter()
                .map(|r| RejectedItem {
                    index: r.index,
                    error: r.error.to_owned(),
                })
                .collect(),
            dropped_fields: self.dropped_fields,
        }
    }
}

/// Validates every item; the rejected ones go to the report.
fn validate<'a>(
    items: Vec<Item<'a>>,
    user_agent: &'a str,
    report: &mut Report,
) -> Vec<(usize, Valid<'a>)> {
    let ctx = Context {
        received_at_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64),
        user_agent,
    };
    let mut valid = Vec::with_capacity(items.len());
    for (index, item) in items.into_iter().enumerate() {
        match beacon::validate(item, &ctx) {
            Ok(v) => valid.push((index, v)),
            Err(error) => report.rejected.push(Rejected { index, error }),
        }
    }
    valid
}

/// Looks up each distinct site once: measurements of unknown or disabled sites are rejected,
/// an `Origin` a known site does not allow refuses the whole request (403), and each kept
/// measurement gets its site's `sample_rate`. With nothing left, the request is answered 403
/// (a site was the reason) or 400.
async fn judge_sites<'a>(
    state: &AppState,
    origin: Option<&str>,
    valid: Vec<(usize, Valid<'a>)>,
    report: &mut Report,
) -> Result<Vec<(usize, Valid<'a>)>, IntakeError> {
    let mut sites: HashMap<String, Option<Arc<Site>>> = HashMap::new();
    for (_, v) in &valid {
        let key: &str = &v.measurement.site;
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
        sites.insert(key.to_owned(), site);
    }
    let mut kept = Vec::with_capacity(valid.len());
    let mut site_rejected = false;
    for (index, mut v) in valid {
        match &sites[&*v.measurement.site] {
            Some(site) => {
                v.measurement.sample_rate = site.sample_rate;
                kept.push((index, v));
            }
            None => {
                report.rejected.push(Rejected {
                    index,
                    error: "unknown or disabled site",
                });
                site_rejected = true;
            }
        }
    }
    if kept.is_empty() {
        report.rejected.sort_by_key(|r| r.index);
        let rejected = std::mem::take(&mut report.rejected);
        for r in &rejected {
            state.metrics.reject(r.error);
        }
        return Err(if site_rejected {
            IntakeError::UnknownSite(rejected)
        } else {
            IntakeError::NoValidMeasurement(rejected)
        });
    }
    Ok(kept)
}

/// Per-site rates, counted in measurements, and, when `COLLECTOR_CLIENT_RATE` is on, one
/// request per site for this client.
fn check_rates(
    state: &AppState,
    peer: IpAddr,
    headers: &HeaderMap,
    valid: &[(usize, Valid<'_>)],
) -> Result<(), IntakeError> {
    let mut per_site: HashMap<&str, u32> = HashMap::new();
    for (_, v) in valid {
        *per_site.entry(&*v.measurement.site).or_default() += 1;
    }
    let client = state
        .limits
        .client_rate_on()
        .then(|| client_ip(peer, headers, &state.trusted_proxies));
    for (site, n) in per_site {
        if let Some(client) = client {
            state
                .limits
                .check_client(site, client)
                .map_err(IntakeError::RateLimited)?;
        }
        state
            .limits
            .check_site(site, n)
            .map_err(IntakeError::RateLimited)?;
    }
    Ok(())
}

/// Claims each id in the dedup window; within one request a repeated id is a duplicate of the
/// first. Returns the measurements to store and the claims to commit once they are durable.
async fn claim<'a>(
    state: &AppState,
    valid: Vec<(usize, Valid<'a>)>,
    report: &mut Report,
) -> (Vec<Measurement<'a>>, Vec<ClaimGuard>) {
    let mut guards = Vec::with_capacity(valid.len());
    let mut to_store = Vec::with_capacity(valid.len());
    let mut seen = HashSet::with_capacity(valid.len());
    for (index, v) in valid {
        for field in &v.dropped {
            report.dropped_fields.push(DroppedField {
                index,
                field: (*field).to_owned(),
            });
        }
        report.clock_skewed += v.clock_skewed as u64;
        if !seen.insert(v.measurement.id) {
            report.duplicates += 1;
            continue;
        }
        match state.dedup.claim(v.measurement.id) {
            Claim::New(guard) => {
                guards.push(guard);
                to_store.push(v.measurement);
            }
            Claim::Duplicate => report.duplicates += 1,
            Claim::InFlight(other) => {
                if other.wait(CLAIM_WAIT).await {
                    report.duplicates += 1;
                } else {
                    to_store.push(v.measurement);
                }
            }
        }
    }
    (to_store, guards)
}

/// Encodes the rows (once: the spool keeps them as the writer sends them), appends them to
/// the spool and waits until they are durable.
async fn append(state: &AppState, to_store: &[Measurement<'_>]) -> Result<(), IntakeError> {
    if to_store.is_empty() {
        return Ok(());
    }
    let rows = EncodedRows::encode(to_store);
    match state.spool.append(rows, APPEND_TIMEOUT).await {
        Ok(()) => Ok(()),
        Err(AppendError::Full) => Err(IntakeError::Unavailable("spool full", RETRY_AFTER)),
        Err(AppendError::QueueFull) => {
            state.metrics.shed.inc();
            Err(IntakeError::Unavailable("overloaded", RETRY_AFTER))
        }
        Err(AppendError::SyncTimeout) => Err(IntakeError::Unavailable(
            "spool write timed out",
            RETRY_AFTER,
        )),
        Err(AppendError::DiskFull) => Err(IntakeError::Unavailable(
            "spool cannot write: disk full",
            RETRY_AFTER,
        )),
        Err(AppendError::Io) => Err(IntakeError::Unavailable("spool write failed", RETRY_AFTER)),
    }
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

//! `POST /api/v1/measurements` and its `OPTIONS` preflight (contract §2).
//!
//! The one way through: [`post`] receives (headers, bounded body), then [`accept`] calls the
//! stations in order, one call each ([`stations`]): enter (the in-flight bound) → decode →
//! judge → site (settings, origin, shard, the site's rules) → shed → rate → claim (dedup) →
//! append (the spool, durable) → 202. Nothing is stored unless the request as a whole is
//! answered 202, and a 202 is only sent once the spool holds every measurement it counts as
//! accepted.
//!
//! Each station returns what the next one needs or the [`IntakeError`] that ends the request.
//! What a request came to, an [`Accepted`] report or that error, is counted in the metrics in
//! one place (`count`) and answered in one (`answer`).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::beacon::media::{self, Encoding};
use crate::beacon::{self, MAX_BODY_BYTES};
use crate::error::IntakeError;
use crate::metrics::Metrics;
use crate::settings::Lookup;
use crate::state::AppState;
use stations::Sender;

mod stations;

pub use stations::{
    Accepted, DroppedField, APPEND_TIMEOUT, CLAIM_WAIT, FIRST_FETCH_RETRY_AFTER, RETRY_AFTER,
};

/// Query parameters of the preflight: `site` lets it judge the origin by that site's list.
#[derive(Debug, Deserialize)]
pub struct PreflightQuery {
    site: Option<String>,
}

/// `POST /api/v1/measurements`.
///
/// Once the body has arrived whole, the request is finished in a task of its own
/// ([`crate::state::Inner::requests`]): a browser that quits closes its connections right after sending,
/// and hyper then drops this handler's future. The task stores the measurements and counts them
/// whether or not anyone reads the answer (contract v3, §2 metrics), and the drain waits for it.
pub async fn post(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let origin = headers.get(header::ORIGIN).cloned();
    let outcome = match receive(&state, &headers, body).await {
        Ok((raw, encoding)) => {
            let task_state = state.clone();
            let finish = state.requests.spawn(async move {
                let outcome = match accept(&task_state, peer.ip(), &headers, &raw, encoding).await {
                    // The body and the headers go before the wait for the sync: a request
                    // waiting holds its claims and its report only.
                    Ok((report, joined)) => {
                        drop((headers, raw));
                        joined
                            .stored()
                            .await
                            .map(|accepted| Accepted { accepted, ..report })
                    }
                    Err(e) => Err(e),
                };
                count(&task_state.metrics, &outcome);
                outcome
            });
            // A panic in a station is a bug; the client gets a retryable answer.
            finish
                .await
                .unwrap_or(Err(IntakeError::Unavailable("internal error", RETRY_AFTER)))
        }
        refused => {
            let refused = refused.map(|_| Accepted::default());
            count(&state.metrics, &refused);
            refused
        }
    };
    let mut response = answer(outcome);
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

/// `OPTIONS /api/v1/measurements`: answered for allowed origins. With `?site=KEY`, by that
/// site's list; without it, only for an origin some site lists (contract v5 §2,
/// [`crate::settings::SiteSettings::lists_origin`]): anything else is 403 without CORS headers,
/// so that a page of no shop gets no credentialed answer. The POST itself is checked against
/// its site's list.
pub async fn preflight(
    State(state): State<AppState>,
    Query(q): Query<PreflightQuery>,
    headers: HeaderMap,
) -> Response {
    let Some(origin) = headers.get(header::ORIGIN).cloned() else {
        return StatusCode::NO_CONTENT.into_response();
    };
    if let Some(site) = q.site.as_deref().filter(|s| beacon::is_site_key(s)) {
        let allowed = match state.sites.settings.lookup(site).await {
            Lookup::Known(s) => s.enabled && s.allows_origin(origin.to_str().ok()),
            Lookup::Unknown => false,
            Lookup::Unavailable | Lookup::Limited => true,
        };
        if !allowed {
            return IntakeError::OriginNotAllowed(site.to_owned()).into_response();
        }
    } else if !origin
        .to_str()
        .is_ok_and(|o| state.sites.settings.lists_origin(o))
    {
        return crate::error::error_response(
            StatusCode::FORBIDDEN,
            "origin listed by no site; name the site: OPTIONS ...?site=KEY",
        );
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

/// The stations of an intake request after its body arrived, in order, one call each; each
/// returns what the next one needs or the error that ends the request. Ends with the
/// request's records in their spools' open groups: the report so far, and what waits for
/// their syncs ([`stations::Joined::stored`]).
async fn accept(
    state: &AppState,
    peer: IpAddr,
    headers: &HeaderMap,
    raw: &[u8],
    encoding: Encoding,
) -> Result<(Accepted, stations::Joined), IntakeError> {
    let place = stations::enter(state)?;
    let text = stations::decode(raw, encoding)?;
    let sender = Sender::of(state, peer, headers);
    let mut report = Accepted::default();
    let judged = stations::judge(&text, &sender, &mut report)?;
    let sited = stations::site(state, &sender, judged, &mut report).await?;
    stations::shed(state, &sited)?;
    stations::rate(state, &sender, &sited)?;
    let claimed = stations::claim(state, sited, &mut report).await;
    let joined = stations::append(state, claimed, place);
    Ok((report, joined))
}

/// Counts what a request came to in the metrics; the only place intake counts (requests by
/// route and status are counted by the router's `observe`). A 202 counts its measurements
/// accepted, duplicate, clock-skewed and rejected (by reason), and its dropped fields; a 400
/// or 403 for want of any valid measurement counts its rejections; a 429 counts as rate
/// limited and a shed 503 as shed. Any other refusal counts none of its measurements.
fn count(metrics: &Metrics, outcome: &Result<Accepted, IntakeError>) {
    match outcome {
        Ok(report) => {
            metrics.intake.accepted.inc_by(report.accepted as u64);
            metrics.intake.duplicate.inc_by(report.duplicates as u64);
            metrics.intake.clock_skew.inc_by(report.clock_skewed);
            for r in &report.rejected {
                metrics.intake.reject(r.error);
            }
            for d in &report.dropped_fields {
                metrics.intake.drop_field(d.metric_label());
            }
        }
        Err(IntakeError::NoValidMeasurement(rejected) | IntakeError::UnknownSite(rejected)) => {
            for r in rejected {
                metrics.intake.reject(r.error);
            }
        }
        Err(IntakeError::RateLimited(_)) => {
            metrics.http.rate_limited.inc();
        }
        Err(IntakeError::OverShare(_)) => {
            metrics.http.rate_limited.inc();
            metrics.http.over_share.inc();
        }
        Err(IntakeError::Overloaded(_)) => {
            metrics.http.shed.inc();
        }
        Err(IntakeError::UnknownShard(n, _)) => {
            for _ in 0..*n {
                metrics.intake.reject(beacon::UNKNOWN_SHARD);
            }
        }
        Err(_) => {}
    }
}

/// The answer to what a request came to: 202 with the report as its body, or the error's
/// status, JSON body and `Retry-After`. A 503 is logged (rate-limited): the collector could
/// not take what it was sent.
fn answer(outcome: Result<Accepted, IntakeError>) -> Response {
    match outcome {
        Ok(report) => (StatusCode::ACCEPTED, axum::Json(report)).into_response(),
        Err(e) => {
            if e.status().is_server_error() {
                crate::logging::warn_limited(
                    "intake_unavailable",
                    || tracing::warn!(error = %e, "intake answered 503"),
                );
            }
            e.into_response()
        }
    }
}

/// Receive: judges the headers and reads the body, at most [`MAX_BODY_BYTES`] of it, within
/// the body timeout. A `Content-Length` over the limit is answered 413 before any of the
/// body is read: a client announcing a large body is not kept waiting for it.
async fn receive(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Bytes, Encoding), IntakeError> {
    if !media::content_type_ok(headers.get(header::CONTENT_TYPE).map(HeaderValue::as_bytes)) {
        return Err(IntakeError::UnsupportedMedia("Content-Type"));
    }
    let encoding = media::encoding(
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
            tokio::spawn(discard(body, state.bounds.body_timeout));
        }
        return Err(IntakeError::TooLarge);
    }
    // While draining, intake goes on until the listener closes: /readyz already turned 503 so
    // that load balancers move traffic away, and a beacon refused now would not be resent.

    // The body limit applies to the bytes on the wire too: at most 64 KiB are ever buffered.
    let raw = match tokio::time::timeout(
        state.bounds.body_timeout,
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

/// Most bytes of a refused body read and thrown away after its 413 (`discard`).
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

#[cfg(test)]
mod tests {
    use super::stations::SHED_RETRY_AFTER;
    use super::*;
    use crate::beacon::UNKNOWN_SITE;
    use crate::error::Rejected;

    /// The value of the sample `name` (with its labels) in `metrics`; panics naming it when
    /// it is not exported.
    fn sample(metrics: &Metrics, name: &str) -> f64 {
        let text = metrics.encode();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
    }

    fn report() -> Accepted {
        Accepted {
            accepted: 2,
            duplicates: 1,
            rejected: vec![Rejected {
                index: 1,
                error: "invalid url",
            }],
            dropped_fields: vec![DroppedField {
                index: 0,
                field: "lcp_ms".into(),
            }],
            clock_skewed: 1,
        }
    }

    #[test]
    fn a_202_counts_each_measurement_by_what_became_of_it() {
        let m = Metrics::new();
        count(&m, &Ok(report()));
        assert_eq!(sample(&m, "collector_measurements_accepted_total"), 2.0);
        assert_eq!(sample(&m, "collector_measurements_duplicate_total"), 1.0);
        assert_eq!(sample(&m, "collector_measurements_clock_skew_total"), 1.0);
        assert_eq!(
            sample(
                &m,
                "collector_measurements_rejected_total{reason=\"invalid url\"}"
            ),
            1.0
        );
        assert_eq!(
            sample(
                &m,
                "collector_measurements_field_dropped_total{field=\"lcp_ms\"}"
            ),
            1.0
        );
        assert_eq!(sample(&m, "collector_http_shed_total"), 0.0);
    }

    #[test]
    fn a_refusal_counts_only_what_it_is() {
        let m = Metrics::new();
        let rejected = vec![Rejected {
            index: 0,
            error: UNKNOWN_SITE,
        }];
        count(&m, &Err(IntakeError::UnknownSite(rejected)));
        count(&m, &Err(IntakeError::RateLimited(Duration::from_secs(1))));
        count(&m, &Err(IntakeError::Overloaded(SHED_RETRY_AFTER)));
        count(&m, &Err(IntakeError::Overloaded(RETRY_AFTER)));
        count(
            &m,
            &Err(IntakeError::Unavailable("spool full", RETRY_AFTER)),
        );
        assert_eq!(
            sample(
                &m,
                "collector_measurements_rejected_total{reason=\"unknown or disabled site\"}"
            ),
            1.0
        );
        assert_eq!(sample(&m, "collector_http_rate_limited_total"), 1.0);
        assert_eq!(sample(&m, "collector_http_shed_total"), 2.0);
        assert_eq!(sample(&m, "collector_measurements_accepted_total"), 0.0);
    }

    #[tokio::test]
    async fn the_202_body_lists_rejections_and_dropped_fields_but_not_skew() {
        let response = answer(Ok(report()));
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"accepted":2,"duplicates":1,"rejected":[{"index":1,"error":"invalid url"}],"dropped_fields":[{"index":0,"field":"lcp_ms"}]}"#
        );
    }
}

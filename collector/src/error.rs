//! The intake's error enum and its one mapping to HTTP statuses (contract §2).

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::beacon::DecodeError;

/// One rejected measurement, as listed in the `rejected` array of a 202, 400 or 403 body:
/// the one type for a rejection, whatever station made it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Rejected {
    /// Position in the request array (0 for a single object).
    pub index: usize,
    /// Why it was rejected, e.g. `invalid url`.
    pub error: &'static str,
}

/// Every way a request to the intake can fail; each maps to exactly one status.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    /// 400: the body is not a measurement or an array of them.
    #[error("{0}")]
    Malformed(String),
    /// 400: the body parsed, but no measurement in it is valid.
    #[error("no valid measurement")]
    NoValidMeasurement(Vec<Rejected>),
    /// 403: every measurement names an unknown or disabled site, or a page that is not on its
    /// site's origins (the rejections say which).
    #[error("unknown or disabled site, or a page not on the site's origins")]
    UnknownSite(Vec<Rejected>),
    /// 403: the `Origin` header is not one the site allows.
    #[error("origin not allowed for site {0}")]
    OriginNotAllowed(String),
    /// 413: the body, or what it inflates to, exceeds 64 KiB.
    #[error("body larger than 65536 bytes")]
    TooLarge,
    /// 415: a `Content-Type` or `Content-Encoding` the intake does not read.
    #[error("unsupported {0}")]
    UnsupportedMedia(&'static str),
    /// 429: a site or client over its rate.
    #[error("rate limit exceeded")]
    RateLimited(Duration),
    /// 429: the site is over its budget and this client sent beyond its share of it (contract
    /// v5 §2, [`crate::limits::shares`]).
    #[error("rate limit exceeded: this client sent beyond its share of the site's budget")]
    OverShare(Duration),
    /// 429: a never-seen site key while the first fetches of never-seen keys are over their
    /// budget ([`crate::settings::FIRST_FETCH_RATE`] per second): load shed because of the
    /// keys sent, not an outage.
    #[error("too many never-seen site keys; retry shortly")]
    SiteLookupLimited(Duration),
    /// 503: the request was shed for overload (every in-flight place taken, or the spool's
    /// open group full); counted in `collector_http_shed_total`.
    #[error("overloaded")]
    Overloaded(Duration),
    /// 503: the collector cannot accept durably right now (spool full or unable to write, a
    /// never-seen site while the settings store is unreachable).
    #[error("{0}")]
    Unavailable(&'static str, Duration),
    /// 503: a measurement's site lives on a shard this collector does not know (contract v5
    /// §3): nothing of the request is stored, never on another shard; the count is how many
    /// measurements the request held.
    #[error("site on a shard this collector does not know")]
    UnknownShard(usize, Duration),
}

impl From<DecodeError> for IntakeError {
    fn from(e: DecodeError) -> Self {
        match e {
            DecodeError::TooLarge => IntakeError::TooLarge,
            DecodeError::Malformed(m) => IntakeError::Malformed(m),
        }
    }
}

impl IntakeError {
    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            IntakeError::Malformed(_) | IntakeError::NoValidMeasurement(_) => {
                StatusCode::BAD_REQUEST
            }
            IntakeError::UnknownSite(_) | IntakeError::OriginNotAllowed(_) => StatusCode::FORBIDDEN,
            IntakeError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            IntakeError::UnsupportedMedia(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            IntakeError::RateLimited(_)
            | IntakeError::OverShare(_)
            | IntakeError::SiteLookupLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            IntakeError::Overloaded(_)
            | IntakeError::Unavailable(..)
            | IntakeError::UnknownShard(..) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            IntakeError::Malformed(_) => "malformed",
            IntakeError::NoValidMeasurement(_) => "no_valid_measurement",
            IntakeError::UnknownSite(_) => "unknown_site",
            IntakeError::OriginNotAllowed(_) => "origin_not_allowed",
            IntakeError::TooLarge => "too_large",
            IntakeError::UnsupportedMedia(_) => "unsupported_media",
            IntakeError::RateLimited(_) => "rate_limited",
            IntakeError::OverShare(_) => "over_share",
            IntakeError::SiteLookupLimited(_) => "site_lookup_limited",
            IntakeError::Overloaded(_) => "overloaded",
            IntakeError::Unavailable(..) => "unavailable",
            IntakeError::UnknownShard(..) => "unknown_shard",
        }
    }
}

/// An error answer outside the intake: `status` with the JSON body `{"error": error}` that
/// every error answer has (contract §2).
pub fn error_response(status: StatusCode, error: &str) -> Response {
    (
        status,
        axum::Json(ErrorBody {
            error: error.to_owned(),
            rejected: &[],
        }),
    )
        .into_response()
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: String,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    rejected: &'a [Rejected],
}

impl IntoResponse for IntakeError {
    fn into_response(self) -> Response {
        let status = self.status();
        let retry_after = match &self {
            IntakeError::RateLimited(d)
            | IntakeError::OverShare(d)
            | IntakeError::SiteLookupLimited(d)
            | IntakeError::Overloaded(d)
            | IntakeError::Unavailable(_, d)
            | IntakeError::UnknownShard(_, d) => Some(d.as_secs().max(1)),
            _ => None,
        };
        let rejected: &[Rejected] = match &self {
            IntakeError::NoValidMeasurement(r) | IntakeError::UnknownSite(r) => r,
            _ => &[],
        };
        let body = ErrorBody {
            error: self.to_string(),
            rejected,
        };
        let mut response = (status, axum::Json(body)).into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_retry_after() {
        let r = IntakeError::Unavailable("spool full", Duration::from_millis(200)).into_response();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = IntakeError::RateLimited(Duration::from_secs(7)).into_response();
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "7");
        let r = IntakeError::Overloaded(Duration::from_secs(1)).into_response();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert_eq!(IntakeError::TooLarge.status(), 413);
        assert_eq!(IntakeError::UnsupportedMedia("Content-Type").status(), 415);
        assert_eq!(IntakeError::OriginNotAllowed("s".into()).status(), 403);
        assert!(IntakeError::Malformed("x".into())
            .into_response()
            .headers()
            .get(header::RETRY_AFTER)
            .is_none());
    }

    #[tokio::test]
    async fn every_error_has_a_json_body() {
        for response in [
            IntakeError::TooLarge.into_response(),
            IntakeError::UnsupportedMedia("Content-Type").into_response(),
            error_response(StatusCode::NOT_FOUND, "not found"),
        ] {
            assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
            let body = axum::body::to_bytes(response.into_body(), 1024)
                .await
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert!(v["error"].is_string(), "{v}");
        }
    }
}

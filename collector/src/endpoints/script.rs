//! `GET /script.js`: the tracking script from memory (contract §2).

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::server::AppState;

/// Serves the script with a strong ETag per encoding, `304` on a matching `If-None-Match`,
/// and the brotli or gzip form when the client accepts it (brotli preferred).
pub async fn get(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let script = &state.script;
    let accept = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let variant = if accepts(accept, "br") {
        &script.brotli
    } else if accepts(accept, "gzip") {
        &script.gzip
    } else {
        &script.identity
    };
    let mut h = HeaderMap::new();
    h.insert(header::ETAG, variant.etag.clone());
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    let inm = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // If-None-Match uses the weak comparison (RFC 9110 §13.1.2): a `W/` prefix is ignored.
    if inm
        .split(',')
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == "*" || script.is_current(t))
    {
        return (StatusCode::NOT_MODIFIED, h).into_response();
    }
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/javascript; charset=utf-8"),
    );
    if let Some(encoding) = variant.encoding {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static(encoding));
    }
    (StatusCode::OK, h, variant.body.clone()).into_response()
}

/// Whether an `Accept-Encoding` value accepts `coding` (present without `q=0`).
fn accepts(accept: &str, coding: &str) -> bool {
    accept.split(',').any(|part| {
        let mut it = part.split(';');
        let name = it.next().unwrap_or("").trim();
        let zero = it.any(|p| {
            let p = p.trim();
            p.strip_prefix("q=")
                .is_some_and(|q| q.trim().parse::<f32>().is_ok_and(|q| q == 0.0))
        });
        name.eq_ignore_ascii_case(coding) && !zero
    })
}

#[cfg(test)]
mod tests {
    use super::accepts;

    #[test]
    fn accept_encoding() {
        assert!(accepts("gzip, deflate, br", "br"));
        assert!(accepts("gzip;q=0.5", "gzip"));
        assert!(!accepts("gzip;q=0", "gzip"));
        assert!(!accepts("identity", "gzip"));
        assert!(!accepts("", "br"));
    }
}

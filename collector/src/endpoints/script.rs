//! `GET /script.js`: the tracking script from memory (contract §2).

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::server::AppState;

/// Serves the script with a strong ETag, `304` on a matching `If-None-Match`, and the gzip or
/// brotli form when the client accepts it (brotli preferred).
pub async fn get(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let script = &state.script;
    let etag = HeaderValue::from_str(&script.etag).expect("hex etag is a valid header");
    let mut response_headers = HeaderMap::new();
    response_headers.insert(header::ETAG, etag);
    response_headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    response_headers.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    response_headers.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );

    if let Some(inm) = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
    {
        if inm
            .split(',')
            .any(|t| t.trim() == script.etag || t.trim() == "*")
        {
            return (StatusCode::NOT_MODIFIED, response_headers).into_response();
        }
    }
    response_headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/javascript; charset=utf-8"),
    );
    let accept = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let body = if accepts(accept, "br") {
        response_headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("br"));
        script.brotli.clone()
    } else if accepts(accept, "gzip") {
        response_headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        script.gzip.clone()
    } else {
        script.identity.clone()
    };
    (StatusCode::OK, response_headers, body).into_response()
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

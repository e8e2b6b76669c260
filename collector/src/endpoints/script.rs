//! `GET /script.js`: the tracking script from memory (contract §2).
//!
//! Content negotiation as RFC 9110 says: the coding is chosen by the `Accept-Encoding`
//! q-values (§12.5.3), each coding has its own strong ETag, and `If-None-Match` uses the weak
//! comparison (§13.1.2) against the ETag of the variant this request would receive, so a
//! cache never gets a `304` that stands for bytes in another coding.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::script::Variant;
use crate::state::AppState;

/// Serves the variant the client prefers, or `304` when `If-None-Match` names that variant.
pub async fn get(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let script = &state.script;
    let accept = headers
        .get(header::ACCEPT_ENCODING)
        .map(|v| v.to_str().unwrap_or(""));
    let variant = match preferred(accept) {
        Coding::Brotli => &script.brotli,
        Coding::Gzip => &script.gzip,
        Coding::Identity => &script.identity,
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
    let matched = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|list| none_match(list, variant));
    if matched {
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

/// A coding the script is kept in, in order of preference when q-values tie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coding {
    Brotli,
    Gzip,
    Identity,
}

/// The coding to send for an `Accept-Encoding` value (RFC 9110 §12.5.3): the highest q-value
/// above 0 among brotli, gzip (also `x-gzip`) and identity, `*` standing for each coding not
/// named, ties going to the smaller body. Identity is always acceptable unless excluded, so
/// it is the answer when nothing named is; when even it is excluded (`identity;q=0`), it is
/// still sent, as the RFC lets a server ignore the field rather than answer 406.
fn preferred(accept: Option<&str>) -> Coding {
    let Some(accept) = accept else {
        return Coding::Identity;
    };
    let (mut br, mut gzip, mut identity, mut any) = (None, None, None, None);
    for entry in accept.split(',') {
        let mut parts = entry.split(';');
        let name = parts.next().unwrap_or("").trim();
        let mut q = Some(1.0f32);
        for param in parts {
            if let Some((key, value)) = param.split_once('=') {
                if key.trim().eq_ignore_ascii_case("q") {
                    q = value
                        .trim()
                        .parse::<f32>()
                        .ok()
                        .filter(|q| (0.0..=1.0).contains(q));
                }
            }
        }
        // An entry with an unreadable q-value says nothing.
        let Some(q) = q else { continue };
        let slot = match name.to_ascii_lowercase().as_str() {
            "br" => &mut br,
            "gzip" | "x-gzip" => &mut gzip,
            "identity" => &mut identity,
            "*" => &mut any,
            _ => continue,
        };
        *slot = Some(q);
    }
    // Identity named (or by `*`) competes; not named, it is only the fallback.
    let choices = [
        (Coding::Brotli, br.or(any).unwrap_or(0.0)),
        (Coding::Gzip, gzip.or(any).unwrap_or(0.0)),
        (Coding::Identity, identity.or(any).unwrap_or(0.0)),
    ];
    let mut best = (Coding::Identity, 0.0);
    for (coding, q) in choices {
        if q > best.1 {
            best = (coding, q);
        }
    }
    best.0
}

/// Whether an `If-None-Match` value matches `variant` by the weak comparison (RFC 9110
/// §13.1.2; comparison as in §8.8.3.2): `*`, or a listed entity-tag whose opaque part equals
/// the variant's, `W/` or not. Entity-tags are read whole, so a comma inside one does not split it.
fn none_match(value: &str, variant: &Variant) -> bool {
    let ours = variant.etag.to_str().unwrap_or("");
    let mut rest = value;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return false;
        }
        if let Some(after) = rest.strip_prefix('*') {
            if after.trim_start().is_empty() || after.trim_start().starts_with(',') {
                return true;
            }
        }
        let tag = rest.strip_prefix("W/").unwrap_or(rest);
        let end = tag
            .strip_prefix('"')
            .and_then(|t| t.find('"'))
            .map(|i| i + 2);
        match end {
            Some(end) => {
                if &tag[..end] == ours {
                    return true;
                }
                rest = &tag[end..];
            }
            // Not an entity-tag: skip to the next list element.
            None => rest = rest.split_once(',').map_or("", |(_, r)| r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::Script;

    #[test]
    fn coding_by_q_values() {
        use Coding::*;
        for (accept, want) in [
            (None, Identity),
            (Some(""), Identity),
            (Some("gzip, deflate, br"), Brotli),
            (Some("gzip;q=0.5"), Gzip),
            (Some("gzip;q=0"), Identity),
            (Some("identity"), Identity),
            (Some("br;q=0.5, gzip;q=0.8"), Gzip),
            (Some("br;q=0.8, gzip;q=0.8"), Brotli),
            (Some("gzip, br;q=0"), Gzip),
            (Some("GZIP; Q=1.0"), Gzip),
            (Some("x-gzip"), Gzip),
            (Some("*"), Brotli),
            (Some("*;q=0.5, identity;q=0.9"), Identity),
            (Some("*;q=0, gzip"), Gzip),
            (Some("identity;q=0, gzip;q=0.1"), Gzip),
            (Some("identity;q=0"), Identity),
            (Some("gzip;q=2"), Identity),
            (Some("gzip;q=abc"), Identity),
            (Some("br;q=0.001, identity;q=0.002"), Identity),
        ] {
            assert_eq!(preferred(accept), want, "{accept:?}");
        }
    }

    #[test]
    fn if_none_match_is_weak_and_per_variant() {
        let s = Script::default();
        let gz = s.gzip.etag.to_str().unwrap().to_owned();
        let plain = s.identity.etag.to_str().unwrap().to_owned();
        assert!(none_match(&gz, &s.gzip));
        assert!(
            !none_match(&gz, &s.identity),
            "the gzip ETag is not the plain one"
        );
        assert!(!none_match(&plain, &s.gzip));
        assert!(none_match(&format!("W/{gz}"), &s.gzip));
        assert!(none_match(&format!("\"x\", W/{plain} ,\"y\""), &s.identity));
        assert!(none_match(&format!("\"a,b\", {plain}"), &s.identity));
        assert!(!none_match("\"a,b\"", &s.identity));
        assert!(none_match("*", &s.brotli));
        assert!(none_match(" * ", &s.brotli));
        assert!(!none_match("", &s.brotli));
        assert!(!none_match("garbage", &s.brotli));
        assert!(
            !none_match(plain.trim_matches('"'), &s.identity),
            "unquoted is no entity-tag"
        );
        assert!(
            !none_match(&format!("w/{plain}"), &s.identity),
            "W/ is case-sensitive"
        );
    }
}

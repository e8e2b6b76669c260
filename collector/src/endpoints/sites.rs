//! `GET /api/v1/sites/{key}`: what the tracking script needs of its site's settings (an
//! addition to contract §2).
//!
//! The script applies the site's `sample_rate` before it sends anything, so it must learn the
//! rate first; `/script.js` is one file for every site (its query string is ignored), so the
//! rate cannot travel with it. This answer is small, public (the key is in the shop's HTML, the
//! rate is no secret) and cacheable: a browser asks at most once per [`MAX_AGE`] however many
//! pages it views, as real-user-monitoring products that fetch a per-site configuration do.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::beacon;
use crate::endpoints::intake::RETRY_AFTER;
use crate::error::{error_response, IntakeError};
use crate::settings::Lookup;
use crate::state::AppState;

/// How long a browser may keep an answer: the default `COLLECTOR_SETTINGS_TTL`, so that a
/// changed rate reaches browsers about as fast as it reaches collectors; the most contract v4
/// allows. A site near or over its budget is answered a shorter one
/// ([`crate::sampling::SHORT_MAX_AGE`]), so that a lowered rate reaches its browsers sooner.
pub const MAX_AGE: Duration = Duration::from_secs(60);

/// The 200 answer.
#[derive(Debug, Serialize)]
pub struct SiteAnswer<'a> {
    /// The site key.
    pub site: &'a str,
    /// The share of page views the script sends, 0 to 1.
    pub sample_rate: f64,
}

/// 200 `{"site","sample_rate"}` for an enabled site, its rate lowered while it is over its
/// budget ([`crate::sampling`]); 404 for an unknown or disabled one (the
/// script then sends nothing); 503 with `Retry-After` for a never-seen site while the settings
/// store is unreachable. Any origin may read it (`Access-Control-Allow-Origin: *`; the script
/// asks without credentials).
pub async fn get(State(state): State<AppState>, Path(key): Path<String>) -> Response {
    let mut max_age = MAX_AGE;
    let mut response = if !beacon::is_site_key(&key) {
        error_response(StatusCode::NOT_FOUND, "unknown or disabled site")
    } else {
        match state.sites.settings.lookup(&key).await {
            Lookup::Known(site) if site.enabled => {
                if state.sites.sampler.near_budget(&site.key) {
                    max_age = crate::sampling::SHORT_MAX_AGE;
                }
                axum::Json(SiteAnswer {
                    site: &site.key,
                    sample_rate: state.sites.sampler.served(&site.key, site.sample_rate),
                })
                .into_response()
            }
            Lookup::Known(_) | Lookup::Unknown => {
                error_response(StatusCode::NOT_FOUND, "unknown or disabled site")
            }
            Lookup::Unavailable => {
                return with_cors(
                    IntakeError::Unavailable("settings store unavailable", RETRY_AFTER)
                        .into_response(),
                )
            }
            Lookup::Limited => {
                return with_cors(
                    IntakeError::SiteLookupLimited(super::intake::FIRST_FETCH_RETRY_AFTER)
                        .into_response(),
                )
            }
        }
    };
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_str(&format!("public, max-age={}", max_age.as_secs())).expect("digits"),
    );
    with_cors(response)
}

fn with_cors(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    response
}

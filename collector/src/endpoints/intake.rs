//! `POST /api/v1/measurements` and its `OPTIONS` preflight (contract §2).
//!
//! The one way through, one station per function of `accept`: receive (headers, bounded
//! body) → in-flight bound → decode → validate → site settings and origin → fair shedding →
//! rates → dedup claim → spool append (durable) → 202. Nothing is stored unless the request as a whole is answered 202, and a
//! 202 is only sent once the spool holds every measurement it counts as accepted.
//!
//! Each station returns what the next one needs or the [`IntakeError`] that ends the request.
//! What a request came to, an [`Accepted`] report or that error, is counted in the metrics in
//! one place (`count`) and answered in one (`answer`).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::sync::OwnedSemaphorePermit;

use crate::beacon::{
    self, Context, Encoding, Judged, MAX_BODY_BYTES, UNKNOWN_SITE, URL_NOT_ALLOWED,
};
use crate::client_ip::client_ip;
use crate::dedup::{Claim, ClaimGuard};
use crate::error::{IntakeError, Rejected};
use crate::measurement::{self, Label, Measurement};
use crate::metrics::Metrics;
use crate::settings::{LoadedSite, Lookup};
use crate::spool::AppendError;
use crate::state::AppState;
use crate::useragent::Agent;

/// How long a request waits for its spool append to become durable before answering 503.
pub const APPEND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request waits for another request that holds the same id.
pub const CLAIM_WAIT: Duration = Duration::from_secs(5);
/// `Retry-After` of a 503.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);
/// `Retry-After` of a 503 for a request shed at the in-flight bound: a place frees as soon as
/// any request in flight is answered, far sooner than the spool drains.
const SHED_RETRY_AFTER: Duration = Duration::from_secs(1);
/// `Retry-After` of a never-seen site key while the first-fetch budget is spent
/// ([`crate::settings::FIRST_FETCH_RATE`] per second): the next second has budget again.
pub const FIRST_FETCH_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What a request answered 202 came to, gathered station by station: the 202 body, and what
/// only the metrics count.
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct Accepted {
    /// Measurements made durable by this request.
    pub accepted: usize,
    /// Measurements already durable from an earlier request, or repeated in this one.
    pub duplicates: usize,
    /// Measurements rejected, with why, by index.
    pub rejected: Vec<Rejected>,
    /// Optional fields dropped as invalid.
    pub dropped_fields: Vec<DroppedField>,
    /// Measurements whose `ts` was stored as NULL for clock skew: counted in the metrics, not
    /// listed in the body.
    #[serde(skip)]
    pub clock_skewed: u64,
}

/// One dropped field in a 202 body.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct DroppedField {
    /// Index in the request array.
    pub index: usize,
    /// Field name; for a dimension, `dimensions.NAME`.
    pub field: Cow<'static, str>,
}

impl DroppedField {
    /// The `field` label it is counted under: its name, or `dimensions` for every
    /// `dimensions.NAME` (the names are the client's: a label of them would be unbounded).
    pub fn metric_label(&self) -> &str {
        if self.field.starts_with("dimensions.") {
            "dimensions"
        } else {
            &self.field
        }
    }
}

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
                let outcome = accept(&task_state, peer.ip(), &headers, &raw, encoding).await;
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
        let allowed = match state.settings.lookup(site).await {
            Lookup::Known(s) => s.enabled && s.allows_origin(origin.to_str().ok()),
            Lookup::Unknown => false,
            Lookup::Unavailable | Lookup::Limited => true,
        };
        if !allowed {
            return IntakeError::OriginNotAllowed(site.to_owned()).into_response();
        }
    } else if !origin
        .to_str()
        .is_ok_and(|o| state.settings.lists_origin(o))
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

/// The stations of an intake request after its body arrived, in order; each returns what the
/// next one needs or the error that ends the request.
async fn accept(
    state: &AppState,
    peer: IpAddr,
    headers: &HeaderMap,
    raw: &[u8],
    encoding: Encoding,
) -> Result<Accepted, IntakeError> {
    let _permit = enter(state)?;
    let text = decode(raw, encoding)?;
    let mut report = Accepted::default();
    // Every measurement of the request borrows the one stored form of its user agent.
    let user_agent = beacon::user_agent(headers.get(header::USER_AGENT).map(HeaderValue::as_bytes));
    let agent = state.user_agents.get(&user_agent);
    // The client's address serves the rates and the country, and goes no further.
    let client = client_ip(
        peer,
        headers,
        &state.trusted_proxies,
        state.client_ip_header,
    );
    let country = state.countries.country(client);
    let found = Found {
        user_agent: &user_agent,
        agent: &agent,
        country: &country,
    };
    let valid = validate(&text, &found, &mut report)?;
    let request = Request {
        peer,
        headers,
        client,
    };
    let (valid, placement, clients) = judge_sites(state, &request, valid, &mut report).await?;
    shed_loud(state, &valid, &placement)?;
    let with_origin = headers.contains_key(header::ORIGIN);
    check_rates(state, client, &clients, with_origin, &valid)?;
    let (to_store, guards) = claim(state, valid, &mut report).await;
    let appended = append(state, &to_store, &placement).await;
    // What became durable is claimed for good, on a refusal too (another shard's part of a
    // request that spans shards): the client's retry then folds it as a duplicate.
    for (i, guard) in guards {
        let shard = shard_of(&placement, &to_store[i]);
        if appended
            .as_ref()
            .map_or_else(|(_, durable)| durable.contains(&shard), |()| true)
        {
            guard.commit();
        }
    }
    appended.map_err(|(e, _)| e)?;
    report.accepted = to_store.len();
    Ok(report)
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

/// The in-flight bound, taken once the body has arrived: `COLLECTOR_MAX_IN_FLIGHT` bounds the
/// work, not the waiting, so a request still sending its body (bounded by the body timeout and
/// the connection limit) holds no place, and a few slow senders cannot make every other beacon
/// a 503. Beyond the bound: shed, 503 at once. The place is held until the permit is dropped.
fn enter(state: &AppState) -> Result<OwnedSemaphorePermit, IntakeError> {
    state
        .limits
        .enter()
        .ok_or(IntakeError::Overloaded(SHED_RETRY_AFTER))
}

/// Decode: inflates the body (at most [`MAX_BODY_BYTES`], else 413; broken gzip: 400) and
/// reads it as text ([`beacon::text`]), borrowed from `raw` when nothing had to change.
fn decode(raw: &[u8], encoding: Encoding) -> Result<Cow<'_, str>, IntakeError> {
    Ok(match beacon::inflate(raw, encoding)? {
        Cow::Borrowed(bytes) => beacon::text(bytes),
        Cow::Owned(bytes) => Cow::Owned(beacon::text(&bytes).into_owned()),
    })
}

/// What a request says of its sender, besides its body: each of its measurements gets it.
struct Found<'a> {
    /// The user agent as stored.
    user_agent: &'a str,
    /// What it says.
    agent: &'a Agent,
    /// The client's country, or empty.
    country: &'a str,
}

/// Validate: parses the text into items (broken syntax, an empty body or array, or more than
/// [`beacon::MAX_BATCH`] items: 400) and validates each; the rejected ones go to the report.
/// With none valid: 400 listing every rejection.
fn validate<'a>(
    text: &'a str,
    found: &Found<'a>,
    report: &mut Accepted,
) -> Result<Vec<(usize, Judged<'a>)>, IntakeError> {
    let items = beacon::parse(text)?;
    let ctx = Context {
        received_at_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64),
        user_agent: found.user_agent,
        agent: found.agent,
        country: found.country,
    };
    let mut valid = Vec::with_capacity(items.len());
    for (index, item) in items.into_iter().enumerate() {
        match beacon::validate(item, &ctx) {
            Ok(v) => valid.push((index, v)),
            Err(error) => report.rejected.push(Rejected { index, error }),
        }
    }
    if valid.is_empty() {
        let rejected = std::mem::take(&mut report.rejected);
        return Err(IntakeError::NoValidMeasurement(rejected));
    }
    Ok(valid)
}

/// A measurement of the request once its site's rules made it a row: its index in the body,
/// the row, and what judging it dropped.
struct Kept<'a> {
    index: usize,
    row: Measurement<'a>,
    /// Names of the optional fields dropped as invalid.
    dropped: Vec<&'static str>,
    /// Whether its `ts` was withheld for clock skew.
    clock_skewed: bool,
}

/// Site settings and origin: measurements of unknown or disabled sites are rejected, and so are
/// those whose page is not on one of their site's origins (`url_not_allowed`, contract v4 §2);
/// each kept measurement meets its site's rules ([`measurement::site::settle`]: minimised, its
/// page group, dimensions and sample rate) and counts toward its site's demand as `client`'s
/// ([`crate::sampling::Sampler::observe`]); [`lookup_sites`] refuses the whole request first if
/// it must. With nothing left: 403 listing every rejection.
async fn judge_sites<'a>(
    state: &AppState,
    request: &Request<'_>,
    valid: Vec<(usize, Judged<'a>)>,
    report: &mut Accepted,
) -> Result<(Vec<Kept<'a>>, Placement, SiteClients), IntakeError> {
    let origin = request
        .headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok());
    let sites = lookup_sites(state, origin, &valid).await?;
    let placement = place(state, &sites, valid.len())?;
    let clients = site_clients(state, request, &sites);
    let mut kept = Vec::with_capacity(valid.len());
    for (index, mut judged) in valid {
        match &sites[&*judged.site] {
            Some(site) if !site.allows_page(&judged.url) => report.rejected.push(Rejected {
                index,
                error: URL_NOT_ALLOWED,
            }),
            Some(site) => {
                let client = client_of(&clients, &site.key, request.client);
                if client != request.client {
                    // Named by the shop's own proxy: its country, not the proxy's.
                    judged.country = Label(Cow::Owned(state.countries.country(client)));
                }
                let (dropped, clock_skewed) =
                    (std::mem::take(&mut judged.dropped), judged.clock_skewed);
                let (row, dims) = measurement::site::settle(judged, &site_rules(state, site));
                // Only browsers' beacons (they send Origin on every POST) count toward the
                // demand, each client address a bounded share of it: a flood without Origin,
                // or from a few addresses, must not lower a shop's rate.
                if origin.is_some() {
                    state
                        .sampler
                        .observe(&site.key, site.sample_rate, client, [row.sample_rate]);
                }
                for field in dims {
                    report.dropped_fields.push(DroppedField {
                        index,
                        field: Cow::Owned(field),
                    });
                }
                kept.push(Kept {
                    index,
                    row,
                    dropped,
                    clock_skewed,
                });
            }
            None => report.rejected.push(Rejected {
                index,
                error: UNKNOWN_SITE,
            }),
        }
    }
    report.rejected.sort_by_key(|r| r.index);
    if kept.is_empty() {
        let rejected = std::mem::take(&mut report.rejected);
        return Err(IntakeError::UnknownSite(rejected));
    }
    Ok((kept, placement, clients))
}

/// The rules of `site` as the site stage reads them.
fn site_rules<'s>(state: &'s AppState, site: &'s LoadedSite) -> measurement::site::SiteRules<'s> {
    measurement::site::SiteRules {
        key: &site.key,
        keep_query: &site.keep_query,
        origins: &site.allowed_origins,
        page_groups: &site.page_groups,
        dimensions: &site.dimensions,
        sample_rate: site.sample_rate,
        sampler: &state.sampler,
        distinct: &state.dimension_values,
    }
}

/// What intake knows of a request before any site: the peer, the headers, and the client the
/// global trusted proxies name ([`crate::client_ip::client_ip`]).
struct Request<'h> {
    peer: IpAddr,
    headers: &'h HeaderMap,
    client: IpAddr,
}

/// The client of each known site of a request whose own trusted proxies name another one than
/// the global list does (contract v5 §1: a shop's proxy is believed for that shop's beacons
/// only); a site absent here has the request's client.
type SiteClients = Vec<(String, IpAddr)>;

fn site_clients(
    state: &AppState,
    request: &Request<'_>,
    sites: &HashMap<String, Option<Arc<LoadedSite>>>,
) -> SiteClients {
    let mut clients = SiteClients::new();
    for site in sites.values().flatten() {
        if site.trusted_proxies.is_empty() {
            continue;
        }
        let client = crate::client_ip::client_ip_for(
            request.peer,
            request.headers,
            &state.trusted_proxies,
            &site.trusted_proxies,
            state.client_ip_header,
        );
        if client != request.client {
            clients.push((site.key.clone(), client));
        }
    }
    clients
}

/// The client of `site`'s measurements: its own ([`SiteClients`]) or the request's.
fn client_of(clients: &SiteClients, site: &str, request: IpAddr) -> IpAddr {
    clients
        .iter()
        .find(|(key, _)| key == site)
        .map_or(request, |(_, ip)| *ip)
}

/// Each known site of a request and the place of its shard's spool
/// ([`crate::shards::ShardSpools::index`]); a request has few sites, as a rule one.
type Placement = Vec<(String, usize)>;

/// Where each known site's measurements go (contract v5 §3): its shard's spool. A site whose
/// shard this collector does not know refuses the whole request (`measurements` of them),
/// 503 with `Retry-After`: nothing is stored, and nothing on another shard.
fn place(
    state: &AppState,
    sites: &HashMap<String, Option<Arc<LoadedSite>>>,
    measurements: usize,
) -> Result<Placement, IntakeError> {
    let mut placement = Placement::with_capacity(sites.len());
    for site in sites.values().flatten() {
        match state.spools.index(&site.shard) {
            Some(i) => placement.push((site.key.clone(), i)),
            None => {
                crate::logging::warn_limited(
                    "intake_unknown_shard",
                    || tracing::warn!(site = %site.key, shard = %site.shard, "intake: a site on a shard this collector does not know (COLLECTOR_CLICKHOUSE_SHARDS); answered 503"),
                );
                return Err(IntakeError::UnknownShard(measurements, RETRY_AFTER));
            }
        }
    }
    Ok(placement)
}

/// Looks up each distinct site of the request once: `None` for an unknown or disabled one.
/// An `Origin` a known site does not allow refuses the whole request (403), and so does a
/// never-seen site while the settings store is unreachable (503).
async fn lookup_sites(
    state: &AppState,
    origin: Option<&str>,
    valid: &[(usize, Judged<'_>)],
) -> Result<HashMap<String, Option<Arc<LoadedSite>>>, IntakeError> {
    let mut sites = HashMap::new();
    for (_, v) in valid {
        let key: &str = &v.site;
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
            Lookup::Limited => return Err(IntakeError::SiteLookupLimited(FIRST_FETCH_RETRY_AFTER)),
        };
        if let Some(site) = &site {
            if !site.allows_origin(origin) {
                return Err(IntakeError::OriginNotAllowed(site.key.clone()));
            }
        }
        sites.insert(key.to_owned(), site);
    }
    Ok(sites)
}

/// Fair shedding: while the collector is near its bounds (fewer than a fifth of the places in
/// flight free, or less than a fifth of the spool; [`crate::limits::RESERVED_SHARE`]), a
/// request with a measurement of a site over its budget is shed (503, `Retry-After`), so that
/// what room is left goes to the sites within theirs (contract v4 §2): a quiet shop never loses
/// a beacon because a loud one spiked.
fn shed_loud(
    state: &AppState,
    valid: &[Kept<'_>],
    placement: &Placement,
) -> Result<(), IntakeError> {
    let loud = |site: &str| state.sampler.over_budget(site);
    if !valid.iter().any(|k| loud(&k.row.site)) {
        return Ok(());
    }
    // The room that matters is that of the loud sites' shards' spools.
    let short = placement.iter().any(|(key, i)| {
        let spool = state.spools.spool(*i);
        let reserve = spool.max_bytes() / crate::limits::RESERVED_SHARE as u64;
        loud(key) && !spool.has_room(reserve)
    });
    if state.limits.strained() || short {
        return Err(IntakeError::Overloaded(SHED_RETRY_AFTER));
    }
    Ok(())
}

/// Rates: per-site rates, counted in measurements (a request without `Origin` against its
/// site's budget for such requests, see [`crate::limits`]), and, when `COLLECTOR_CLIENT_RATE`
/// is on, one request per site for this client. Over either: 429. A browser's request (with
/// `Origin`) first meets its client's share of the site's budget
/// ([`crate::limits::shares`]): beyond it while the site is over its budget, 429 without
/// spending the site's budget.
fn check_rates(
    state: &AppState,
    request: IpAddr,
    clients: &SiteClients,
    with_origin: bool,
    valid: &[Kept<'_>],
) -> Result<(), IntakeError> {
    let mut per_site: HashMap<&str, u32> = HashMap::new();
    for k in valid {
        *per_site.entry(&*k.row.site).or_default() += 1;
    }
    for (site, n) in per_site {
        let client = client_of(clients, site, request);
        if with_origin {
            state
                .limits
                .check_share(site, client, n)
                .map_err(IntakeError::OverShare)?;
        }
        if state.limits.client_rate_on() {
            state
                .limits
                .check_client(site, client)
                .map_err(IntakeError::RateLimited)?;
        }
        state
            .limits
            .check_site(site, n, with_origin)
            .map_err(|wait| IntakeError::RateLimited(state.sampler.retry_after(site, wait)))?;
    }
    Ok(())
}

/// Dedup claim: claims each id in the dedup window; within one request a repeated id is a
/// duplicate of the first. Returns the measurements to store and the claims to commit once
/// they are durable, each with the place of its measurement; the dropped fields and skewed
/// clocks of the kept measurements go to the report.
async fn claim<'a>(
    state: &AppState,
    valid: Vec<Kept<'a>>,
    report: &mut Accepted,
) -> (Vec<Measurement<'a>>, Vec<(usize, ClaimGuard)>) {
    let mut guards = Vec::with_capacity(valid.len());
    let mut to_store = Vec::with_capacity(valid.len());
    let mut seen = HashSet::with_capacity(valid.len());
    for k in valid {
        for &field in &k.dropped {
            report.dropped_fields.push(DroppedField {
                index: k.index,
                field: Cow::Borrowed(field),
            });
        }
        report.clock_skewed += k.clock_skewed as u64;
        if !seen.insert(k.row.id) {
            report.duplicates += 1;
            continue;
        }
        match state.dedup.claim(k.row.id) {
            Claim::New(guard) => {
                guards.push((to_store.len(), guard));
                to_store.push(k.row);
            }
            Claim::Duplicate => report.duplicates += 1,
            Claim::InFlight(other) => {
                if other.wait(CLAIM_WAIT).await {
                    report.duplicates += 1;
                } else {
                    to_store.push(k.row);
                }
            }
        }
    }
    (to_store, guards)
}

/// Append: encodes the rows once (the spool keeps them as the writer sends them), one record
/// per shard of the request's sites ([`Placement`]), writes each to its shard's spool and
/// waits until all are durable (at most [`APPEND_TIMEOUT`]); a refused append is a 503.
async fn append(
    state: &AppState,
    to_store: &[Measurement<'_>],
    placement: &Placement,
) -> Result<(), (IntakeError, Vec<usize>)> {
    if to_store.is_empty() {
        return Ok(());
    }
    let first = shard_of(placement, &to_store[0]);
    let records = if to_store.iter().all(|m| shard_of(placement, m) == first) {
        vec![(first, measurement::encode(to_store))]
    } else {
        let mut shards: Vec<usize> = to_store.iter().map(|m| shard_of(placement, m)).collect();
        shards.sort_unstable();
        shards.dedup();
        shards
            .into_iter()
            .map(|i| {
                let rows: Vec<Measurement<'_>> = to_store
                    .iter()
                    .filter(|m| shard_of(placement, m) == i)
                    .cloned()
                    .collect();
                (i, measurement::encode(&rows))
            })
            .collect()
    };
    // The ablation benchmark's build (scripts/bench.sh --ablation): every station, then 202
    // without storing anything. Never in a shipped build (the branch is compiled out).
    if cfg!(feature = "bench-no-append") {
        std::hint::black_box(records);
        return Ok(());
    }
    state
        .spools
        .append(records, APPEND_TIMEOUT)
        .await
        .map_err(|(e, durable)| (append_refused(e), durable))
}

/// The place of the shard's spool a stored measurement goes to.
fn shard_of(placement: &Placement, m: &Measurement<'_>) -> usize {
    placement
        .iter()
        .find(|(key, _)| **key == *m.site)
        .map(|&(_, i)| i)
        .expect("every stored measurement's site was placed")
}

/// The 503 for a refused append; a full open group is overload, and shed.
fn append_refused(e: AppendError) -> IntakeError {
    match e {
        AppendError::Full => IntakeError::Unavailable("spool full", RETRY_AFTER),
        AppendError::QueueFull => IntakeError::Overloaded(RETRY_AFTER),
        // Queued but not durable in time (a slow disk): the rows may still be stored, and
        // the client's retry is then folded as a duplicate.
        AppendError::SyncTimeout => IntakeError::Unavailable("spool write timed out", RETRY_AFTER),
        AppendError::DiskFull => {
            IntakeError::Unavailable("spool cannot write: disk full", RETRY_AFTER)
        }
        AppendError::Io => IntakeError::Unavailable("spool write failed", RETRY_AFTER),
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_full_append_queue_is_shed_and_a_full_spool_is_not() {
        assert!(matches!(
            append_refused(AppendError::QueueFull),
            IntakeError::Overloaded(RETRY_AFTER)
        ));
        assert!(matches!(
            append_refused(AppendError::SyncTimeout),
            IntakeError::Unavailable("spool write timed out", RETRY_AFTER)
        ));
        assert!(matches!(
            append_refused(AppendError::Full),
            IntakeError::Unavailable("spool full", RETRY_AFTER)
        ));
    }
}

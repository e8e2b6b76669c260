//! Intake's stations between the text and the rows: who sent the request ([`Sender`]), the
//! judgement of its measurements, which knows no site ([`judge`]), and the site stage
//! ([`site`]): each measurement's site looked up, its origin and page checked, its shard
//! placed, and its site's rules applied ([`measurement::site::settle`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderMap, HeaderValue};

use super::{Accepted, DroppedField, FIRST_FETCH_RETRY_AFTER, RETRY_AFTER};
use crate::beacon::{UNKNOWN_SITE, URL_NOT_ALLOWED};
use crate::error::{IntakeError, Rejected};
use crate::measurement::{self, Context, Judged, Label, Measurement};
use crate::settings::{LoadedSite, Lookup};
use crate::state::AppState;
use crate::useragent::Agent;

/// What a request says of its sender besides its body, found once: each of its measurements
/// gets it.
pub(super) struct Sender<'h> {
    /// The peer's address.
    peer: IpAddr,
    /// The request's headers.
    headers: &'h HeaderMap,
    /// Its `Origin`, as text (a browser sends one on every POST).
    pub(super) origin: Option<&'h str>,
    /// The client the global trusted proxies name ([`crate::client_ip::client_ip`]); it serves
    /// the rates and the country, and goes no further.
    pub(super) client: IpAddr,
    /// The user agent as stored ([`crate::beacon::user_agent`]).
    user_agent: String,
    /// What it says.
    agent: Arc<Agent>,
    /// The client's country, or empty.
    country: String,
}

impl<'h> Sender<'h> {
    /// Reads the sender of a request from `peer` and its `headers`.
    pub(super) fn of(state: &AppState, peer: IpAddr, headers: &'h HeaderMap) -> Sender<'h> {
        // Every measurement of the request borrows the one stored form of its user agent.
        let user_agent =
            crate::beacon::user_agent(headers.get(header::USER_AGENT).map(HeaderValue::as_bytes));
        let senders = &state.senders;
        let client = crate::client_ip::client_ip(
            peer,
            headers,
            &senders.trusted_proxies,
            senders.client_ip_header,
        );
        Sender {
            peer,
            headers,
            origin: headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()),
            client,
            agent: senders.user_agents.get(&user_agent),
            country: senders.countries.country(client),
            user_agent,
        }
    }

    /// Whether the request has an `Origin` header (a browser's).
    pub(super) fn with_origin(&self) -> bool {
        self.headers.contains_key(header::ORIGIN)
    }
}

/// Judge: parses the text into items (broken syntax, an empty body or array, or more than
/// [`crate::beacon::MAX_BATCH`] items: 400) and judges each by the field table's rules,
/// knowing no site ([`measurement::fields::judge`]); the rejected ones go to the report. With
/// none valid: 400 listing every rejection.
pub(super) fn judge<'a>(
    text: &'a str,
    sender: &'a Sender<'_>,
    report: &mut Accepted,
) -> Result<Vec<(usize, Judged<'a>)>, IntakeError> {
    let items = crate::beacon::decode::parse(text)?;
    let ctx = Context {
        received_at_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64),
        user_agent: &sender.user_agent,
        agent: &sender.agent,
        country: &sender.country,
    };
    let mut judged = Vec::new();
    for (index, item) in items.into_iter().enumerate() {
        let verdict = match item {
            Ok(raw) => measurement::fields::judge(raw, &ctx),
            Err(error) => Err(error),
        };
        match verdict {
            Ok(v) => judged.push((index, v)),
            Err(error) => report.rejected.push(Rejected { index, error }),
        }
    }
    if judged.is_empty() {
        let rejected = std::mem::take(&mut report.rejected);
        return Err(IntakeError::NoValidMeasurement(rejected));
    }
    Ok(judged)
}

/// A measurement of the request once its site's rules made it a row: its index in the body,
/// the row, and what judging it dropped.
pub(super) struct Kept<'a> {
    /// Its index in the request array.
    pub(super) index: usize,
    /// The row.
    pub(super) row: Measurement<'a>,
    /// Names of the optional fields dropped as invalid.
    pub(super) dropped: Vec<&'static str>,
    /// Whether its `ts` was withheld for clock skew.
    pub(super) clock_skewed: bool,
}

/// What the site stage leaves of a request: its kept measurements as rows, where each site's
/// go, and the sites whose own proxies name another client.
pub(super) struct Sited<'a> {
    /// The measurements kept, in request order.
    pub(super) kept: Vec<Kept<'a>>,
    /// Each known site's shard spool.
    pub(super) placement: Placement,
    /// Each site's own client, where it is not the request's.
    pub(super) clients: SiteClients,
}

/// Site: looks up each measurement's site ([`lookup_sites`], which refuses the whole request
/// first if it must), places each site's shard ([`place`]), finds each site's client
/// ([`site_clients`]), and makes each measurement a row under its site's rules ([`settle`]).
/// With nothing left: 403 listing every rejection.
pub(super) async fn site<'a>(
    state: &AppState,
    sender: &Sender<'_>,
    judged: Vec<(usize, Judged<'a>)>,
    report: &mut Accepted,
) -> Result<Sited<'a>, IntakeError> {
    let sites = lookup_sites(state, sender.origin, &judged).await?;
    let placement = place(state, &sites, judged.len())?;
    let clients = site_clients(state, sender, &sites);
    let kept = settle(state, sender, &sites, &clients, judged, report);
    if kept.is_empty() {
        let rejected = std::mem::take(&mut report.rejected);
        return Err(IntakeError::UnknownSite(rejected));
    }
    Ok(Sited {
        kept,
        placement,
        clients,
    })
}

/// Measurements of unknown or disabled sites are rejected, and so are those whose page is not
/// on one of their site's origins (`url_not_allowed`, contract v4 §2); each other one meets
/// its site's rules ([`measurement::site::settle`]: minimised, its page group, dimensions and
/// sample rate; the dimensions dropped go to the report) and counts toward its site's demand
/// as its client's ([`crate::sampling::Sampler::observe`]).
fn settle<'a>(
    state: &AppState,
    sender: &Sender<'_>,
    sites: &HashMap<String, Option<Arc<LoadedSite>>>,
    clients: &SiteClients,
    judged: Vec<(usize, Judged<'a>)>,
    report: &mut Accepted,
) -> Vec<Kept<'a>> {
    let mut kept = Vec::with_capacity(judged.len());
    for (index, mut judged) in judged {
        let error = match &sites[&*judged.site] {
            Some(site) if site.allows_page(&judged.url) => {
                let client = client_of(clients, &site.key, sender.client);
                if client != sender.client {
                    // Named by the shop's own proxy: its country, not the proxy's.
                    judged.country = Label(Cow::Owned(state.senders.countries.country(client)));
                }
                let dropped = std::mem::take(&mut judged.dropped);
                let clock_skewed = judged.clock_skewed;
                let (row, dims) = measurement::site::settle(judged, &site_rules(state, site));
                // Only browsers' beacons (they send Origin on every POST) count toward the
                // demand, each client address a bounded share of it: a flood without Origin,
                // or from a few addresses, must not lower a shop's rate.
                if sender.origin.is_some() {
                    let sampler = &state.sites.sampler;
                    sampler.observe(&site.key, site.sample_rate, client, [row.sample_rate]);
                }
                report
                    .dropped_fields
                    .extend(dims.into_iter().map(|field| DroppedField {
                        index,
                        field: Cow::Owned(field),
                    }));
                kept.push(Kept {
                    index,
                    row,
                    dropped,
                    clock_skewed,
                });
                continue;
            }
            Some(_) => URL_NOT_ALLOWED,
            None => UNKNOWN_SITE,
        };
        report.rejected.push(Rejected { index, error });
    }
    report.rejected.sort_by_key(|r| r.index);
    kept
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
        sampler: &state.sites.sampler,
        distinct: &state.sites.dimension_values,
    }
}

/// The client of each known site of a request whose own trusted proxies name another one than
/// the global list does (contract v5 §1: a shop's proxy is believed for that shop's beacons
/// only); a site absent here has the request's client.
pub(super) type SiteClients = Vec<(String, IpAddr)>;

fn site_clients(
    state: &AppState,
    sender: &Sender<'_>,
    sites: &HashMap<String, Option<Arc<LoadedSite>>>,
) -> SiteClients {
    let mut clients = SiteClients::new();
    for site in sites.values().flatten() {
        if site.trusted_proxies.is_empty() {
            continue;
        }
        let client = crate::client_ip::client_ip_for(
            sender.peer,
            sender.headers,
            &state.senders.trusted_proxies,
            &site.trusted_proxies,
            state.senders.client_ip_header,
        );
        if client != sender.client {
            clients.push((site.key.clone(), client));
        }
    }
    clients
}

/// The client of `site`'s measurements: its own ([`SiteClients`]) or the request's.
pub(super) fn client_of(clients: &SiteClients, site: &str, request: IpAddr) -> IpAddr {
    clients
        .iter()
        .find(|(key, _)| key == site)
        .map_or(request, |(_, ip)| *ip)
}

/// Each known site of a request and the place of its shard's spool
/// ([`crate::shards::ShardSpools::index`]); a request has few sites, as a rule one.
pub(super) type Placement = Vec<(String, usize)>;

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
        match state.storage.spools.index(&site.shard) {
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
        let site = match state.sites.settings.lookup(key).await {
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

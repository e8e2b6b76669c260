//! The stations of an intake request after its body arrived, in the order [`super::accept`]
//! calls them, one call each: [`enter`] (the in-flight bound), [`decode`], [`judge`] (which
//! knows no site), [`site`] (each measurement's site looked up, its origin and page checked,
//! its shard placed, and its site's rules applied, [`measurement::site::settle`]), [`shed`],
//! [`rate`], [`claim`] (the dedup window) and [`append`] (the durable spool append). Each
//! returns what the next one needs or the [`IntakeError`] that ends the request; what they
//! gather for the 202 goes into one [`Accepted`] report.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderMap, HeaderValue};
use serde::Serialize;
use tokio::sync::OwnedSemaphorePermit;

use crate::beacon::media::{self, Encoding};
use crate::beacon::{self, UNKNOWN_SITE, URL_NOT_ALLOWED};
use crate::dedup::{Claim, ClaimGuard};
use crate::error::{IntakeError, Rejected};
use crate::measurement::{self, Context, Judged, Label, Measurement};
use crate::settings::{LoadedSite, Lookup};
use crate::shards::Appends;
use crate::spool::AppendError;
use crate::state::AppState;
use crate::useragent::Agent;

/// How long a request waits for its spool append to become durable before answering 503.
pub const APPEND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request waits for another request that holds the same id.
pub const CLAIM_WAIT: Duration = Duration::from_secs(5);
/// `Retry-After` of a 503.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);
/// `Retry-After` of a 503 for a request shed at the in-flight bound or a full open group: a
/// place frees as soon as any request in flight has joined its group, and a group empties at
/// each sync, far sooner than the spool drains.
pub(crate) const SHED_RETRY_AFTER: Duration = Duration::from_secs(1);
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

/// The in-flight bound, taken once the body has arrived: `COLLECTOR_MAX_IN_FLIGHT` bounds the
/// work, not the waiting, so a request still sending its body (bounded by the body timeout and
/// the connection limit) holds no place, and a few slow senders cannot make every other beacon
/// a 503. Beyond the bound: shed, 503 at once. The place is held until the request's records
/// have joined their spools' open groups ([`append`]): a request waiting for its group's sync
/// holds none, so a slow sync does not turn into 503s (issue 53, "the tail"). The waiting
/// requests are bounded by the spool's groups (per shard, the open group and the one being
/// synced, each at most [`crate::spool::APPEND_QUEUE`] requests) and [`APPEND_TIMEOUT`], and
/// hold their claims and report only ([`Joined`]). One wait still holds a place: a request
/// whose id another request in flight holds waits for that one (at most [`CLAIM_WAIT`]), as
/// a page's second send of the same beacon does; the place bounds those.
pub(super) fn enter(state: &AppState) -> Result<OwnedSemaphorePermit, IntakeError> {
    state
        .bounds
        .limits
        .enter()
        .ok_or(IntakeError::Overloaded(SHED_RETRY_AFTER))
}

/// Decode: inflates the body (at most [`beacon::MAX_BODY_BYTES`], else 413; broken gzip: 400) and
/// reads it as text ([`beacon::decode::text`]), borrowed from `raw` when nothing had to change.
pub(super) fn decode(raw: &[u8], encoding: Encoding) -> Result<Cow<'_, str>, IntakeError> {
    Ok(match media::inflate(raw, encoding)? {
        Cow::Borrowed(bytes) => beacon::decode::text(bytes),
        Cow::Owned(bytes) => Cow::Owned(beacon::decode::text(&bytes).into_owned()),
    })
}

/// What a request says of its sender besides its body, found once: each of its measurements
/// gets it.
pub(super) struct Sender<'h> {
    /// The peer's address.
    peer: IpAddr,
    /// The request's headers.
    headers: &'h HeaderMap,
    /// Its `Origin`, as text (a browser sends one on every POST).
    origin: Option<&'h str>,
    /// The client the global trusted proxies name ([`crate::client_ip::client_ip`]); it serves
    /// the rates and the country, and goes no further.
    client: IpAddr,
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
            beacon::user_agent(headers.get(header::USER_AGENT).map(HeaderValue::as_bytes));
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
    fn with_origin(&self) -> bool {
        self.headers.contains_key(header::ORIGIN)
    }
}

/// Judge: parses the text into items (broken syntax, an empty body or array, or more than
/// [`crate::beacon::MAX_BATCH`] items: 400) and judges each by the field table's rules,
/// knowing no site ([`measurement::fields::judge`]); the rejected ones go to the report. With
/// none valid: 400 listing every rejection.
// Never inlined, so that a profile of the whole-program (LTO) build names the station.
#[inline(never)]
pub(super) fn judge<'a>(
    text: &'a str,
    sender: &'a Sender<'_>,
    report: &mut Accepted,
) -> Result<Vec<(usize, Judged<'a>)>, IntakeError> {
    let items = beacon::decode::parse(text)?;
    let ctx = Context {
        received_at_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64),
        user_agent: &sender.user_agent,
        agent: &sender.agent,
        country: &sender.country,
    };
    let mut judged = Vec::with_capacity(items.len());
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

/// What the report still needs of a measurement its site's rules made a row: its index in
/// the body and what judging it dropped. Kept beside the rows, not with them, so that the
/// rows (about 870 bytes each) are moved once, into [`Sited::rows`], and stay there up to
/// their encoding (issue 53: each move of a row cost a batched beacon a memmove).
struct Kept {
    /// Its index in the request array.
    index: usize,
    /// Names of the optional fields dropped as invalid.
    dropped: Vec<&'static str>,
    /// Whether its `ts` was withheld for clock skew.
    clock_skewed: bool,
}

/// What the site stage leaves of a request: its kept measurements as rows, where each site's
/// go, and the sites whose own proxies name another client.
pub(super) struct Sited<'a> {
    /// The measurements kept as rows, in request order.
    rows: Vec<Measurement<'a>>,
    /// What the report needs of each row, at the same place.
    kept: Vec<Kept>,
    /// Each known site's shard spool.
    placement: Placement,
    /// Each site's own client, where it is not the request's.
    clients: SiteClients,
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
    let (rows, kept) = settle(state, sender, &sites, &clients, judged, report);
    if rows.is_empty() {
        let rejected = std::mem::take(&mut report.rejected);
        return Err(IntakeError::UnknownSite(rejected));
    }
    Ok(Sited {
        rows,
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
// Never inlined, so that a profile of the whole-program (LTO) build names the station.
#[inline(never)]
fn settle<'a>(
    state: &AppState,
    sender: &Sender<'_>,
    sites: &HashMap<String, Option<Arc<LoadedSite>>>,
    clients: &SiteClients,
    judged: Vec<(usize, Judged<'a>)>,
    report: &mut Accepted,
) -> (Vec<Measurement<'a>>, Vec<Kept>) {
    let mut rows = Vec::with_capacity(judged.len());
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
                rows.push(row);
                kept.push(Kept {
                    index,
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
    (rows, kept)
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
type SiteClients = Vec<(String, IpAddr)>;

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

/// Shed: while the collector is near its bounds (fewer than a fifth of the places in flight
/// free, less than a fifth of the spool, or less than a fifth of the open group's room, where
/// requests wait behind a slow sync; [`crate::limits::RESERVED_SHARE`]), a request with a
/// measurement of a site over its budget is shed (503, `Retry-After`), so that what room is
/// left goes to the sites within theirs (contract v4 §2): a quiet shop never loses a beacon
/// because a loud one spiked.
pub(super) fn shed(state: &AppState, sited: &Sited<'_>) -> Result<(), IntakeError> {
    let loud = |site: &str| state.sites.sampler.over_budget(site);
    if !sited.rows.iter().any(|row| loud(&row.site)) {
        return Ok(());
    }
    // The room that matters is that of the loud sites' shards' spools.
    let share = crate::limits::RESERVED_SHARE;
    let short = sited.placement.iter().any(|(key, i)| {
        let spool = state.storage.spools.spool(*i);
        let reserve = spool.max_bytes() / share as u64;
        loud(key) && (!spool.has_room(reserve) || spool.group_strained(share))
    });
    if state.bounds.limits.strained() || short {
        return Err(IntakeError::Overloaded(SHED_RETRY_AFTER));
    }
    Ok(())
}

/// Rate: per-site rates, counted in measurements (a request without `Origin` against its
/// site's budget for such requests, see [`crate::limits`]), and, when `COLLECTOR_CLIENT_RATE`
/// is on, one request per site for this client. Over either: 429. A browser's request (with
/// `Origin`) first meets its client's share of the site's budget
/// ([`crate::limits::shares`]): beyond it while the site is over its budget, 429 without
/// spending the site's budget.
pub(super) fn rate(
    state: &AppState,
    sender: &Sender<'_>,
    sited: &Sited<'_>,
) -> Result<(), IntakeError> {
    let limits = &state.bounds.limits;
    let with_origin = sender.with_origin();
    let mut per_site: HashMap<&str, u32> = HashMap::new();
    for row in &sited.rows {
        *per_site.entry(&*row.site).or_default() += 1;
    }
    for (site, n) in per_site {
        let client = client_of(&sited.clients, site, sender.client);
        if with_origin {
            limits
                .check_share(site, client, n)
                .map_err(IntakeError::OverShare)?;
        }
        if limits.client_rate_on() {
            limits
                .check_client(site, client)
                .map_err(IntakeError::RateLimited)?;
        }
        limits.check_site(site, n, with_origin).map_err(|wait| {
            IntakeError::RateLimited(state.sites.sampler.retry_after(site, wait))
        })?;
    }
    Ok(())
}

/// What the claim leaves to store: the rows, the claims to commit once they are durable, each
/// with the place of its row, and where each site's rows go.
pub(super) struct Claimed<'a> {
    /// The rows to store, in request order.
    rows: Vec<Measurement<'a>>,
    /// The claims taken, each with its row's place in `rows`.
    guards: Vec<(usize, ClaimGuard)>,
    /// Each site's shard spool, from the site stage.
    placement: Placement,
}

/// Claim: claims each id in the dedup window; within one request a repeated id is a duplicate
/// of the first. The dropped fields and skewed clocks of the kept measurements go to the
/// report. The rows to store stay where the site stage put them; only those after a
/// duplicate move up.
pub(super) async fn claim<'a>(
    state: &AppState,
    sited: Sited<'a>,
    report: &mut Accepted,
) -> Claimed<'a> {
    let Sited {
        mut rows,
        kept,
        placement,
        ..
    } = sited;
    let mut guards = Vec::with_capacity(rows.len());
    let mut stored = Vec::with_capacity(rows.len());
    let mut seen = HashSet::with_capacity(rows.len());
    let mut placed = 0;
    for (k, row) in kept.iter().zip(&rows) {
        report
            .dropped_fields
            .extend(k.dropped.iter().map(|&field| DroppedField {
                index: k.index,
                field: Cow::Borrowed(field),
            }));
        report.clock_skewed += k.clock_skewed as u64;
        let store = seen.insert(row.id)
            && match state.storage.dedup.claim(row.id) {
                Claim::New(guard) => {
                    // The row's place once the duplicates before it are gone.
                    guards.push((placed, guard));
                    true
                }
                Claim::Duplicate => false,
                Claim::InFlight(other) => !other.wait(CLAIM_WAIT).await,
            };
        placed += usize::from(store);
        report.duplicates += usize::from(!store);
        stored.push(store);
    }
    let mut store = stored.into_iter();
    rows.retain(|_| store.next().unwrap_or(false));
    Claimed {
        rows,
        guards,
        placement,
    }
}

/// Append: encodes the rows once (the spool keeps them as the writer sends them), one record
/// per shard of the request's sites ([`Placement`]), adds each to its shard's open group at
/// once and lets go of the request's `place` in flight ([`enter`]). The wait for the groups'
/// syncs is [`Joined::stored`]'s, after the request has let go of its body and rows too.
pub(super) fn append(
    state: &AppState,
    claimed: Claimed<'_>,
    place: OwnedSemaphorePermit,
) -> Joined {
    let Claimed {
        rows,
        guards,
        placement,
    } = claimed;
    let guards = guards
        .into_iter()
        .map(|(i, guard)| (shard_of(&placement, &rows[i]), guard))
        .collect();
    let appends = join(state, &rows, &placement);
    drop(place);
    Joined {
        rows: rows.len(),
        guards,
        appends,
    }
}

/// A request's records in their shards' open groups, and what it still holds while it waits
/// for their syncs: its claims, each with the shard of its row. Its body, text and rows are
/// gone by then; what bounds the waiting requests is the spool's groups (per shard, the open
/// group and the one being synced, each at most [`crate::spool::APPEND_QUEUE`] requests).
pub(super) struct Joined {
    /// Rows appended.
    rows: usize,
    /// The claims taken, each with its row's shard.
    guards: Vec<(usize, ClaimGuard)>,
    /// The joined records; `None`: nothing to wait for (no row, or the ablation's build).
    appends: Option<Appends>,
}

impl Joined {
    /// Waits until every record is durable (at most [`APPEND_TIMEOUT`]); a refused append is a
    /// 503. What became durable is claimed for good, on a refusal too (another shard's part of
    /// a request that spans shards): the client's retry then folds it as a duplicate. Returns
    /// how many rows were stored.
    pub(super) async fn stored(self) -> Result<usize, IntakeError> {
        let appended = match self.appends {
            None => Ok(()),
            Some(appends) => appends
                .wait()
                .await
                .map_err(|(e, durable)| (append_refused(e), durable)),
        };
        for (shard, guard) in self.guards {
            if appended
                .as_ref()
                .map_or_else(|(_, durable)| durable.contains(&shard), |()| true)
            {
                guard.commit();
            }
        }
        appended.map_err(|(e, _)| e)?;
        Ok(self.rows)
    }
}

/// Encodes `rows` into one record per shard and adds them to the shards' open groups.
fn join(state: &AppState, rows: &[Measurement<'_>], placement: &Placement) -> Option<Appends> {
    if rows.is_empty() {
        return None;
    }
    let first = shard_of(placement, &rows[0]);
    let records = if rows.iter().all(|m| shard_of(placement, m) == first) {
        vec![(first, measurement::encode(rows))]
    } else {
        let mut shards: Vec<usize> = rows.iter().map(|m| shard_of(placement, m)).collect();
        shards.sort_unstable();
        shards.dedup();
        shards
            .into_iter()
            .map(|i| {
                let part = rows.iter().filter(|m| shard_of(placement, m) == i);
                (i, measurement::encode(part))
            })
            .collect()
    };
    // The ablation benchmark's build (scripts/bench.sh --ablation): every station, then 202
    // without storing anything. Never in a shipped build (the branch is compiled out).
    if cfg!(feature = "bench-no-append") {
        std::hint::black_box(records);
        return None;
    }
    Some(state.storage.spools.join(records, APPEND_TIMEOUT))
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

#[cfg(test)]
mod tests {
    use super::*;

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

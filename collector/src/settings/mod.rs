//! Site settings: the PostgreSQL store and the cache intake reads through.
//!
//! The request path never waits on PostgreSQL while it has an answer, fresh or stale:
//!
//! - **Warm start.** At start every site is loaded in one query ([`SiteSettings::reload`]);
//!   the same full load runs every `COLLECTOR_SETTINGS_TTL` in the background, and each
//!   successful one is written to the snapshot file ([`snapshot`]). A collector started while
//!   the store is down loads the snapshot instead and says so (log, and
//!   `collector_settings_from_snapshot 1`).
//! - **Stale-while-revalidate.** A site's settings are fresh for `COLLECTOR_SETTINGS_TTL`. An
//!   expired entry is answered at once from the last known value
//!   (`collector_settings_stale_served_total`) while one background refresh per site runs.
//! - **Backoff.** After a failure the store is left alone for `COLLECTOR_SETTINGS_BACKOFF`
//!   by every path, then tried with one call ([`breaker::Breaker`]).
//! - **Bounded first fetch.** A never-seen key is fetched once however many requests carry it
//!   (moka's single-flight `try_get_with`); at most [`FIRST_FETCHES`] first fetches run at once
//!   and at most [`FIRST_FETCH_RATE`] start per second (governor's GCRA limiter), whatever the
//!   keys: random keys cannot load the store. Unknown keys are remembered as unknown for
//!   [`UNKNOWN_TTL`]. While the store cannot be asked a never-seen key is
//!   [`Lookup::Unavailable`] (a 503 with `Retry-After`); while the first-fetch budget is
//!   spent it is [`Lookup::Limited`] (a 429 with `Retry-After`: load shed because of the keys
//!   sent, not an outage, so it does not page as 5xx does). The script retries both. A site
//!   added after start is therefore known within one full load
//!   (`COLLECTOR_SETTINGS_TTL`) at the latest, at once when the budget allows.
//!
//! So the store sees at most `FIRST_FETCH_RATE` queries per second for first fetches, plus
//! one full load per TTL and one refresh per known site per TTL.
//!
//! The store knows nothing of ClickHouse or HTTP.

pub mod breaker;
pub mod postgres;
pub mod purges;
pub mod snapshot;
pub mod store;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Semaphore};
// The runtime's clock, so that tests can pause and advance it.
use tokio::time::Instant;

use crate::measurement::minimise::split_scheme;
use crate::measurement::page_groups::PageGroups;
use crate::metrics::Metrics;
pub use store::{SettingsStore, StoreError};

/// How long an unknown site key is remembered as unknown (capped by the settings TTL).
pub const UNKNOWN_TTL: Duration = Duration::from_secs(10);
/// Most site keys cached, known and unknown together.
pub const CACHE_CAPACITY: u64 = 100_000;
/// Most first fetches (never-seen keys) in flight at once; more get [`Lookup::Limited`].
pub const FIRST_FETCHES: usize = 8;
/// Most first fetches started per second (and the burst); more get [`Lookup::Limited`].
pub const FIRST_FETCH_RATE: u32 = 5;
/// How often a collector whose settings were never loaded tries a full load again: each try
/// passes the store's circuit breaker, so the store itself is asked at most once per
/// `COLLECTOR_SETTINGS_BACKOFF`.
pub const UNLOADED_RETRY: Duration = Duration::from_secs(1);

/// Where site settings come from: the seam between the cache and its store. Production uses
/// [`SettingsStore`] (PostgreSQL behind a circuit breaker); the in-process tests use an
/// in-memory source. Each call answers or fails on its own; the cache decides when to call.
pub trait SiteSource: Send + Sync + 'static {
    /// One site by key; `Ok(None)` when it does not exist.
    fn fetch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Site>, StoreError>>;
    /// Every site, ordered by key.
    fn fetch_all(&self) -> BoxFuture<'_, Result<Vec<Site>, StoreError>>;
    /// Records that the collector `name` serves, saying so every `every` ([`crate::purges`]);
    /// whether it was recorded. The default records nothing.
    fn collector_seen<'a>(
        &'a self,
        _name: &'a str,
        _every: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async { Ok(false) })
    }
    /// Records that the collector `name` has deleted `site`'s records from its files (`rows`
    /// of them) for the site's current purge; whether it was recorded. The default records
    /// nothing.
    fn purge_done<'a>(
        &'a self,
        _site: &'a str,
        _name: &'a str,
        _rows: i64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async { Ok(false) })
    }
}

impl SiteSource for SettingsStore {
    fn fetch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Site>, StoreError>> {
        Box::pin(SettingsStore::fetch(self, key))
    }

    fn fetch_all(&self) -> BoxFuture<'_, Result<Vec<Site>, StoreError>> {
        Box::pin(SettingsStore::fetch_all(self))
    }

    fn collector_seen<'a>(
        &'a self,
        name: &'a str,
        every: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(SettingsStore::collector_seen(self, name, every))
    }

    fn purge_done<'a>(
        &'a self,
        site: &'a str,
        name: &'a str,
        rows: i64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(SettingsStore::purge_done(self, site, name, rows))
    }
}

/// One site's settings, as stored in the `sites` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Site {
    /// Site key (primary key).
    pub key: String,
    /// Allowed `Origin` values, serialised as `scheme://host[:port]`; empty allows any.
    pub allowed_origins: Vec<String>,
    /// Fraction of page views the tracking script reports, 0 to 1.
    pub sample_rate: f64,
    /// Disabled sites are answered 403.
    pub enabled: bool,
    /// The query parameters of a page URL the site keeps (contract v4 §2): names, or prefixes
    /// ending in `*`; every other parameter is dropped before anything is stored.
    #[serde(default = "default_keep_query")]
    pub keep_query: Vec<String>,
    /// Page-group rules, in order, each `NAME=PATTERN` (contract v4 §1).
    #[serde(default)]
    pub page_groups: Vec<String>,
    /// The dimension names the site declared (contract v4 §2), at most 5.
    #[serde(default)]
    pub dimensions: Vec<String>,
    /// Erased (`collector sites purge`): its records still in a spool are dropped, never
    /// inserted.
    #[serde(default)]
    pub purged: bool,
    /// The shard the site lives on (contract v5 §3): chosen once when it is added
    /// ([`place`]) and never changed by the collector. A row of a store not yet migrated to
    /// v5 reads as [`crate::config::DEFAULT_SHARD`], the one replica set of earlier releases.
    #[serde(default = "default_shard")]
    pub shard: String,
    /// The shop's own reverse proxies (contract v5 §1, `--trusted-proxy`): CIDRs whose
    /// client-address header is believed for this site's measurements only, at most
    /// [`MAX_TRUSTED_PROXIES`]. A row of a store not yet migrated to v5 reads as none.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
}

fn default_shard() -> String {
    crate::config::DEFAULT_SHARD.to_owned()
}

/// The shard a new site is placed on when `sites add` names none (contract v5 §3): the one at
/// position `cityHash64(key) mod n` of the configured shards (`names`, in their configured
/// order, at least one), so that ClickHouse's `cityHash64` (CityHash 1.0.2) gives the same
/// answer in SQL.
pub fn place<'a>(key: &str, names: &[&'a str]) -> &'a str {
    let hash = ch_cityhash102::cityhash64(key.as_bytes());
    names[(hash % names.len() as u64) as usize]
}

/// The query parameters a site keeps unless it says otherwise: the campaign tags.
pub const DEFAULT_KEEP_QUERY: &str = "utm_*";

/// The lowest configured `sample_rate`: one page view in a thousand (`sites add/update
/// --sample-rate` takes 0.001 to 1). A stored row below it (the CLI took 0 to 1 before) is read
/// as a disabled site when 0, and as this rate when above: a rate of 0, or a denormal one,
/// would weigh each of its rows `1 / 0` in a weighted read.
pub const MIN_CONFIGURED_RATE: f64 = 0.001;

fn default_keep_query() -> Vec<String> {
    vec![DEFAULT_KEEP_QUERY.to_owned()]
}

impl Site {
    /// A site of `key` with the defaults: any origin, every page view sent, enabled, the
    /// default query parameters kept, no page groups or dimensions.
    pub fn new(key: impl Into<String>) -> Site {
        Site {
            key: key.into(),
            allowed_origins: Vec::new(),
            sample_rate: 1.0,
            enabled: true,
            keep_query: default_keep_query(),
            page_groups: Vec::new(),
            dimensions: Vec::new(),
            purged: false,
            shard: default_shard(),
            trusted_proxies: Vec::new(),
        }
    }

    /// Whether a measurement of the page at `url` (normalised) belongs to the site: any page
    /// when the site lists no origins, else a page whose host is the host of one of them
    /// (contract v4 §2: a beacon must come from its shop's pages).
    pub fn allows_page(&self, url: &str) -> bool {
        if self.allowed_origins.is_empty() {
            return true;
        }
        let host =
            split_scheme(url).map_or("", |(_, rest)| rest.split(['/', '?']).next().unwrap_or(""));
        let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
        let host = strip_port(host);
        self.allowed_origins.iter().any(|o| {
            let origin_host = split_scheme(o).map_or(o.as_str(), |(_, h)| h);
            strip_port(origin_host).eq_ignore_ascii_case(host)
        })
    }

    /// Whether a request with this `Origin` header may send beacons for the site: a request
    /// without `Origin` is judged by the site key alone (contract §2). Origins are compared as
    /// RFC 6454 compares them, by scheme, host and port: `https://shop.example:443` (an
    /// explicit default port, as some proxies and clients write it) and `HTTPS://Shop.Example`
    /// are `https://shop.example`. A value that is no http(s) origin (`null`) is allowed by
    /// no list.
    pub fn allows_origin(&self, origin: Option<&str>) -> bool {
        let Some(o) = origin else { return true };
        if self.allowed_origins.is_empty()
            || self
                .allowed_origins
                .iter()
                .any(|a| a.eq_ignore_ascii_case(o))
        {
            // A browser's `Origin` is already serialised: no parse on this path.
            return true;
        }
        let Some(o) = normalise_origin(o) else {
            return false;
        };
        // `sites add` stores serialised origins; a row written otherwise is serialised here.
        self.allowed_origins
            .iter()
            .any(|a| *a == o || normalise_origin(a).is_some_and(|a| a == o))
    }
}

/// `host[:port]` without its port (an IPv6 host keeps its brackets).
fn strip_port(host_port: &str) -> &str {
    if host_port.starts_with('[') {
        return host_port.split_inclusive(']').next().unwrap_or(host_port);
    }
    host_port.split(':').next().unwrap_or(host_port)
}

/// Normalises an origin as a browser sends it in `Origin`: `scheme://host[:port]`, lowercase,
/// default port omitted. `None` for anything that is not an http(s) origin.
pub fn normalise_origin(s: &str) -> Option<String> {
    let url = url::Url::parse(s.trim()).ok()?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return None;
    }
    // An origin is scheme, host and port only (RFC 6454 §4): a path, query, fragment or
    // credentials mean the value is a page URL, refused rather than silently cut.
    let bare = url.path() == "/"
        && url.query().is_none()
        && url.fragment().is_none()
        && url.username().is_empty()
        && url.password().is_none();
    bare.then(|| url.origin().ascii_serialization())
}

/// Why a value of a site's lists (`collector sites add|update`) is refused; each message names
/// the rule broken (the flag and value are added by the caller).
#[derive(Debug, thiserror::Error)]
pub enum SiteValueError {
    /// More than [`MAX_TRUSTED_PROXIES`] trusted proxies.
    #[error("at most {MAX_TRUSTED_PROXIES} trusted proxies")]
    TooManyProxies,
    /// A trusted proxy that is neither a CIDR nor an address.
    #[error(transparent)]
    Proxy(#[from] crate::config::ValueError),
    /// A `--keep-query` value that is not a parameter name or a prefix ending in `*`.
    #[error("a parameter name, or a prefix ending in *, of 1 to 64 bytes")]
    KeepQuery,
    /// Page-group rules refused by [`crate::measurement::page_groups::check_all`] (its reason).
    #[error(transparent)]
    PageGroups(#[from] crate::measurement::page_groups::PageGroupsError),
    /// More than [`MAX_DIMENSIONS`] dimensions.
    #[error("at most {MAX_DIMENSIONS} dimensions")]
    TooManyDimensions,
    /// A dimension name that is not 1 to [`MAX_DIMENSION_NAME_BYTES`] bytes of `[a-z0-9_]`.
    #[error("{0:?}: a name is 1 to 32 bytes of a-z, 0-9 and _")]
    DimensionName(String),
    /// A dimension named twice.
    #[error("{0:?} given twice")]
    DimensionTwice(String),
}

/// Most `--trusted-proxy` CIDRs a site lists.
pub const MAX_TRUSTED_PROXIES: usize = 16;

/// A site's `--trusted-proxy` values as networks: at most [`MAX_TRUSTED_PROXIES`], each a CIDR
/// (`203.0.113.0/24`) or one address; `Err` names the first that is not.
pub fn check_trusted_proxies(values: &[String]) -> Result<Vec<IpNet>, SiteValueError> {
    if values.len() > MAX_TRUSTED_PROXIES {
        return Err(SiteValueError::TooManyProxies);
    }
    Ok(crate::config::cidrs(&values.join(","))?)
}

/// Most dimension names a site declares (contract v4 §2).
pub const MAX_DIMENSIONS: usize = 5;
/// Longest dimension name, in bytes (contract v4 §2).
pub const MAX_DIMENSION_NAME_BYTES: usize = 32;

/// A `--keep-query` value: a query parameter name, or a prefix ending in `*` (1 to 64 bytes,
/// no `&`, `=`, `#` or white space).
pub fn check_keep_query(value: &str) -> Result<(), SiteValueError> {
    let name = value.strip_suffix('*').unwrap_or(value);
    let ok = (1..=64).contains(&value.len())
        && !name.contains('*')
        && !value
            .chars()
            .any(|c| matches!(c, '&' | '=' | '#') || c.is_whitespace() || c.is_control());
    ok.then_some(()).ok_or(SiteValueError::KeepQuery)
}

/// Why a site's `--page-group` rules are not a list of them: more than
/// [`crate::measurement::page_groups::MAX_RULES`], or a rule that is not `NAME=PATTERN` (see
/// [`crate::measurement::page_groups`] for what it matches and the bounds of one).
pub fn check_page_groups(rules: &[String]) -> Result<(), SiteValueError> {
    Ok(crate::measurement::page_groups::check_all(rules)?)
}

/// The `--dimension` names of a site: at most [`MAX_DIMENSIONS`], each 1 to
/// [`MAX_DIMENSION_NAME_BYTES`] bytes of `[a-z0-9_]`, none twice.
pub fn check_dimensions(names: &[String]) -> Result<(), SiteValueError> {
    if names.len() > MAX_DIMENSIONS {
        return Err(SiteValueError::TooManyDimensions);
    }
    for (i, n) in names.iter().enumerate() {
        let ok = (1..=MAX_DIMENSION_NAME_BYTES).contains(&n.len())
            && n.bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'));
        if !ok {
            return Err(SiteValueError::DimensionName(n.clone()));
        }
        if names[..i].contains(n) {
            return Err(SiteValueError::DimensionTwice(n.clone()));
        }
    }
    Ok(())
}

/// A site's settings as the cache holds them: the row, and what intake needs compiled from it,
/// made once per load of the row (never per beacon). Reads as its [`Site`].
#[derive(Debug)]
pub struct LoadedSite {
    /// The row.
    pub site: Site,
    /// Its page-group rules, compiled.
    pub page_groups: PageGroups,
    /// Its own trusted proxies, parsed (contract v5 §1); a value that does not parse (a row
    /// written by hand) is left out, with a warning.
    pub trusted_proxies: Vec<IpNet>,
}

impl LoadedSite {
    /// Compiles what intake needs of `site`.
    pub fn new(site: Site) -> LoadedSite {
        let page_groups = PageGroups::compile(&site.page_groups);
        if page_groups.len() < site.page_groups.len() {
            // Only a row written by hand, or by an older release without the bounds, gets here.
            tracing::warn!(
                site = %site.key,
                rules = site.page_groups.len(),
                used = page_groups.len(),
                "settings: page-group rules left out (malformed, or past the first 200): \
                 `collector sites update --page-group ...` rewrites them"
            );
        }
        let trusted_proxies = site
            .trusted_proxies
            .iter()
            .filter_map(|p| match check_trusted_proxies(std::slice::from_ref(p)) {
                Ok(nets) => nets.into_iter().next(),
                Err(e) => {
                    tracing::warn!(site = %site.key, error = %e, "settings: a trusted proxy left out");
                    None
                }
            })
            .collect();
        LoadedSite {
            page_groups,
            trusted_proxies,
            site,
        }
    }
}

impl std::ops::Deref for LoadedSite {
    type Target = Site;
    fn deref(&self) -> &Site {
        &self.site
    }
}

/// The answer to a settings lookup.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// The site exists (enabled or not).
    Known(Arc<LoadedSite>),
    /// No such site.
    Unknown,
    /// The site is not cached and the store cannot be asked now.
    Unavailable,
    /// The site is not cached and the first-fetch budget is spent: ask again in a second.
    Limited,
}

/// A cached answer and when it was loaded.
#[derive(Debug)]
struct Entry {
    site: Option<Arc<LoadedSite>>,
    loaded: Instant,
}

struct EntryExpiry {
    unknown: Duration,
}

impl moka::Expiry<Arc<str>, Arc<Entry>> for EntryExpiry {
    fn expire_after_create(
        &self,
        _key: &Arc<str>,
        value: &Arc<Entry>,
        _now: std::time::Instant,
    ) -> Option<Duration> {
        // Known sites are never evicted by time: they are refreshed, and served stale while
        // the store is down. Unknown keys are forgotten after a while.
        value.site.is_none().then_some(self.unknown)
    }

    fn expire_after_update(
        &self,
        key: &Arc<str>,
        value: &Arc<Entry>,
        now: std::time::Instant,
        _current: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(key, value, now)
    }
}

/// Site settings as intake sees them: cached, stale-while-revalidate, bounded. Cheap to clone.
#[derive(Clone)]
pub struct SiteSettings {
    inner: Arc<Inner>,
}

struct Inner {
    cache: moka::future::Cache<Arc<str>, Arc<Entry>>,
    store: Arc<dyn SiteSource>,
    ttl: Duration,
    first_fetches: Semaphore,
    first_fetch_rate: governor::DefaultDirectRateLimiter,
    refreshing: Mutex<HashSet<Arc<str>>>,
    snapshot: Option<PathBuf>,
    loaded: AtomicBool,
    metrics: Arc<Metrics>,
    /// The keys of the erased sites as of the last full load (see [`SiteSettings::purged`]).
    purged: watch::Sender<PurgedSites>,
    /// The origins some enabled site lists, as of the last full load (see
    /// [`SiteSettings::lists_origin`]).
    listed_origins: std::sync::RwLock<Arc<HashSet<String>>>,
}

/// The keys of the sites erased by `collector sites purge`, whose records still in a spool
/// are dropped instead of inserted.
pub type PurgedSites = Arc<std::collections::BTreeSet<String>>;

impl SiteSettings {
    /// A cache over `store`; entries are fresh for `ttl`. Full loads are written to `snapshot`.
    pub fn new(
        store: Arc<dyn SiteSource>,
        ttl: Duration,
        snapshot: Option<PathBuf>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let cache = moka::future::Cache::builder()
            .max_capacity(CACHE_CAPACITY)
            .expire_after(EntryExpiry {
                unknown: ttl.min(UNKNOWN_TTL).max(Duration::from_millis(1)),
            })
            .build();
        SiteSettings {
            inner: Arc::new(Inner {
                cache,
                store,
                ttl,
                first_fetches: Semaphore::new(FIRST_FETCHES),
                first_fetch_rate: governor::RateLimiter::direct(governor::Quota::per_second(
                    std::num::NonZeroU32::new(FIRST_FETCH_RATE).expect("a positive rate"),
                )),
                refreshing: Mutex::new(HashSet::new()),
                snapshot,
                loaded: AtomicBool::new(false),
                metrics,
                purged: watch::channel(PurgedSites::default()).0,
                listed_origins: std::sync::RwLock::default(),
            }),
        }
    }

    /// The erased sites, as of the last full load (from the store or the snapshot): a watch
    /// the writer holds, so that it drops their records instead of inserting them (within one
    /// `COLLECTOR_SETTINGS_TTL` of the purge).
    pub fn purged(&self) -> watch::Receiver<PurgedSites> {
        self.inner.purged.subscribe()
    }

    /// Every site the cache holds (as of the last full load and the lookups since), in no
    /// order: what the rules at rest are made of ([`crate::purges`]).
    pub fn known_sites(&self) -> Vec<Arc<LoadedSite>> {
        self.inner
            .cache
            .iter()
            .filter_map(|(_, entry)| entry.site.clone())
            .collect()
    }

    /// Whether some enabled site lists `origin` among its allowed origins (contract v5 §2: an
    /// `OPTIONS` preflight that names no site echoes an origin only then), as of the last full
    /// load (every `COLLECTOR_SETTINGS_TTL`). Compared as origins are (RFC 6454: scheme, host,
    /// port). Before any load, `true`: nothing can be judged yet, and the `POST` is checked.
    pub fn lists_origin(&self, origin: &str) -> bool {
        if !self.is_loaded() {
            return true;
        }
        let listed = self
            .inner
            .listed_origins
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        listed.contains(origin) || normalise_origin(origin).is_some_and(|o| listed.contains(&o))
    }

    /// Whether settings have been loaded once (from the store or the snapshot): until then
    /// every request would need the store, and `/readyz` says not ready.
    pub fn is_loaded(&self) -> bool {
        self.inner.loaded.load(Ordering::Acquire)
    }

    /// Loads every site in one query, replaces the cache's view of them, and writes the
    /// snapshot. Returns the number of sites.
    pub async fn reload(&self) -> Result<usize, StoreError> {
        let inner = &self.inner;
        let sites = inner.store.fetch_all().await?;
        let now = Instant::now();
        let keys: HashSet<&str> = sites.iter().map(|s| s.key.as_str()).collect();
        self.put(&sites, now).await;
        // Sites deleted from the store become unknown.
        for (key, entry) in inner.cache.iter() {
            if entry.site.is_some() && !keys.contains(&**key) {
                inner
                    .cache
                    .insert(
                        (*key).clone(),
                        Arc::new(Entry {
                            site: None,
                            loaded: now,
                        }),
                    )
                    .await;
            }
        }
        if let Some(path) = &inner.snapshot {
            if let Err(e) = snapshot::write(path, &sites) {
                crate::logging::warn_limited(
                    "settings_snapshot",
                    || tracing::warn!(error = %crate::logging::chain(&e), path = %path.display(), "cannot write the settings snapshot"),
                );
            }
        }
        inner.metrics.settings.from_snapshot.set(0);
        inner.metrics.settings.loaded(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        inner.loaded.store(true, Ordering::Release);
        Ok(sites.len())
    }

    /// Loads the snapshot into the cache as already-stale entries (so that they are
    /// refreshed as soon as the store answers). Returns the number of sites.
    pub async fn load_snapshot(&self) -> std::io::Result<usize> {
        let inner = &self.inner;
        let Some(path) = &inner.snapshot else {
            return Ok(0);
        };
        let (sites, written_at) = snapshot::read(path)?;
        let stale = Instant::now()
            .checked_sub(inner.ttl)
            .unwrap_or_else(Instant::now);
        self.put(&sites, stale).await;
        tracing::warn!(sites = sites.len(), written_at, path = %path.display(), "settings store unreachable: serving the last known settings from the snapshot");
        inner.metrics.settings.from_snapshot.set(1);
        inner.metrics.settings.loaded(written_at as f64);
        inner.loaded.store(true, Ordering::Release);
        Ok(sites.len())
    }

    /// Caches `sites` as loaded at `loaded`.
    async fn put(&self, sites: &[Site], loaded: Instant) {
        let purged: PurgedSites = Arc::new(
            sites
                .iter()
                .filter(|s| s.purged)
                .map(|s| s.key.clone())
                .collect(),
        );
        self.inner.purged.send_if_modified(|now| {
            let changed = *now != purged;
            *now = purged;
            changed
        });
        let listed: HashSet<String> = sites
            .iter()
            .filter(|s| s.enabled && !s.purged)
            .flat_map(|s| s.allowed_origins.iter().filter_map(|o| normalise_origin(o)))
            .collect();
        *self
            .inner
            .listed_origins
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(listed);
        for site in sites {
            let entry = Entry {
                site: Some(Arc::new(LoadedSite::new(site.clone()))),
                loaded,
            };
            self.inner
                .cache
                .insert(Arc::from(site.key.as_str()), Arc::new(entry))
                .await;
        }
    }

    /// Reloads every `ttl` until `shutdown` turns true. While no load has ever succeeded (the
    /// collector is not ready), it tries every [`UNLOADED_RETRY`] instead: the store's breaker
    /// still lets one attempt through per `COLLECTOR_SETTINGS_BACKOFF`, so readiness follows
    /// the store's return within the backoff, not within the TTL.
    pub async fn run_reloader(self, mut shutdown: watch::Receiver<bool>) {
        let ttl = self.inner.ttl.max(Duration::from_millis(100));
        loop {
            let wait = if self.is_loaded() {
                ttl
            } else {
                ttl.min(UNLOADED_RETRY)
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {
                    if let Err(e) = self.reload().await {
                        tracing::debug!(error = %e, "settings reload skipped");
                    }
                }
                _ = shutdown.changed() => return,
            }
        }
    }

    /// The settings of `key`, never waiting on the store while any answer is cached.
    pub async fn lookup(&self, key: &str) -> Lookup {
        let inner = &self.inner;
        if let Some(entry) = inner.cache.get(key).await {
            if entry.site.is_some() && entry.loaded.elapsed() >= inner.ttl {
                inner.metrics.settings.stale_served.inc();
                self.refresh(key);
            }
            return entry.site.clone().map_or(Lookup::Unknown, Lookup::Known);
        }
        let store = &*inner.store;
        let fetched = inner
            .cache
            .try_get_with(Arc::from(key), async {
                let _permit = inner
                    .first_fetches
                    .try_acquire()
                    .map_err(|_| {
                        inner.metrics.settings.first_fetch_limited.inc();
                        StoreError::Limited
                    })?;
                if inner.first_fetch_rate.check().is_err() {
                    inner.metrics.settings.first_fetch_limited.inc();
                    return Err(StoreError::Limited);
                }
                let asked = Instant::now();
                let site = store.fetch(key).await;
                tracing::debug!(key, took = ?asked.elapsed(), ok = site.is_ok(), "settings: first fetch of a site");
                let site = site?;
                inner.loaded.store(true, Ordering::Release);
                Ok::<_, StoreError>(Arc::new(Entry {
                    site: site.map(|s| Arc::new(LoadedSite::new(s))),
                    loaded: Instant::now(),
                }))
            })
            .await;
        match fetched {
            Ok(entry) => entry.site.clone().map_or(Lookup::Unknown, Lookup::Known),
            Err(e) if matches!(*e, StoreError::Limited) => Lookup::Limited,
            Err(_) => Lookup::Unavailable,
        }
    }

    /// Starts one background refresh of `key` unless one is running.
    fn refresh(&self, key: &str) {
        let key: Arc<str> = Arc::from(key);
        if !self.inner.refreshing.lock().unwrap().insert(key.clone()) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let inner = &this.inner;
            if let Ok(site) = inner.store.fetch(&key).await {
                inner
                    .cache
                    .insert(
                        key.clone(),
                        Arc::new(Entry {
                            site: site.map(|s| Arc::new(LoadedSite::new(s))),
                            loaded: Instant::now(),
                        }),
                    )
                    .await;
            }
            inner.refreshing.lock().unwrap().remove(&key);
        });
    }
}

#[cfg(test)]
mod tests;

//! The state every endpoint shares, in a module of its own so that the server (which serves
//! any router) and the endpoints (which read this state) do not import each other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use tokio_util::task::TaskTracker;

use crate::dedup::Dedup;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::script::Script;
use crate::settings::SiteSettings;
use crate::shards::ShardSpools;

/// State shared by every endpoint. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

/// What [`AppState`] holds, in parts by what they serve.
pub struct Inner {
    /// The sites: their settings and what intake keeps per site.
    pub sites: Sites,
    /// What intake reads of a request's sender besides its body.
    pub senders: Senders,
    /// Where accepted measurements go.
    pub storage: Storage,
    /// The bounds on intake's work.
    pub bounds: Bounds,
    /// Tracking script.
    pub script: Script,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Set once drain begins.
    pub(crate) draining: AtomicBool,
    /// Intake requests whose body has arrived, each finishing in a task of its own even when
    /// its client has gone; the drain waits for them ([`crate::endpoints::intake::post`]).
    pub requests: TaskTracker,
}

/// The sites: their settings and what intake keeps per site.
pub struct Sites {
    /// Site settings (cache over the store).
    pub settings: SiteSettings,
    /// The sample rates of sites over their budget.
    pub sampler: crate::sampling::Sampler,
    /// The distinct dimension values stored per site, name and UTC day (bounded).
    pub dimension_values: crate::measurement::dimensions::DistinctValues,
}

/// What intake reads of a request's sender: its user agent, its address, its country.
pub struct Senders {
    /// Parsed user agents (bounded cache).
    pub user_agents: crate::useragent::UserAgents,
    /// Peers whose forwarding header is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// The one header those peers name the client in.
    pub client_ip_header: crate::client_ip::ClientIpHeader,
    /// The country database (none: `country` empty).
    pub countries: crate::geo::Countries,
}

/// Where accepted measurements go.
pub struct Storage {
    /// Dedup window.
    pub dedup: Dedup,
    /// The spool appender of every shard (contract v5 §3).
    pub spools: ShardSpools,
}

/// The bounds on intake's work.
pub struct Bounds {
    /// Rate limits and the in-flight bound.
    pub limits: Limits,
    /// Bound on receiving a request body.
    pub body_timeout: Duration,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl AppState {
    /// Assembles the shared state.
    pub fn new(inner: Inner) -> Self {
        AppState {
            inner: Arc::new(inner),
        }
    }

    /// Whether drain has begun.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Begins drain: `/readyz` answers 503 from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }
}

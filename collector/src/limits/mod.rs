//! Load shedding and rate limits for the intake.
//!
//! - **In flight**: at most `COLLECTOR_MAX_IN_FLIGHT` intake requests are worked on at once
//!   (from their body's arrival until their measurements have joined the spool's group commit;
//!   the wait for its sync is bounded by the spool's groups, [`crate::spool::APPEND_QUEUE`]
//!   each); one more is answered 503 with `Retry-After` at once (never queued without bound).
//! - **Per client**: `COLLECTOR_CLIENT_RATE` requests per second per site and client address
//!   ([`crate::client_ip`]), bursts of twice that; over it, 429 with `Retry-After`. Off by
//!   default (contract v2 §1): every visitor behind a shop's own proxy, a corporate NAT or a
//!   carrier's CGNAT shares one address, so it suits only a collector exposed directly to
//!   browsers. Keyed by site too, so that one busy shop behind a shared address does not
//!   use up another's requests.
//! - **Per site**: `COLLECTOR_SITE_RATE` measurements per second per site, bursts of twice
//!   that; over it, 429 with `Retry-After`. Requests without `Origin` draw on a budget of their
//!   own, a tenth of the site's ([`ORIGIN_LESS_SHARE`], contract v4 §2): browsers send `Origin`
//!   on every beacon's POST, so a flood without it is not the shop's visitors, and it must not
//!   use up their budget.
//!
//! - **Per client, within a site's budget** ([`shares`], contract v5 §2): while a site is over
//!   its budget, a client's measurements beyond its share of it are refused first (429), so
//!   that one client sending far more than a visitor cannot take the budget from the site's
//!   visitors. On whenever the per-site rate is.
//!
//! Rates use the GCRA limiters of the `governor` crate. Their per-key state is pruned every
//! [`PRUNE_INTERVAL`] so that it stays bounded by the keys seen recently.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

pub mod shares;

use shares::ClientShares;

/// The share of a site's rate that its requests without `Origin` may use: a tenth.
pub const ORIGIN_LESS_SHARE: u32 = 10;

/// The share of the places in flight, and of the spool, kept for sites within their budget: a
/// fifth.
pub const RESERVED_SHARE: usize = 5;

/// How often idle rate-limiter state is pruned.
pub const PRUNE_INTERVAL: Duration = Duration::from_secs(10);

/// The intake's limits. Cheap to clone.
#[derive(Clone)]
pub struct Limits {
    clients: Option<Arc<DefaultKeyedRateLimiter<(String, IpAddr)>>>,
    sites: Option<Arc<DefaultKeyedRateLimiter<String>>>,
    /// The sites' budgets for requests without `Origin`.
    origin_less: Option<Arc<DefaultKeyedRateLimiter<String>>>,
    /// Each site's clients' shares of its budget (`None` with the per-site rate off).
    shares: Option<Arc<ClientShares>>,
    /// `COLLECTOR_SITE_RATE`.
    site_rate: u32,
    in_flight: Arc<Semaphore>,
    /// `COLLECTOR_MAX_IN_FLIGHT`.
    max_in_flight: usize,
}

fn limiter<K: std::hash::Hash + Eq + Clone>(
    per_second: u32,
) -> Option<Arc<DefaultKeyedRateLimiter<K>>> {
    let rate = NonZeroU32::new(per_second)?;
    let burst = NonZeroU32::new(per_second.saturating_mul(2)).unwrap_or(rate);
    Some(Arc::new(RateLimiter::keyed(
        Quota::per_second(rate).allow_burst(burst),
    )))
}

impl Limits {
    /// Limits with the given rates (0 turns a rate off) and in-flight bound (at least 1).
    pub fn new(client_rate: u32, site_rate: u32, max_in_flight: usize) -> Self {
        Limits {
            clients: limiter(client_rate),
            sites: limiter(site_rate),
            origin_less: (site_rate > 0)
                .then(|| limiter((site_rate / ORIGIN_LESS_SHARE).max(1)))
                .flatten(),
            shares: (site_rate > 0).then(|| Arc::new(ClientShares::default())),
            site_rate,
            in_flight: Arc::new(Semaphore::new(max_in_flight.max(1))),
            max_in_flight: max_in_flight.max(1),
        }
    }

    /// A place among the requests in flight, or `None` when all are taken.
    pub fn enter(&self) -> Option<OwnedSemaphorePermit> {
        self.in_flight.clone().try_acquire_owned().ok()
    }

    /// Whether fewer than a [`RESERVED_SHARE`]th of the places in flight are free: the
    /// collector is near its bound, and sites over their budget are shed before the places left
    /// go ([`crate::sampling`], contract v4 §2).
    pub fn strained(&self) -> bool {
        self.in_flight.available_permits() * RESERVED_SHARE < self.max_in_flight
    }

    /// Whether the per-client rate is on (`COLLECTOR_CLIENT_RATE` above 0): only then is the
    /// client address worth working out.
    pub fn client_rate_on(&self) -> bool {
        self.clients.is_some()
    }

    /// Counts one request of `client` for `site`; `Err(wait)` when it is over its rate. An IPv6
    /// client counts by its /64 ([`crate::client_ip::prefixes`]): one subscriber's 2^64
    /// addresses are one client.
    pub fn check_client(&self, site: &str, client: IpAddr) -> Result<(), Duration> {
        let Some(limiter) = &self.clients else {
            return Ok(());
        };
        limiter
            .check_key(&(site.to_owned(), crate::client_ip::prefixes(client)[0].1))
            .map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }

    /// Counts `n` measurements of `client` for `site` against the client's share of the site's
    /// budget ([`shares`]); `Err(wait)` when the site is over its budget and the client beyond
    /// its share. Always `Ok` with the per-site rate off.
    pub fn check_share(&self, site: &str, client: IpAddr, n: u32) -> Result<(), Duration> {
        match &self.shares {
            Some(shares) if !shares.admit(site, client, n, self.site_rate) => Err(shares::WINDOW),
            _ => Ok(()),
        }
    }

    /// Counts `n` measurements of `site` against its budget, or, for a request without
    /// `Origin` (`with_origin` false), against that budget's tenth; `Err(wait)` when it is
    /// over. A request of more than the burst counts as the whole burst.
    pub fn check_site(&self, site: &str, n: u32, with_origin: bool) -> Result<(), Duration> {
        let limiter = if with_origin {
            &self.sites
        } else {
            &self.origin_less
        };
        let Some(limiter) = limiter else {
            return Ok(());
        };
        let Some(n) = NonZeroU32::new(n) else {
            return Ok(());
        };
        // The limiter is keyed by an owned string (governor's keyed state map).
        let key = site.to_owned();
        // A request of more measurements than the burst (a batch of 100 against the origin-less
        // tenth of a small budget) could never pass: it takes the whole burst instead.
        let outcome = match limiter.check_key_n(&key, n) {
            Err(governor::InsufficientCapacity(burst)) => {
                let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
                limiter.check_key_n(&key, burst)
            }
            checked => checked,
        };
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(not_until.wait_time_from(DefaultClock::default().now())),
            Err(_) => Err(Duration::from_secs(1)),
        }
    }

    /// Prunes idle limiter state every [`PRUNE_INTERVAL`] until `shutdown` turns true.
    pub async fn run_pruner(self, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(PRUNE_INTERVAL);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Some(l) = &self.clients {
                        l.retain_recent();
                        l.shrink_to_fit();
                    }
                    for l in [&self.sites, &self.origin_less].into_iter().flatten() {
                        l.retain_recent();
                        l.shrink_to_fit();
                    }
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_rate_allows_a_burst_then_limits_per_site_and_client() {
        let limits = Limits::new(5, 0, 10);
        assert!(limits.client_rate_on());
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let allowed = (0..100)
            .filter(|_| limits.check_client("a", ip).is_ok())
            .count();
        assert_eq!(allowed, 10, "burst of twice the rate");
        let wait = limits.check_client("a", ip).unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(200),
            "{wait:?}"
        );
        assert!(
            limits
                .check_client("a", "192.0.2.2".parse().unwrap())
                .is_ok(),
            "per client"
        );
        assert!(limits.check_client("b", ip).is_ok(), "per site");
    }

    /// Requests without `Origin` have a tenth of the site's budget, of their own: a flood of
    /// them leaves the site's visitors their whole budget.
    #[test]
    fn requests_without_origin_draw_on_a_tenth_of_their_own() {
        let limits = Limits::new(0, 100, 10);
        // Their burst: twice a tenth of the rate.
        assert!(limits.check_site("s", 20, false).is_ok());
        assert!(limits.check_site("s", 1, false).is_err());
        assert!(
            limits.check_site("s", 200, true).is_ok(),
            "the site's visitors keep their whole burst"
        );
        let slow = Limits::new(0, 5, 10);
        assert!(
            slow.check_site("s", 2, false).is_ok(),
            "at least 1 a second"
        );
        let off = Limits::new(0, 0, 10);
        assert!((0..1000).all(|_| off.check_site("s", 50, false).is_ok()));
    }

    /// A batch larger than the burst takes the whole burst instead of never passing.
    #[test]
    fn a_batch_over_the_burst_takes_the_whole_burst() {
        let limits = Limits::new(0, 50, 10);
        assert!(limits.check_site("s", 100, false).is_ok(), "burst 10 < 100");
        assert!(
            limits.check_site("s", 1, false).is_err(),
            "the burst is spent"
        );
        assert!(limits.check_site("s", 100, true).is_ok(), "burst 100 = 100");
    }

    #[test]
    fn client_rate_zero_is_off() {
        let limits = Limits::new(0, 10, 10);
        assert!(!limits.client_rate_on());
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        assert!((0..1000).all(|_| limits.check_client("a", ip).is_ok()));
    }

    #[test]
    fn site_rate_counts_measurements() {
        let limits = Limits::new(0, 10, 10);
        let site = "s".to_string();
        assert!(limits.check_site(&site, 15, true).is_ok());
        assert!(limits.check_site(&site, 10, true).is_err());
        assert!(
            limits.check_site(&site, 50, true).is_err(),
            "more than a burst at once"
        );
        assert!(
            limits
                .check_client("s", "192.0.2.1".parse().unwrap())
                .is_ok(),
            "client rate off"
        );
    }

    #[test]
    fn in_flight_is_bounded() {
        let limits = Limits::new(0, 0, 2);
        let a = limits.enter().unwrap();
        let _b = limits.enter().unwrap();
        assert!(limits.enter().is_none());
        drop(a);
        assert!(limits.enter().is_some());
    }
}

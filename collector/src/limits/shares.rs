//! A site's budget is shared among its clients (contract v5 §2, "A site's budget is shared
//! among its clients"): while a site is over its budget, a client's measurements beyond its
//! share (the budget divided among the site's clients seen in the last second) are refused
//! first, before the site's own limiter is asked, so that one client, or a handful, sending far
//! more than a visitor does cannot take the budget from the site's visitors.
//!
//! **Who is a client.** An IPv4 address or an IPv6 /64 ([`crate::client_ip::prefixes`]), as
//! the trusted proxies name it.
//!
//! **When a site is over its budget.** When the measurements it was sent (with `Origin`,
//! refused ones too) in the current second, or in the one before, exceed its budget. Within the
//! budget nothing is refused here: a shop behind one corporate address that stays within its
//! budget loses nothing.
//!
//! **A client's share.** `budget / clients` measurements a second, at least [`MIN_SHARE`]
//! (a visitor's page views are never refused here; the site's limiter still decides), where
//! `clients` is the number of distinct clients that sent the site a measurement in the current
//! second or in the one before, the larger. What a client sent this second, refused
//! measurements included, counts against its share: a flood stays refused while it floods.
//!
//! **Memory.** Each client's count lives in a count-min sketch of [`CELLS`] cells in two rows,
//! keyed by a per-process random hash of site and client, cleared every second: bounded memory
//! (512 KiB), no address kept. A collision can only make a client look busier (refused sooner)
//! or, for the distinct-client count, make two clients count as one (a smaller count, so a
//! larger share): never a new client out of nothing. The per-site counts are kept for the sites
//! seen in the last two seconds (each a known, enabled site).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a count lasts: a second (the budget is per second).
pub const WINDOW: Duration = Duration::from_secs(1);
/// Cells per row of the per-client count (two rows of `u32`): 512 KiB in all.
pub const CELLS: usize = 1 << 16;
/// The least share of a client: 2 measurements a second, the page views a person makes at
/// most (contract v5 §2; [`crate::sampling::CLIENT_DEMAND_MAX`]). Two beacons of a visitor
/// a second apart may arrive within one of this module's seconds.
pub const MIN_SHARE: f64 = 2.0;

/// Each site's clients' shares of its budget. One lock, held for two hash lookups.
#[derive(Debug)]
pub struct ClientShares {
    inner: Mutex<Counts>,
}

#[derive(Debug)]
struct Counts {
    /// When the current second began.
    since: Instant,
    /// Measurements sent this second per site and client (count-min, two rows).
    rows: [Vec<u32>; 2],
    sites: HashMap<String, SiteLoad>,
    keys: std::hash::RandomState,
}

/// One site's load: measurements sent and distinct clients, this second and the one before.
#[derive(Debug, Default, Clone, Copy)]
struct SiteLoad {
    sent: u64,
    sent_before: u64,
    clients: u32,
    clients_before: u32,
}

impl Default for ClientShares {
    fn default() -> Self {
        ClientShares {
            inner: Mutex::new(Counts {
                since: Instant::now(),
                rows: [vec![0; CELLS], vec![0; CELLS]],
                sites: HashMap::new(),
                keys: std::hash::RandomState::new(),
            }),
        }
    }
}

impl ClientShares {
    /// Counts `n` measurements of `client` for `site`, whose budget is `budget` measurements a
    /// second; `false` when the site is over its budget and the client beyond its share
    /// (then answered 429). Never `false` while the site is within its budget.
    pub fn admit(&self, site: &str, client: IpAddr, n: u32, budget: u32) -> bool {
        self.admit_at(Instant::now(), site, client, n, budget)
    }

    /// [`ClientShares::admit`] at `now`.
    pub fn admit_at(&self, now: Instant, site: &str, client: IpAddr, n: u32, budget: u32) -> bool {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let c = &mut *guard;
        c.roll(now);
        let subscriber = crate::client_ip::prefixes(client)[0].1;
        let hash = c.keys.hash_one((site, subscriber));
        let cells = [(hash as usize) % CELLS, ((hash >> 32) as usize) % CELLS];
        let before = c.rows[0][cells[0]].min(c.rows[1][cells[1]]);
        for (row, &cell) in c.rows.iter_mut().zip(&cells) {
            row[cell] = row[cell].saturating_add(n);
        }
        // The site's key is copied only the first time in two seconds it is seen.
        if !c.sites.contains_key(site) {
            c.sites.insert(site.to_owned(), SiteLoad::default());
        }
        let Some(load) = c.sites.get_mut(site) else {
            return true;
        };
        load.sent += u64::from(n);
        if before == 0 {
            load.clients += 1;
        }
        let over_budget = load.sent.max(load.sent_before) > u64::from(budget);
        if !over_budget {
            return true;
        }
        let clients = load.clients.max(load.clients_before).max(1);
        let share = (f64::from(budget) / f64::from(clients)).max(MIN_SHARE);
        f64::from(before) + f64::from(n) <= share
    }

    /// How many sites are counted now (for the bound's test).
    pub fn sites(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sites
            .len()
    }
}

impl Counts {
    /// Starts a new second when the current one is over: this second's site counts become
    /// the ones before (or nothing, after a quiet second), sites quiet for both are dropped,
    /// and the clients' counts are cleared.
    fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed < WINDOW {
            return;
        }
        let adjacent = elapsed < WINDOW * 2;
        self.sites.retain(|_, load| {
            let (sent, clients) = if adjacent {
                (load.sent, load.clients)
            } else {
                (0, 0)
            };
            *load = SiteLoad {
                sent: 0,
                sent_before: sent,
                clients: 0,
                clients_before: clients,
            };
            sent > 0
        });
        for row in &mut self.rows {
            row.fill(0);
        }
        // Seconds are counted from a whole number of windows after the first, so that a
        // steady sender's requests fall into seconds of the same length.
        let windows = (elapsed.as_nanos() / WINDOW.as_nanos()) as u32;
        self.since += WINDOW * windows;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Within its budget, a site refuses nobody here, however one client sends.
    #[test]
    fn within_the_budget_nothing_is_refused() {
        let shares = ClientShares::default();
        let t = Instant::now();
        assert!((0..40).all(|_| shares.admit_at(t, "s", ip("192.0.2.1"), 1, 40)));
    }

    /// The attack: one client sends batches of 50 at a site with a budget of 40 while
    /// 20 visitors send one each. The flood is refused, every visitor's beacon passes, and a
    /// second later (the flood still on) too.
    #[test]
    fn a_flooding_client_is_refused_and_the_visitors_are_not() {
        let shares = ClientShares::default();
        let t = Instant::now();
        for second in 0..3u32 {
            let now = t + WINDOW * second + Duration::from_millis(10);
            let mut visitors = 0;
            for i in 0..20 {
                assert!(!shares.admit_at(now, "s", ip("198.51.100.9"), 50, 40));
                if shares.admit_at(now, "s", ip(&format!("192.0.2.{i}")), 1, 40) {
                    visitors += 1;
                }
            }
            assert_eq!(visitors, 20, "second {second}");
        }
    }

    /// Another site's flood decides nothing for this one.
    #[test]
    fn one_sites_flood_does_not_touch_another_sites_clients() {
        let shares = ClientShares::default();
        let t = Instant::now();
        for _ in 0..100 {
            shares.admit_at(t, "loud", ip("192.0.2.1"), 50, 40);
        }
        assert!(shares.admit_at(t, "quiet", ip("192.0.2.1"), 20, 40));
    }

    /// An IPv6 /64 is one client: its addresses share one share.
    #[test]
    fn an_ipv6_subscriber_is_one_client() {
        let shares = ClientShares::default();
        let t = Instant::now();
        // Over the budget of 10 with two clients: a share of 5 each.
        assert!(shares.admit_at(t, "s", ip("192.0.2.1"), 8, 10));
        let admitted = (1..=20)
            .filter(|i| shares.admit_at(t, "s", ip(&format!("2001:db8:1:2::{i:x}")), 1, 10))
            .count();
        assert_eq!(admitted, 5, "the /64's share of 10 among 2 clients");
    }

    /// The counts are of the last two seconds: a site quiet for two is forgotten, and its
    /// clients' counts with it.
    #[test]
    fn quiet_sites_are_forgotten() {
        let shares = ClientShares::default();
        let t = Instant::now();
        // Over its budget with its one client's 30: refused, but counted.
        assert!(!shares.admit_at(t, "s", ip("192.0.2.1"), 30, 10));
        assert_eq!(shares.sites(), 1);
        assert!(shares.admit_at(t + WINDOW, "other", ip("192.0.2.1"), 1, 10));
        assert_eq!(shares.sites(), 2, "s is the second before");
        assert!(shares.admit_at(t + WINDOW * 3, "other", ip("192.0.2.1"), 1, 10));
        assert_eq!(shares.sites(), 1, "s forgotten");
        assert!(
            shares.admit_at(t + WINDOW * 3, "s", ip("192.0.2.1"), 10, 10),
            "s within its budget again"
        );
    }
}

//! The in-memory dedup window, keyed by measurement `id`.
//!
//! A retry of an acknowledged measurement is answered as a duplicate without touching the
//! spool. Correctness does not depend on this window (ClickHouse's ReplacingMergeTree folds
//! whatever it misses, e.g. after a restart or past [`crate::config::DEFAULT_DEDUP_WINDOW`]);
//! it saves spool space and ClickHouse work, and answers the client truthfully.
//!
//! An id is *claimed* before its request is spooled and *committed* once the spool has made it
//! durable. A second request for a claimed id waits (bounded) for that outcome: committed means
//! duplicate; a failed or abandoned claim means the second request stores it itself. So a
//! duplicate answer is only given for an id that is durable, which keeps "202 means durable".
//!
//! # Shape
//!
//! The window is on the hot path of every beacon, so it is a plain structure of our own rather
//! than a general cache (a moka cache here cost 15 % of the collector's CPU in the benchmark,
//! `docs/benchmarks.md`): [`SHARDS`] mutex-protected shards, each holding two generations of
//! a hash map. New ids go into the current generation; when it is `window` old or holds its
//! share of the capacity, it becomes the previous generation and the old previous one is
//! dropped whole. So an id is remembered for at least `window` unless the capacity is reached
//! first, at most twice that, and never more than `capacity` ids are held.

use std::collections::hash_map::Entry;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use uuid::Uuid;

/// Independent shards, so that concurrent requests rarely wait on one another.
pub const SHARDS: usize = 16;

const PENDING: u8 = 0;
const COMMITTED: u8 = 1;
const FAILED: u8 = 2;

#[derive(Debug)]
struct Slot {
    state: AtomicU8,
    done: Notify,
}

impl Slot {
    /// A slot claimed now, not yet committed.
    fn pending() -> Arc<Slot> {
        Arc::new(Slot {
            state: AtomicU8::new(PENDING),
            done: Notify::new(),
        })
    }
}

/// What a held slot answers a second claim of its id: a duplicate once committed, a wait
/// while pending; `None` when it was released (a failed claim), so the id is claimed anew.
fn verdict(held: &Arc<Slot>) -> Option<Claim> {
    match held.state.load(Ordering::Acquire) {
        COMMITTED => Some(Claim::Duplicate),
        PENDING => Some(Claim::InFlight(InFlight(held.clone()))),
        _ => None,
    }
}

type Map = HashMap<Uuid, Arc<Slot>, RandomState>;

struct Shard {
    current: Map,
    previous: Map,
    since: Instant,
}

struct Window {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    per_generation: usize,
    window: Duration,
}

/// The dedup window: at most `capacity` ids, each remembered for at least `window` (unless the
/// capacity is reached first) and at most twice that. Cheap to clone.
#[derive(Clone)]
pub struct Dedup {
    inner: Arc<Window>,
}

/// The outcome of [`Dedup::claim`].
pub enum Claim {
    /// First sighting: the caller stores it and then calls [`ClaimGuard::commit`].
    New(ClaimGuard),
    /// The id is durable already: answer as a duplicate.
    Duplicate,
    /// Another request holds the claim; [`InFlight::wait`] for its outcome.
    InFlight(InFlight),
}

/// Ownership of a claimed id. Dropping it uncommitted releases the id for another request.
pub struct ClaimGuard {
    id: Uuid,
    slot: Arc<Slot>,
    window: Arc<Window>,
    committed: bool,
}

/// A claim held by another request.
pub struct InFlight(Arc<Slot>);

impl Window {
    fn shard(&self, id: &Uuid) -> &Mutex<Shard> {
        &self.shards[(self.hasher.hash_one(id) as usize) % self.shards.len()]
    }
}

impl Dedup {
    /// A window of at most `capacity` ids, each remembered for `window` (see the module doc).
    pub fn new(capacity: u64, window: Duration) -> Self {
        let hasher = RandomState::new();
        let per_generation = ((capacity as usize) / (2 * SHARDS)).max(1);
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    current: Map::with_hasher(hasher.clone()),
                    previous: Map::with_hasher(hasher.clone()),
                    since: Instant::now(),
                })
            })
            .collect();
        Dedup {
            inner: Arc::new(Window {
                shards,
                hasher,
                per_generation,
                window,
            }),
        }
    }

    /// Claims `id`, atomically with respect to every other caller.
    pub fn claim(&self, id: Uuid) -> Claim {
        let window = &self.inner;
        let mut guard = window.shard(&id).lock().unwrap_or_else(|e| e.into_inner());
        let shard = &mut *guard;
        if shard.current.len() >= window.per_generation || shard.since.elapsed() >= window.window {
            // The dropped generation's room becomes the new one's, so that a busy window
            // does not grow its maps again each generation (issue 53); it is at most
            // `per_generation` ids, the bound either way.
            std::mem::swap(&mut shard.current, &mut shard.previous);
            shard.current.clear();
            shard.since = Instant::now();
        }
        // One probe of each generation for a new id (issue 53: the maps are large, and each
        // probe is a likely cache miss): the current one's entry is kept for the insert.
        let vacant = match shard.current.entry(id) {
            Entry::Occupied(mut held) => {
                return match verdict(held.get()) {
                    Some(claim) => claim,
                    None => {
                        // Released by a failed claim that is being cleaned up.
                        shard.previous.remove(&id);
                        let slot = Slot::pending();
                        held.insert(slot.clone());
                        self.new_claim(id, slot)
                    }
                };
            }
            Entry::Vacant(vacant) => vacant,
        };
        if let Some(held) = shard.previous.get(&id) {
            if let Some(claim) = verdict(held) {
                return claim;
            }
            shard.previous.remove(&id);
        }
        let slot = Slot::pending();
        vacant.insert(slot.clone());
        self.new_claim(id, slot)
    }

    /// A new claim of `id` on its fresh `slot`.
    fn new_claim(&self, id: Uuid, slot: Arc<Slot>) -> Claim {
        Claim::New(ClaimGuard {
            id,
            slot,
            window: self.inner.clone(),
            committed: false,
        })
    }

    /// Number of ids currently remembered.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                s.current.len() + s.previous.len()
            })
            .sum()
    }

    /// Whether the window holds no id.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ClaimGuard {
    /// Marks the id durable: later claims are duplicates.
    pub fn commit(mut self) {
        self.committed = true;
        self.slot.state.store(COMMITTED, Ordering::Release);
        self.slot.done.notify_waiters();
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        // Not durable: release the id so that a retry is stored, and wake waiters.
        {
            let mut guard = self
                .window
                .shard(&self.id)
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let shard = &mut *guard;
            for map in [&mut shard.current, &mut shard.previous] {
                if map
                    .get(&self.id)
                    .is_some_and(|s| Arc::ptr_eq(s, &self.slot))
                {
                    map.remove(&self.id);
                }
            }
        }
        self.slot.state.store(FAILED, Ordering::Release);
        self.slot.done.notify_waiters();
    }
}

impl InFlight {
    /// Waits up to `limit` for the holder's outcome. `true`: the id became durable (answer
    /// duplicate). `false`: it failed, was abandoned, or is still pending after `limit`; the
    /// caller then stores the measurement itself (storage folds any double).
    pub async fn wait(self, limit: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.0.done.notified();
                match self.0.state.load(Ordering::Acquire) {
                    COMMITTED => return true,
                    FAILED => return false,
                    _ => notified.await,
                }
            }
        };
        tokio::time::timeout(limit, wait).await.unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn second_claim_after_commit_is_duplicate() {
        let d = Dedup::new(100, Duration::from_secs(60));
        let Claim::New(g) = d.claim(id(1)) else {
            panic!("first claim must be new")
        };
        g.commit();
        assert!(matches!(d.claim(id(1)), Claim::Duplicate));
        assert!(matches!(d.claim(id(2)), Claim::New(_)));
    }

    #[test]
    fn dropped_claim_releases_the_id() {
        let d = Dedup::new(100, Duration::from_secs(60));
        let Claim::New(g) = d.claim(id(1)) else {
            panic!()
        };
        drop(g);
        assert!(matches!(d.claim(id(1)), Claim::New(_)));
    }

    #[tokio::test]
    async fn waiter_sees_commit() {
        let d = Dedup::new(100, Duration::from_secs(60));
        let Claim::New(g) = d.claim(id(1)) else {
            panic!()
        };
        let Claim::InFlight(w) = d.claim(id(1)) else {
            panic!("second claim must wait")
        };
        let waiter = tokio::spawn(w.wait(Duration::from_secs(5)));
        tokio::task::yield_now().await;
        g.commit();
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn waiter_sees_failure_and_timeout() {
        let d = Dedup::new(100, Duration::from_secs(60));
        let Claim::New(g) = d.claim(id(1)) else {
            panic!()
        };
        let Claim::InFlight(w) = d.claim(id(1)) else {
            panic!()
        };
        let waiter = tokio::spawn(w.wait(Duration::from_secs(5)));
        tokio::task::yield_now().await;
        drop(g);
        assert!(!waiter.await.unwrap());

        let Claim::New(_held) = d.claim(id(2)) else {
            panic!()
        };
        let Claim::InFlight(w) = d.claim(id(2)) else {
            panic!()
        };
        assert!(!w.wait(Duration::from_millis(20)).await);
    }

    #[test]
    fn window_is_bounded_and_keeps_recent_ids() {
        let d = Dedup::new(3_200, Duration::from_secs(60));
        for n in 0..100_000 {
            if let Claim::New(g) = d.claim(id(n)) {
                g.commit();
            }
        }
        assert!(d.len() <= 3_200, "{}", d.len());
        // The most recent ids are still known.
        assert!((99_900..100_000).all(|n| matches!(d.claim(id(n)), Claim::Duplicate)));
    }

    #[test]
    fn ids_expire_after_the_window() {
        let d = Dedup::new(1_000, Duration::from_millis(20));
        let Claim::New(g) = d.claim(id(1)) else {
            panic!()
        };
        g.commit();
        std::thread::sleep(Duration::from_millis(25));
        // The first claim after the window rotates the generation: still known (at most 2x)...
        assert!(matches!(d.claim(id(1)), Claim::Duplicate));
        std::thread::sleep(Duration::from_millis(25));
        let _ = d.claim(id(2));
        // ...and forgotten after the next rotation.
        assert!(matches!(d.claim(id(1)), Claim::New(_)));
    }
}

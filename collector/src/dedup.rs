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

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use uuid::Uuid;

const PENDING: u8 = 0;
const COMMITTED: u8 = 1;
const FAILED: u8 = 2;

#[derive(Debug)]
struct Slot {
    state: AtomicU8,
    done: Notify,
}

/// The dedup window: at most `capacity` ids, each kept for `window` after its claim.
#[derive(Clone)]
pub struct Dedup {
    cache: moka::sync::Cache<Uuid, Arc<Slot>>,
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
    cache: moka::sync::Cache<Uuid, Arc<Slot>>,
    committed: bool,
}

/// A claim held by another request.
pub struct InFlight(Arc<Slot>);

impl Dedup {
    /// A window of at most `capacity` ids, each remembered for `window`.
    pub fn new(capacity: u64, window: Duration) -> Self {
        Dedup {
            cache: moka::sync::Cache::builder()
                .max_capacity(capacity)
                // Plain LRU: TinyLFU's admission would refuse to remember new ids.
                .eviction_policy(moka::policy::EvictionPolicy::lru())
                .time_to_live(window)
                .build(),
        }
    }

    /// Claims `id`, atomically with respect to every other caller.
    pub fn claim(&self, id: Uuid) -> Claim {
        let entry = self
            .cache
            .entry(id)
            .or_insert_with(|| Arc::new(Slot::default()));
        let slot = entry.into_value();
        if self.is_new(&slot) {
            return Claim::New(ClaimGuard {
                id,
                slot,
                cache: self.cache.clone(),
                committed: false,
            });
        }
        match slot.state.load(Ordering::Acquire) {
            COMMITTED => Claim::Duplicate,
            _ => Claim::InFlight(InFlight(slot)),
        }
    }

    /// A slot is ours when we are the one who flips it from [`FREE`] to pending.
    fn is_new(&self, slot: &Arc<Slot>) -> bool {
        slot.state
            .compare_exchange(FREE, PENDING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Number of ids currently remembered (approximate, for metrics).
    pub fn len(&self) -> u64 {
        self.cache.entry_count()
    }

    /// Whether the window holds no id (approximate).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A fresh slot: not yet owned by any request.
const FREE: u8 = 3;

impl Default for Slot {
    fn default() -> Self {
        Slot {
            state: AtomicU8::new(FREE),
            done: Notify::new(),
        }
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
        if !self.committed {
            // Not durable: release the id so that a retry is stored, and wake waiters.
            self.cache.invalidate(&self.id);
            self.slot.state.store(FAILED, Ordering::Release);
            self.slot.done.notify_waiters();
        }
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
    fn window_is_bounded() {
        let d = Dedup::new(10, Duration::from_secs(60));
        for n in 0..1000 {
            if let Claim::New(g) = d.claim(id(n)) {
                g.commit();
            }
        }
        d.cache.run_pending_tasks();
        assert!(d.len() <= 10, "{}", d.len());
    }
}

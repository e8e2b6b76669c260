//! The circuit breaker in front of the settings store: after a failed query or connection it
//! opens, and the store is not contacted again for `COLLECTOR_SETTINGS_BACKOFF` by any path
//! of this process, however many requests arrive; then exactly one call is let through as a
//! trial, and only its success closes the breaker again. The connector
//! ([`super::postgres`]) opens it before a failed attempt's call returns, so calls that were
//! admitted together make one connection attempt between them, not one each.

use std::sync::Mutex;
use std::time::Duration;

// The runtime's clock, so that tests can pause and advance it.
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BreakerState {
    /// Calls go through.
    Closed,
    /// Nothing goes through until `until`.
    Open { until: Instant },
    /// One trial is in flight; nothing else goes through.
    HalfOpen,
}

/// The circuit breaker in front of the store: *closed* lets calls through; a failure opens it
/// for the backoff; then one trial (half-open) decides.
#[derive(Debug)]
pub struct Breaker {
    state: Mutex<BreakerState>,
    backoff: Duration,
}

/// Permission for one call; `trial` when it is the single call after a backoff.
#[derive(Debug, Clone, Copy)]
pub struct Admission {
    trial: bool,
}

impl Breaker {
    /// A closed breaker that opens for `backoff` after each failure.
    pub fn new(backoff: Duration) -> Self {
        Breaker {
            state: Mutex::new(BreakerState::Closed),
            backoff,
        }
    }

    /// Lets a call through, or not.
    pub fn admit(&self) -> Option<Admission> {
        let mut state = self.state.lock().unwrap();
        match *state {
            BreakerState::Closed => Some(Admission { trial: false }),
            BreakerState::Open { until } if Instant::now() >= until => {
                *state = BreakerState::HalfOpen;
                Some(Admission { trial: true })
            }
            BreakerState::Open { .. } | BreakerState::HalfOpen => None,
        }
    }

    /// Records the outcome of an admitted call.
    pub fn report(&self, admission: Admission, ok: bool) {
        let mut state = self.state.lock().unwrap();
        *state = match (ok, *state) {
            (true, BreakerState::HalfOpen) if admission.trial => BreakerState::Closed,
            (true, s) => s,
            (false, s) => self.opened(s),
        };
    }

    /// Opens the breaker after a failed connection attempt, before the call that made it
    /// reports: a call admitted while closed and still waiting for a connection then makes
    /// no attempt of its own.
    pub(super) fn trip(&self) {
        let mut state = self.state.lock().unwrap();
        *state = self.opened(*state);
    }

    /// The state after a failure: open for the backoff; an already open breaker keeps its
    /// end (a late failure does not extend the backoff).
    fn opened(&self, state: BreakerState) -> BreakerState {
        match state {
            BreakerState::Open { until } => BreakerState::Open { until },
            _ => BreakerState::Open {
                until: Instant::now() + self.backoff,
            },
        }
    }

    /// Whether a new connection may be attempted now: not while the breaker is open.
    pub(super) fn lets_connect(&self) -> bool {
        !matches!(*self.state.lock().unwrap(), BreakerState::Open { .. })
    }

    /// Whether calls currently go through.
    pub fn is_closed(&self) -> bool {
        matches!(*self.state.lock().unwrap(), BreakerState::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_trial_call_after_the_backoff() {
        let breaker = Breaker::new(Duration::from_millis(50));
        let a = breaker.admit().unwrap();
        let b = breaker.admit().unwrap();
        breaker.report(a, false);
        breaker.report(b, false);
        assert!(breaker.admit().is_none(), "open for the backoff");
        std::thread::sleep(Duration::from_millis(60));
        let trial = breaker.admit().expect("one trial after the backoff");
        assert!(breaker.admit().is_none(), "only one trial at a time");
        breaker.report(trial, false);
        assert!(breaker.admit().is_none(), "a failed trial opens it again");
        std::thread::sleep(Duration::from_millis(60));
        let trial = breaker.admit().unwrap();
        breaker.report(trial, true);
        assert!(breaker.is_closed());
        assert!(breaker.admit().is_some() && breaker.admit().is_some());
    }

    #[test]
    fn a_late_failure_does_not_extend_the_backoff() {
        let breaker = Breaker::new(Duration::from_secs(60));
        let (a, b) = (breaker.admit().unwrap(), breaker.admit().unwrap());
        breaker.report(a, false);
        let first = *breaker.state.lock().unwrap();
        breaker.report(b, false);
        assert_eq!(*breaker.state.lock().unwrap(), first);
    }
}

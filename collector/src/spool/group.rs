//! The open group: where requests leave their frames for the next group commit, and how their
//! answers come back, without a thread hand-over per request (see the module doc of
//! [`super`], "Group commit").
//!
//! A request encodes its frame into the open group's buffer under one short lock and waits on
//! the group's [`Group`]: one completion per group, set once by the committer, which wakes
//! one waiter only; that waiter, on a runtime thread, wakes the rest (see [`Group::finish`]).
//! The committer thread is woken only when it sleeps for lack of work, by the first request
//! of a group; under load it finds the next group already filled when its sync returns. No
//! request has a timer of its own: the [`watchdog`] ends a group that outlives its deadline.

use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::format::{frame_header, Record, FRAME_HEADER_LEN};
use super::{AppendError, APPEND_QUEUE, GROUP_MAX_BYTES};

/// How often the watchdog looks for a group past its deadline: the precision of
/// [`AppendError::SyncTimeout`].
pub(super) const WATCHDOG_TICK: Duration = Duration::from_millis(100);

/// Whether an open group of `requests` and `bytes` has fewer than a `share`th of its room
/// left ([`APPEND_QUEUE`], [`GROUP_MAX_BYTES`]); `share` is at least 1.
pub(super) fn strained(requests: usize, bytes: usize, share: usize) -> bool {
    let kept = share.saturating_sub(1);
    requests * share > APPEND_QUEUE * kept || bytes * share > GROUP_MAX_BYTES * kept
}

/// One group commit's outcome, shared by the requests in it.
#[derive(Default)]
pub(super) struct Group {
    outcome: OnceLock<Result<(), AppendError>>,
    done: Notify,
}

impl Group {
    /// Sets the outcome (the first call wins: a group the watchdog timed out stays timed out
    /// for its requests even if its sync returns later) and wakes one waiter, the group's
    /// leader, which wakes the others in [`Group::wait`].
    ///
    /// Why one: the committer and the watchdog are not runtime threads, so each task they wake
    /// goes through the runtime's shared queue, and the committer, 10 nice levels below the
    /// request threads, can be preempted by the tasks it has just woken while it still holds
    /// the `Notify`'s lock (issue 53's profile: waking the group was 7.4 % of the collector's
    /// samples; docs/benchmarks.md has the figures after). Woken on a runtime thread, the
    /// others go to that thread's own queue. A leader whose task is dropped before it runs
    /// passes its wake-up on to the next waiter (tokio's `Notified` does so on drop).
    pub(super) fn finish(&self, outcome: Result<(), AppendError>) {
        if self.outcome.set(outcome).is_ok() {
            self.done.notify_one();
        }
    }

    /// Wakes whoever still waits on a finished group: nobody, when every request's append was
    /// polled to its end (one lock, no work). A backstop against a leader whose future is kept
    /// but never polled again, which would hold the others (the committer calls it for the
    /// group before, at each commit).
    pub(super) fn wake_stragglers(&self) {
        self.done.notify_waiters();
    }

    /// Waits for the outcome; the first waiter woken wakes the rest.
    pub(super) async fn wait(&self) -> Result<(), AppendError> {
        let notified = self.done.notified();
        tokio::pin!(notified);
        // Registered before the check, so a `finish` between the two is not missed.
        notified.as_mut().enable();
        if let Some(outcome) = self.outcome.get() {
            return *outcome;
        }
        notified.await;
        // The leader: wakes every other waiter (they all registered before the outcome was
        // set, or they find it set). For the later ones the list is empty: one lock, no work.
        self.done.notify_waiters();
        *self
            .outcome
            .get()
            .expect("set before the waiters are woken")
    }
}

/// The frames waiting for the next group commit, and the committer's state.
pub(super) struct Open {
    /// Frames of the open group, encoded ([`super::format`]), in arrival order.
    pub buf: Vec<u8>,
    /// Requests in the open group.
    pub requests: usize,
    /// Measurements in the open group.
    pub records: u64,
    /// The open group's completion.
    pub group: Arc<Group>,
    /// When the open group's earliest-ending request stops waiting.
    pub deadline: Option<Instant>,
    /// The group being written and synced, with its deadline, for the watchdog.
    pub syncing: Option<(Arc<Group>, Instant)>,
    /// Frame bytes in the open group and in the one being synced: they count against the
    /// spool's bound before they are durable.
    pub pending_bytes: u64,
    /// The committer sleeps for lack of work: the next request wakes it.
    pub committer_idle: bool,
    /// The spool is closing: no more appends; the committer commits what is open and stops.
    pub stopping: bool,
}

/// The open group, its lock and the committer's wake-up.
pub(super) struct Groups {
    pub open: Mutex<Open>,
    /// The committer waits here for a group (or for its retry interval while unwritable).
    pub work: Condvar,
    /// The watchdog waits here for its tick (or for the spool to close).
    pub tick: Condvar,
}

/// A group taken by the committer.
pub(super) struct Taken {
    pub buf: Vec<u8>,
    pub records: u64,
    pub group: Arc<Group>,
}

impl Groups {
    pub(super) fn new() -> Groups {
        Groups {
            open: Mutex::new(Open {
                buf: Vec::with_capacity(1 << 16),
                requests: 0,
                records: 0,
                group: Arc::default(),
                deadline: None,
                syncing: None,
                pending_bytes: 0,
                committer_idle: false,
                stopping: false,
            }),
            work: Condvar::new(),
            tick: Condvar::new(),
        }
    }

    /// Adds one request's record to the open group and returns the group to wait on.
    ///
    /// `held` says what the spool holds unconfirmed (durable, counted in its state); it is read
    /// under this lock, so that a group committed meanwhile is counted once, in `held` or in
    /// `pending_bytes`, never in neither; `max_bytes` is the bound. Errors at once:
    /// [`AppendError::Full`] when the frame would cross the bound, [`AppendError::QueueFull`]
    /// when the open group holds [`APPEND_QUEUE`] requests or [`GROUP_MAX_BYTES`],
    /// [`AppendError::Io`] when the spool is closing.
    pub(super) fn join(
        &self,
        record: &Record,
        limit: Duration,
        held: impl FnOnce() -> u64,
        max_bytes: u64,
    ) -> Result<Arc<Group>, AppendError> {
        // The header (and its checksum over the payload) is computed outside the lock.
        let header = frame_header(record);
        let framed = FRAME_HEADER_LEN + record.payload.len();
        let deadline = Instant::now() + limit;
        let mut open = self.open.lock().unwrap();
        if open.stopping {
            return Err(AppendError::Io);
        }
        if open.requests >= APPEND_QUEUE || open.buf.len() + framed > GROUP_MAX_BYTES {
            return Err(AppendError::QueueFull);
        }
        // The committer adds a group to `held` before it takes it out of `pending_bytes`: a
        // group may be counted twice for a moment (a 503 too early), never not at all.
        if held() + open.pending_bytes + framed as u64 > max_bytes {
            return Err(AppendError::Full);
        }
        open.buf.extend_from_slice(&header);
        open.buf.extend_from_slice(&record.payload);
        open.requests += 1;
        open.records += u64::from(record.rows);
        open.pending_bytes += framed as u64;
        open.deadline = Some(open.deadline.map_or(deadline, |d| d.min(deadline)));
        let group = open.group.clone();
        if open.committer_idle {
            open.committer_idle = false;
            self.work.notify_one();
        }
        Ok(group)
    }

    /// Takes the open group (not empty) for committing, with `spare`, an empty buffer, in its
    /// place. The caller holds the lock.
    pub(super) fn take(open: &mut Open, spare: Vec<u8>) -> Taken {
        open.requests = 0;
        let taken = Taken {
            buf: std::mem::replace(&mut open.buf, spare),
            records: std::mem::take(&mut open.records),
            group: std::mem::take(&mut open.group),
        };
        let deadline = open.deadline.take().unwrap_or_else(Instant::now);
        open.syncing = Some((taken.group.clone(), deadline));
        taken
    }

    /// The committer is done with a group of `bytes` frame bytes (durable and counted in the
    /// spool's state, or refused).
    pub(super) fn done(&self, bytes: u64) {
        let mut open = self.open.lock().unwrap();
        open.pending_bytes -= bytes;
        open.syncing = None;
    }
}

/// The watchdog: every [`WATCHDOG_TICK`], ends the groups past their deadline with
/// [`AppendError::SyncTimeout`] (a sync stuck on a slow or hung disk). Their frames stay in
/// place and may still become durable: a client's retry is then folded as a duplicate.
/// Returns when the spool closes.
pub(super) fn watchdog(groups: &Groups) {
    let mut open = groups.open.lock().unwrap();
    loop {
        if open.stopping {
            return;
        }
        open = groups.tick.wait_timeout(open, WATCHDOG_TICK).unwrap().0;
        let now = Instant::now();
        if let Some((group, deadline)) = &open.syncing {
            if now >= *deadline {
                group.finish(Err(AppendError::SyncTimeout));
            }
        }
        if open.deadline.is_some_and(|d| now >= d) {
            // Those who joined so far get their answer; later ones wait in a new group, in the
            // same buffer.
            open.group.finish(Err(AppendError::SyncTimeout));
            open.group = Arc::default();
            open.deadline = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strained_from_four_fifths_of_either_bound() {
        // 4,096 * 4 / 5 = 3,276.8 requests; 8 MiB * 4 / 5 = 6,710,886.4 bytes.
        assert!(!strained(0, 0, 5));
        assert!(!strained(3_276, 6_710_886, 5));
        assert!(strained(3_277, 0, 5));
        assert!(strained(0, 6_710_887, 5));
        assert!(strained(APPEND_QUEUE, GROUP_MAX_BYTES, 5));
    }

    /// The group's outcome reaches every waiter, though the committer wakes only one: the
    /// others are woken by it (a lost wake-up would leave them waiting: the timeout fails).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_waiter_gets_the_outcome_from_one_wake_up() {
        let group = Arc::new(Group::default());
        let mut waiters: Vec<_> = (0..50).map(|_| Box::pin(group.wait())).collect();
        // Each polled once, so that all 50 are registered before the outcome is set.
        for w in &mut waiters {
            assert!(futures_util::poll!(w.as_mut()).is_pending());
        }
        let finisher = group.clone();
        std::thread::spawn(move || finisher.finish(Err(AppendError::Io)))
            .join()
            .unwrap();
        let outcomes = tokio::time::timeout(
            Duration::from_secs(10),
            futures_util::future::join_all(waiters),
        )
        .await
        .expect("a waiter was never woken");
        assert_eq!(outcomes, vec![Err(AppendError::Io); 50]);
    }

    /// A leader dropped before it ran passes its wake-up on: the others still get the outcome.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_dropped_before_it_ran_passes_the_wake_up_on() {
        let group = Arc::new(Group::default());
        let mut waiters: Vec<_> = (0..5).map(|_| Box::pin(group.wait())).collect();
        for w in &mut waiters {
            assert!(futures_util::poll!(w.as_mut()).is_pending());
        }
        group.finish(Ok(()));
        drop(waiters.remove(0));
        let outcomes = tokio::time::timeout(
            Duration::from_secs(10),
            futures_util::future::join_all(waiters),
        )
        .await
        .expect("the wake-up died with the leader");
        assert_eq!(outcomes, vec![Ok(()); 4]);
    }
}

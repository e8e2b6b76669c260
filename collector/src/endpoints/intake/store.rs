//! Intake's stations from the rows to the spool: fair shedding ([`shed`]), the rates
//! ([`rate`]), the dedup claim ([`claim`]) and the durable append ([`append`]).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use super::site::{client_of, Kept, Placement, Sender, Sited};
use super::{Accepted, DroppedField, APPEND_TIMEOUT, CLAIM_WAIT, RETRY_AFTER, SHED_RETRY_AFTER};
use crate::dedup::{Claim, ClaimGuard};
use crate::error::IntakeError;
use crate::measurement::{self, Measurement};
use crate::spool::AppendError;
use crate::state::AppState;

/// Shed: while the collector is near its bounds (fewer than a fifth of the places in flight
/// free, or less than a fifth of the spool; [`crate::limits::RESERVED_SHARE`]), a request
/// with a measurement of a site over its budget is shed (503, `Retry-After`), so that what
/// room is left goes to the sites within theirs (contract v4 §2): a quiet shop never loses a
/// beacon because a loud one spiked.
pub(super) fn shed(state: &AppState, sited: &Sited<'_>) -> Result<(), IntakeError> {
    let loud = |site: &str| state.sites.sampler.over_budget(site);
    if !sited.kept.iter().any(|k| loud(&k.row.site)) {
        return Ok(());
    }
    // The room that matters is that of the loud sites' shards' spools.
    let short = sited.placement.iter().any(|(key, i)| {
        let spool = state.storage.spools.spool(*i);
        let reserve = spool.max_bytes() / crate::limits::RESERVED_SHARE as u64;
        loud(key) && !spool.has_room(reserve)
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
    for k in &sited.kept {
        *per_site.entry(&*k.row.site).or_default() += 1;
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

/// What the claim leaves to store: the rows, and the claims to commit once they are durable,
/// each with the place of its row.
pub(super) struct Claimed<'a> {
    /// The rows to store, in request order.
    pub(super) rows: Vec<Measurement<'a>>,
    /// The claims taken, each with its row's place in `rows`.
    guards: Vec<(usize, ClaimGuard)>,
}

/// Claim: claims each id in the dedup window; within one request a repeated id is a duplicate
/// of the first. The dropped fields and skewed clocks of the kept measurements go to the
/// report.
pub(super) async fn claim<'a>(
    state: &AppState,
    kept: Vec<Kept<'a>>,
    report: &mut Accepted,
) -> Claimed<'a> {
    let mut guards = Vec::with_capacity(kept.len());
    let mut rows = Vec::with_capacity(kept.len());
    let mut seen = HashSet::with_capacity(kept.len());
    for k in kept {
        report
            .dropped_fields
            .extend(k.dropped.iter().map(|&field| DroppedField {
                index: k.index,
                field: Cow::Borrowed(field),
            }));
        report.clock_skewed += k.clock_skewed as u64;
        if !seen.insert(k.row.id) {
            report.duplicates += 1;
            continue;
        }
        match state.storage.dedup.claim(k.row.id) {
            Claim::New(guard) => {
                guards.push((rows.len(), guard));
                rows.push(k.row);
            }
            Claim::Duplicate => report.duplicates += 1,
            Claim::InFlight(other) => {
                if other.wait(CLAIM_WAIT).await {
                    report.duplicates += 1;
                } else {
                    rows.push(k.row);
                }
            }
        }
    }
    Claimed { rows, guards }
}

/// Append: encodes the rows once (the spool keeps them as the writer sends them), one record
/// per shard of the request's sites ([`Placement`]), writes each to its shard's spool and
/// waits until all are durable (at most [`APPEND_TIMEOUT`]); a refused append is a 503. What
/// became durable is claimed for good, on a refusal too (another shard's part of a request
/// that spans shards): the client's retry then folds it as a duplicate. Returns how many rows
/// were stored.
pub(super) async fn append(
    state: &AppState,
    claimed: Claimed<'_>,
    placement: &Placement,
) -> Result<usize, IntakeError> {
    let Claimed { rows, guards } = claimed;
    let appended = write(state, &rows, placement).await;
    for (i, guard) in guards {
        let shard = shard_of(placement, &rows[i]);
        if appended
            .as_ref()
            .map_or_else(|(_, durable)| durable.contains(&shard), |()| true)
        {
            guard.commit();
        }
    }
    appended.map_err(|(e, _)| e)?;
    Ok(rows.len())
}

/// Encodes `rows` into one record per shard and appends them to the shards' spools; on a
/// refusal, the 503 and the shards whose record is durable all the same.
async fn write(
    state: &AppState,
    rows: &[Measurement<'_>],
    placement: &Placement,
) -> Result<(), (IntakeError, Vec<usize>)> {
    if rows.is_empty() {
        return Ok(());
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
        return Ok(());
    }
    state
        .storage
        .spools
        .append(records, APPEND_TIMEOUT)
        .await
        .map_err(|(e, durable)| (append_refused(e), durable))
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
pub(super) fn append_refused(e: AppendError) -> IntakeError {
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

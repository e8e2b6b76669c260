//! A batch ClickHouse refused as bad data: bisected so that only the refused rows are kept
//! aside (the dead-letter folder) and every other row is stored.
//!
//! ClickHouse refuses an INSERT as a whole (one bad row fails the statement), so the rows at
//! fault are found by halving: each half is sent as its own INSERT with a token derived from
//! the batch's (`<batch token>-<first row>-<end row>`, so a retry after a crash folds), a half
//! that lands is done, a half refused again is halved again, down to single rows, which are
//! kept aside. `k` bad rows among `n` cost about `2 k log2(n / k)` inserts; at most
//! [`bisect_budget`] are spent on one batch (64 plus one for every 32 rows: about 70 bad rows
//! are isolated in a batch of 50,000), and what is still unresolved then (a batch whose every
//! row is refused, e.g. a table that does not match the writer's columns, or more bad rows
//! than the budget isolates) is kept aside in the pieces reached so far, good rows among them:
//! they are in the dead-letter files, not lost, and the log line says how many. Finding row
//! boundaries decodes the rows; this is the failure path only.

use super::{Abandoned, Batch, Failure, InsertBody, Writer};
use std::borrow::Cow;

use crate::measurement::{kept_aside_json, row_bounds, site_of};
use crate::settings::PurgedSites;

/// Most inserts spent bisecting one refused batch of `rows` rows: 64, plus one for every 32
/// rows. Each successful piece is a part in ClickHouse, so the budget also bounds the small
/// parts a refusal makes (1,626 for a batch of 50,000, within what merges absorb; a burst
/// beyond `parts_to_delay_insert` only slows inserts, and a "too many parts" answer is
/// transient and retried). A batch whose every row is refused costs the budget, not one
/// insert per row.
pub fn bisect_budget(rows: usize) -> u32 {
    u32::try_from(64 + rows / 32).unwrap_or(u32::MAX)
}

impl Writer {
    /// Delivers `batch`, which ClickHouse refused with `reason`: stores what it accepts,
    /// keeps aside the rest. Errors only when the drain deadline passes (the batch then stays
    /// in the spool, and is bisected again after the restart; pieces already stored fold by
    /// their tokens).
    pub(super) async fn deliver_refused(
        &mut self,
        batch: &Batch,
        reason: String,
    ) -> Result<(), Abandoned> {
        let token = batch.dedup_token();
        let bounds = match row_bounds(&batch.body) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "writer: cannot split a refused batch into rows; keeping it aside whole");
                return self
                    .keep_rows_aside(batch, 0, 0..batch.body.len(), &reason)
                    .await;
            }
        };
        let n = bounds.len() - 1;
        tracing::warn!(rows = n, %reason, "clickhouse refused a batch as bad data; bisecting it to keep aside only the refused rows");
        // Ranges of rows refused as a whole and not yet resolved, the earliest last.
        let mut refused = vec![(0usize, n, reason)];
        let (mut inserts, budget) = (0u32, bisect_budget(n));
        let (mut stored, mut kept, mut spent) = (0usize, 0usize, false);
        while let Some((lo, hi, reason)) = refused.pop() {
            // A split costs two inserts: only made while both fit in the budget.
            spent |= hi - lo > 1 && inserts + 2 > budget;
            if hi - lo == 1 || inserts + 2 > budget {
                self.keep_rows_aside(batch, lo, bounds[lo]..bounds[hi], &reason)
                    .await?;
                kept += hi - lo;
                continue;
            }
            let mid = lo + (hi - lo) / 2;
            // Right half first onto the stack, so the left half is resolved first.
            let mut halves = Vec::with_capacity(2);
            for (a, b) in [(lo, mid), (mid, hi)] {
                let body = InsertBody {
                    token: format!("{token}-{a}-{b}"),
                    rows: batch.body.slice(bounds[a]..bounds[b]),
                };
                inserts += 1;
                match self.send(&body).await {
                    Ok(()) => stored += b - a,
                    Err(Failure::Refused(why)) => halves.push((a, b, why)),
                    Err(Failure::Abandoned) => return Err(Abandoned),
                }
            }
            refused.extend(halves.into_iter().rev());
        }
        if spent {
            tracing::warn!(rows = n, stored, kept_aside = kept, inserts, budget, "writer: bisect budget spent: the pieces still unresolved were kept aside whole, good rows among them");
        } else {
            tracing::warn!(
                rows = n,
                stored,
                kept_aside = kept,
                inserts,
                "writer: refused batch resolved"
            );
        }
        Ok(())
    }

    /// Keeps rows `first_row..` (their bytes `range` of the batch body) aside, as JSON the
    /// operator can read and insert again once the cause is fixed ([`kept_aside_json`]),
    /// retrying a failed write (a full disk) with backoff until the drain deadline.
    async fn keep_rows_aside(
        &mut self,
        batch: &Batch,
        first_row: usize,
        range: std::ops::Range<usize>,
        reason: &str,
    ) -> Result<(), Abandoned> {
        // A site purged while the batch was bisected: its rows are not kept (contract v5 §5).
        let rows = without_purged(&batch.body[range], &self.purged.borrow());
        if rows.is_empty() {
            return Ok(());
        }
        let (body, rows) = kept_aside_json(&rows, reason);
        let mut attempt = 0;
        loop {
            match self
                .reader
                .write_kept_aside(batch.start, first_row, &body, rows)
            {
                Ok(path) => {
                    tracing::error!(rows, file = %path.display(), %reason, "clickhouse refused rows as bad data; kept aside");
                    self.metrics.spool.kept_aside.inc();
                    return Ok(());
                }
                Err(e) => {
                    crate::logging::warn_limited(
                        "keep_aside",
                        || tracing::error!(error = %crate::logging::chain(&e), "cannot keep refused rows aside; retrying"),
                    );
                    if self.pause(attempt).await.is_err() {
                        return Err(Abandoned);
                    }
                    attempt += 1;
                }
            }
        }
    }
}

/// `rows` (RowBinary) without the rows of the `purged` sites; as they are when none is purged
/// or they do not split into rows.
fn without_purged<'a>(rows: &'a [u8], purged: &PurgedSites) -> Cow<'a, [u8]> {
    if purged.is_empty() {
        return Cow::Borrowed(rows);
    }
    let Ok(bounds) = row_bounds(rows) else {
        return Cow::Borrowed(rows);
    };
    let mut kept = Vec::with_capacity(rows.len());
    for w in bounds.windows(2) {
        let row = &rows[w[0]..w[1]];
        if !site_of(row).is_some_and(|site| purged.contains(site)) {
            kept.extend_from_slice(row);
        }
    }
    Cow::Owned(kept)
}

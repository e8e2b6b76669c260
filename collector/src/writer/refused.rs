//! A batch ClickHouse refused as bad data: bisected so that only the refused rows are kept
//! aside (the dead-letter folder) and every other row is stored.
//!
//! ClickHouse refuses an INSERT as a whole (one bad row fails the statement), so the rows at
//! fault are found by halving: each half is sent as its own INSERT with a token derived from
//! the batch's (`<batch token>-<first row>-<end row>`, so a retry after a crash folds), a half
//! that lands is done, a half refused again is halved again, down to single rows, which are
//! kept aside. `k` bad rows among `n` cost about `2 k log2 n` inserts; at most
//! [`MAX_BISECT_INSERTS`] are spent on one batch, and what is still unresolved then (a batch
//! whose every row is refused, e.g. a table that does not match the writer's columns) is kept
//! aside in the pieces reached so far. Finding row boundaries decodes the rows; this is the
//! failure path only.

use super::{Abandoned, Batch, Failure, InsertBody, Writer};
use crate::measurement::row_bounds;

/// Most inserts spent bisecting one refused batch: enough to isolate about 4 bad rows in the
/// largest batch (about 2 × 4 × 14 for 16,000 rows), few enough that a batch whose every row
/// is refused costs seconds, not one insert per row.
pub const MAX_BISECT_INSERTS: u32 = 64;

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
                    .keep_aside(batch, 0, 0..batch.body.len(), &reason)
                    .await;
            }
        };
        let n = bounds.len() - 1;
        tracing::warn!(rows = n, %reason, "clickhouse refused a batch as bad data; bisecting it to keep aside only the refused rows");
        // Ranges of rows refused as a whole and not yet resolved, the earliest last.
        let mut refused = vec![(0usize, n, reason)];
        let mut inserts = 0u32;
        let (mut stored, mut kept) = (0usize, 0usize);
        while let Some((lo, hi, reason)) = refused.pop() {
            if hi - lo == 1 || inserts >= MAX_BISECT_INSERTS {
                self.keep_aside(batch, lo, bounds[lo]..bounds[hi], &reason)
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
        tracing::warn!(
            rows = n,
            stored,
            kept_aside = kept,
            inserts,
            "writer: refused batch resolved"
        );
        Ok(())
    }

    /// Keeps rows `first_row..` (their bytes `range` of the batch body) aside, retrying a
    /// failed write (a full disk) with backoff until the drain deadline.
    async fn keep_aside(
        &mut self,
        batch: &Batch,
        first_row: usize,
        range: std::ops::Range<usize>,
        reason: &str,
    ) -> Result<(), Abandoned> {
        let mut attempt = 0;
        loop {
            match self
                .reader
                .keep_aside(batch.start, first_row, &batch.body[range.clone()], reason)
            {
                Ok((path, rows)) => {
                    tracing::error!(rows, file = %path.display(), %reason, "clickhouse refused rows as bad data; kept aside");
                    self.metrics.kept_aside.inc();
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

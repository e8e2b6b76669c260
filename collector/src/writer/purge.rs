//! Rows of purged sites (`collector sites purge`) dropped from a batch instead of inserted:
//! the purge deletes what ClickHouse holds of a site, and no collector may write more of it
//! afterwards from what its spool still held.

use bytes::BytesMut;

use super::{Batch, Writer};
use crate::measurement::{row_bounds, site_of};

impl Writer {
    /// Drops the rows of the sites purged as of now from `batch` (and counts them in
    /// `batch.purged`, which changes its token, see [`Batch::dedup_token`]). Finding rows
    /// decodes them: done only while some site is purged. A body that does not split into
    /// rows (a bug) is left whole for the insert to refuse and bisect.
    pub(super) fn drop_purged(&self, batch: &mut Batch) {
        let purged = self.purged.borrow().clone();
        if purged.is_empty() {
            return;
        }
        let Ok(bounds) = row_bounds(&batch.body) else {
            return;
        };
        let mut kept = BytesMut::with_capacity(batch.body.len());
        let mut dropped = 0u64;
        for w in bounds.windows(2) {
            let row = &batch.body[w[0]..w[1]];
            if site_of(row).is_some_and(|site| purged.contains(site)) {
                dropped += 1;
            } else {
                kept.extend_from_slice(row);
            }
        }
        if dropped == 0 {
            return;
        }
        tracing::info!(
            rows = dropped,
            "writer: rows of erased sites dropped instead of inserted"
        );
        self.metrics.spool.purged_rows.inc_by(dropped);
        batch.body = kept.freeze();
        batch.rows -= dropped;
        batch.purged = dropped;
    }
}

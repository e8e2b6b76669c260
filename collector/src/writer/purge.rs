//! Rows of purged sites (`collector sites purge`) dropped from a batch instead of inserted:
//! the purge deletes what ClickHouse holds of a site, and no collector may write more of it
//! afterwards from what its spool still held.

use bytes::BytesMut;

use super::{Batch, Writer};
use crate::clickhouse::insert::InsertBody;
use crate::measurement::{row_bounds, site_of};
use crate::settings::PurgedSites;

impl Writer {
    /// Drops the rows of the sites purged as of now from `batch` (and counts them in
    /// `batch.purged`, which changes its token, see [`Batch::dedup_token`]). Finding rows
    /// decodes them: done only while some site is purged. A body that does not split into
    /// rows (a bug) is left whole for the insert to refuse and bisect.
    pub(super) fn drop_purged(&mut self, batch: &mut Batch) {
        // Marked seen: [`Writer::repurge`] looks only for sites purged after this.
        let purged = self.purged.borrow_and_update().clone();
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
            "writer: rows of purged sites dropped instead of inserted"
        );
        self.metrics.spool.purged_rows.inc_by(dropped);
        batch.body = kept.freeze();
        batch.rows -= dropped;
        batch.purged = dropped;
    }

    /// The body of an attempt without the rows of the sites purged since its batch was formed
    /// ([`Writer::drop_purged`]); `None` when no site was purged since, or none of its rows is
    /// of one. A batch that ClickHouse keeps refusing (too many parts, a read-only replica) is
    /// retried for as long as it takes, and `sites purge` waits for the settings' reload, not
    /// for the retry: without this, a retry after the purge's deletion would write the site's
    /// rows back. The token gets `-p<rows dropped>` (see [`Batch::dedup_token`]).
    pub(super) fn repurge(&mut self, body: &InsertBody) -> Option<InsertBody> {
        if !self.purged.has_changed().unwrap_or(false) {
            return None;
        }
        let purged = self.purged.borrow_and_update().clone();
        let (repurged, dropped) = without_sites(body, &purged)?;
        tracing::info!(
            rows = dropped,
            "writer: rows of purged sites dropped from a batch being retried"
        );
        self.metrics.spool.purged_rows.inc_by(dropped);
        Some(repurged)
    }
}

/// `body` without the rows of the `purged` sites, its token ending in `-p<rows dropped>`, and
/// how many were dropped; `None` when it holds none of them (or does not split into rows).
fn without_sites(body: &InsertBody, purged: &PurgedSites) -> Option<(InsertBody, u64)> {
    if purged.is_empty() {
        return None;
    }
    let bounds = row_bounds(&body.rows).ok()?;
    let mut kept = BytesMut::with_capacity(body.rows.len());
    let mut dropped = 0u64;
    for w in bounds.windows(2) {
        let row = &body.rows[w[0]..w[1]];
        if site_of(row).is_some_and(|site| purged.contains(site)) {
            dropped += 1;
        } else {
            kept.extend_from_slice(row);
        }
    }
    let body = InsertBody {
        token: format!("{}-p{dropped}", body.token),
        rows: kept.freeze(),
    };
    (dropped > 0).then_some((body, dropped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measurement::tests::sample;

    #[test]
    fn a_retried_body_loses_the_rows_of_a_site_purged_since() {
        let mut rows = Vec::new();
        for n in 0..3u128 {
            let mut m = sample(n);
            m.site = if n == 1 { "gone".into() } else { "kept".into() };
            m.encode(&mut rows);
        }
        let body = InsertBody {
            token: "spool-0-0-1-9".into(),
            rows: rows.into(),
        };
        let none: PurgedSites = Default::default();
        assert!(without_sites(&body, &none).is_none());
        let other: PurgedSites = std::sync::Arc::new(["other".to_owned()].into());
        assert!(without_sites(&body, &other).is_none());
        let gone: PurgedSites = std::sync::Arc::new(["gone".to_owned()].into());
        let (left, dropped) = without_sites(&body, &gone).expect("a row of gone");
        assert_eq!(dropped, 1);
        assert_eq!(left.token, "spool-0-0-1-9-p1");
        let bounds = row_bounds(&left.rows).unwrap();
        let sites: Vec<&str> = bounds
            .windows(2)
            .map(|w| site_of(&left.rows[w[0]..w[1]]).unwrap())
            .collect();
        assert_eq!(sites, ["kept", "kept"]);
    }
}

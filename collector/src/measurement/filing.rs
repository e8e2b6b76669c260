//! Where a page view is filed: its `page_view_at`, the time the table's partition and the
//! sorting key's day derive from. Every send of one page view must get the same one, whenever
//! and through whichever collector it arrives, or its resends do not fold (contract §3).
//!
//! In order of preference:
//! 1. the client's `ts`, when it is plausible ([`filing_ts`]): our script sets it once, when
//!    the page view starts, and keeps it for every send;
//! 2. (v4) the time in the `id`, when the id is a UUIDv7 (RFC 9562 §5.7: its first 48 bits
//!    are Unix milliseconds) and that time is plausible by the same bounds: our script's ids
//!    are UUIDv7, made when the page view starts, so a beacon without `ts` still files by
//!    something every resend carries;
//! 3. the receipt (`received_at`): a beacon with neither (a UUIDv4 id and no `ts`, from a
//!    client of its own) folds only when its resends arrive on the same UTC day; across
//!    midnight UTC it can be stored twice (nothing is lost).
//!
//! Whether a time is plausible is judged against each send's own receipt, so a resend files
//! like the first send unless its sends fall on both sides of a bound (a clock more than a day
//! fast, a resend 7 days late).

use uuid::Uuid;

use super::column::DateTime;

/// A `ts` this far ahead of `received_at` is skewed: 5 minutes, in milliseconds (contract §2).
pub const MAX_TS_AHEAD_MS: i64 = 5 * 60 * 1000;
/// A `ts` this far behind `received_at` is skewed: 7 days, in milliseconds (contract §2).
pub const MAX_TS_BEHIND_MS: i64 = 7 * 24 * 60 * 60 * 1000;
/// How far ahead of `received_at` a `ts` still files the page view, although it is stored as
/// NULL beyond [`MAX_TS_AHEAD_MS`]: 1 day, in milliseconds. A client clock minutes fast is
/// common, and with the 5-minute bound a beacon whose clock was 5 minutes and a few seconds
/// fast would be filed by `ts` on a resend and by its receipt on the first send (two days near
/// midnight UTC, never folding). A day moves that edge to where clocks rarely are, and keeps
/// every row of one insert within a few months (ClickHouse refuses an insert that touches more
/// than `max_partitions_per_insert_block`, 100, partitions).
pub const FILING_MAX_AHEAD_MS: i64 = 24 * 60 * 60 * 1000;

/// A client time (milliseconds) that may file a page view received at `received_at_ms`: one
/// within [`MAX_TS_BEHIND_MS`] behind and [`FILING_MAX_AHEAD_MS`] ahead of the receipt;
/// `None` otherwise.
pub fn filing_ts(ts: Option<i64>, received_at_ms: i64) -> Option<i64> {
    ts.filter(|t| {
        *t <= received_at_ms.saturating_add(FILING_MAX_AHEAD_MS)
            && *t >= received_at_ms.saturating_sub(MAX_TS_BEHIND_MS)
    })
}

/// The Unix milliseconds a UUIDv7 carries (RFC 9562 §5.7), `None` for any other version.
pub fn uuid_v7_ms(id: &Uuid) -> Option<i64> {
    (id.get_version_num() == 7).then(|| {
        let bytes = id.as_bytes();
        bytes[..6]
            .iter()
            .fold(0i64, |ms, b| (ms << 8) | i64::from(*b))
    })
}

/// The page view's time (Unix seconds): the sent `ts` when it is plausible, else the time of a
/// UUIDv7 `id` when that is, else the receipt (see the module doc).
pub fn page_view_at(id: &Uuid, ts: Option<i64>, received_at_ms: i64) -> DateTime {
    let by_client =
        filing_ts(ts, received_at_ms).or_else(|| filing_ts(uuid_v7_ms(id), received_at_ms));
    DateTime::from_ms(by_client.unwrap_or(received_at_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_780_000_000_000;
    const V4: &str = "7f1c2a3e-9b4d-4c6e-8f00-123456789abc";

    /// A UUIDv7 made at `ms`, as RFC 9562's layout has it.
    fn v7(ms: i64) -> Uuid {
        let mut bytes = [0x5au8; 16];
        bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
        bytes[6] = 0x70 | (bytes[6] & 0x0f);
        bytes[8] = 0x80 | (bytes[8] & 0x3f);
        Uuid::from_bytes(bytes)
    }

    #[test]
    fn the_page_view_time_is_ts_else_the_ids_time_else_receipt() {
        let v4 = Uuid::parse_str(V4).unwrap();
        assert_eq!(
            page_view_at(&v4, Some(NOW - 999_000), NOW),
            DateTime::from_ms(NOW - 999_000)
        );
        assert_eq!(page_view_at(&v4, None, NOW), DateTime::from_ms(NOW));
        let id = v7(NOW - 3_600_000);
        assert_eq!(uuid_v7_ms(&id), Some(NOW - 3_600_000));
        assert_eq!(
            page_view_at(&id, None, NOW),
            DateTime::from_ms(NOW - 3_600_000)
        );
        assert_eq!(
            page_view_at(&id, Some(NOW - 5_000), NOW),
            DateTime::from_ms(NOW - 5_000),
            "a plausible ts comes first"
        );
        assert_eq!(
            page_view_at(&id, Some(NOW + 2 * FILING_MAX_AHEAD_MS), NOW),
            DateTime::from_ms(NOW - 3_600_000),
            "an implausible ts gives way to the id"
        );
        let ancient = v7(NOW - MAX_TS_BEHIND_MS - 1);
        assert_eq!(
            page_view_at(&ancient, None, NOW),
            DateTime::from_ms(NOW),
            "an id's time is held to the same bounds"
        );
    }

    /// The case RFC 9562 gives (Appendix A.6): 017F22E2-79B0-7CC3-98C4-DC0C0C07398F was made
    /// at 0x017F22E279B0 ms (2022-02-22T19:22:22Z).
    #[test]
    fn the_rfc_example_reads_its_time() {
        let id = Uuid::parse_str("017F22E2-79B0-7CC3-98C4-DC0C0C07398F").unwrap();
        assert_eq!(uuid_v7_ms(&id), Some(0x017F_22E2_79B0));
        assert_eq!(uuid_v7_ms(&Uuid::parse_str(V4).unwrap()), None);
    }
}

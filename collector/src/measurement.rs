//! The stored row: one validated measurement, its columns declared once, and its one encoding.
//!
//! [`measurement_columns!`] below is the only list of the row's fields in Rust: it makes the
//! [`Measurement`] struct, [`COLUMNS`] (names and ClickHouse types, in table order), and the
//! RowBinary encoder and decoder. The table's DDL (`schema/clickhouse/*.sql`) cannot be
//! generated from it (`migrate` applies those files to servers of several versions), so a unit
//! test checks that the DDL declares exactly these columns with these types.
//!
//! # One encoding: RowBinary
//!
//! Intake encodes each accepted measurement once, as a RowBinary row, into its spool record;
//! the writer sends the records' bytes as they are (`INSERT … FORMAT RowBinary`), and nothing
//! between decodes a row. RowBinary rather than JSONEachRow, measured with
//! `cargo test --release -p collector encoding_cost -- --ignored --nocapture` (100,000 typical
//! measurements on the 2-core CI VM, 1 December 2026): RowBinary encodes in 21 ms (0.2 µs a
//! row) into 22.3 MB, JSONEachRow (serde_json) in 93 ms into 47.6 MB. RowBinary is less than
//! half the bytes to sync, read and send, costs a quarter of the CPU to make, and ClickHouse
//! parses it without text conversion; the price is that the spool is not readable with `cat`,
//! which `collector spool dump` answers.
//!
//! RowBinary, as ClickHouse defines it (docs: "Formats for input and output data", RowBinary):
//! rows one after another, each column in order; `String` a LEB128 length and the bytes;
//! `UInt32`, `Int64`, `Float64` and `DateTime` (a `UInt32` of Unix seconds) little-endian;
//! `UUID` its two 64-bit halves, high then low, each little-endian (as the `clickhouse` crate's
//! `serde::uuid` writes it); `Nullable(T)` a byte 1 for NULL, or 0 followed by `T`.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The longest user agent stored, in bytes; longer ones are cut at a character boundary.
pub const MAX_USER_AGENT_BYTES: usize = 512;

/// Why bytes are not a RowBinary [`Measurement`]: cut short, or a length beyond the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a RowBinary measurement: {0}")]
pub struct RowDecodeError(&'static str);

/// A Rust type that is one ClickHouse column type in RowBinary.
pub trait Column: Sized {
    /// The ClickHouse type, as the DDL spells it (`String`, `Nullable(Float64)`, ...).
    fn clickhouse_type() -> String;
    /// Appends the value's RowBinary encoding.
    fn encode(&self, out: &mut Vec<u8>);
    /// Reads one value from the front of `input`, advancing it.
    fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError>;
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], RowDecodeError> {
    if input.len() < n {
        return Err(RowDecodeError("cut short"));
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

macro_rules! fixed_width {
    ($($t:ty => $name:literal),*) => {$(
        impl Column for $t {
            fn clickhouse_type() -> String {
                $name.into()
            }
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError> {
                let bytes = take(input, std::mem::size_of::<$t>())?;
                Ok(<$t>::from_le_bytes(bytes.try_into().expect("sized above")))
            }
        }
    )*};
}
fixed_width!(u32 => "UInt32", i64 => "Int64", f64 => "Float64");

/// `DateTime('UTC')`: Unix seconds, a `UInt32` in RowBinary. The column names its timezone so
/// that `toYYYYMM` and `toDate` of it (the partition and the day of the sorting key) are the
/// same on every replica whatever the server's timezone (ClickHouse #4560: without it, the
/// server's timezone decides).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DateTime(pub u32);

impl Column for DateTime {
    fn clickhouse_type() -> String {
        "DateTime('UTC')".into()
    }
    fn encode(&self, out: &mut Vec<u8>) {
        self.0.encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError> {
        u32::decode(input).map(DateTime)
    }
}

impl Column for Uuid {
    fn clickhouse_type() -> String {
        "UUID".into()
    }
    fn encode(&self, out: &mut Vec<u8>) {
        let (high, low) = self.as_u64_pair();
        out.extend_from_slice(&high.to_le_bytes());
        out.extend_from_slice(&low.to_le_bytes());
    }
    fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError> {
        let bytes = take(input, 16)?;
        let high = u64::from_le_bytes(bytes[..8].try_into().expect("16 bytes"));
        let low = u64::from_le_bytes(bytes[8..].try_into().expect("16 bytes"));
        Ok(Uuid::from_u64_pair(high, low))
    }
}

impl Column for Cow<'_, str> {
    fn clickhouse_type() -> String {
        "String".into()
    }
    fn encode(&self, out: &mut Vec<u8>) {
        let mut n = self.len();
        // LEB128, as ClickHouse's `writeVarUInt`.
        while n >= 0x80 {
            out.push((n as u8) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
        out.extend_from_slice(self.as_bytes());
    }
    fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError> {
        let mut n = 0usize;
        for shift in (0..64).step_by(7) {
            let b = *take(input, 1)?.first().expect("one byte");
            n |= usize::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                let bytes = take(input, n)?;
                // Every string the collector writes is UTF-8; a damaged one still decodes.
                return Ok(Cow::Owned(String::from_utf8_lossy(bytes).into_owned()));
            }
        }
        Err(RowDecodeError("string length beyond 64 bits"))
    }
}

impl<T: Column> Column for Option<T> {
    fn clickhouse_type() -> String {
        format!("Nullable({})", T::clickhouse_type())
    }
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(1),
            Some(v) => {
                out.push(0);
                v.encode(out);
            }
        }
    }
    fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError> {
        match take(input, 1)?[0] {
            0 => T::decode(input).map(Some),
            _ => Ok(None),
        }
    }
}

/// `LowCardinality(String)`: a string of few distinct values (a device type, a browser family),
/// which ClickHouse stores as a dictionary. In RowBinary it is a `String` (ClickHouse docs,
/// "LowCardinality": the format of the inner type).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Label<'a>(pub Cow<'a, str>);

impl Column for Label<'_> {
    fn clickhouse_type() -> String {
        "LowCardinality(String)".into()
    }
    fn encode(&self, out: &mut Vec<u8>) {
        self.0.encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError> {
        Cow::decode(input).map(Label)
    }
}

impl std::ops::Deref for Label<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// A column value that can let go of what it borrows.
pub trait IntoOwned {
    /// The same value, owning its data.
    type Owned;
    /// Copies what is borrowed.
    fn into_owned(self) -> Self::Owned;
}

macro_rules! owned_already {
    ($($t:ty),*) => {$(
        impl IntoOwned for $t {
            type Owned = $t;
            fn into_owned(self) -> $t {
                self
            }
        }
    )*};
}
owned_already!(u32, i64, f64, Uuid, DateTime);

impl IntoOwned for Cow<'_, str> {
    type Owned = Cow<'static, str>;
    fn into_owned(self) -> Cow<'static, str> {
        Cow::Owned(Cow::into_owned(self))
    }
}

impl IntoOwned for Label<'_> {
    type Owned = Label<'static>;
    fn into_owned(self) -> Label<'static> {
        Label(IntoOwned::into_owned(self.0))
    }
}

impl<T: IntoOwned> IntoOwned for Option<T> {
    type Owned = Option<T::Owned>;
    fn into_owned(self) -> Self::Owned {
        self.map(T::into_owned)
    }
}

/// Declares the row once: the struct, [`COLUMNS`], and the RowBinary codec, all in this order.
macro_rules! measurement_columns {
    (<$lt:lifetime> $($(#[$attr:meta])* $name:ident: $ty:ty,)*) => {
        /// One measurement of one page view, validated and normalised: a row of
        /// `measurements`, borrowing what it can from the request (`'static` when owned).
        ///
        /// Field names are the column names (`schema/clickhouse/002_measurements.sql`) and,
        /// for the metrics, the names of the request fields (contract §2 and §3). It is
        /// encoded once, as RowBinary ([`Measurement::encode`]); the JSON form (serde) is
        /// for people: `collector spool dump`, kept-aside files, and spools of releases
        /// before RowBinary.
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        pub struct Measurement<$lt> {
            $($(#[$attr])* pub $name: $ty,)*
        }

        /// The columns of a row, in table (and RowBinary) order: name and ClickHouse type.
        pub fn columns() -> Vec<(&'static str, String)> {
            Measurement::<'static>::column_types()
        }

        /// The column names, in table order.
        pub const COLUMNS: &[&str] = &[$(stringify!($name),)*];

        impl<$lt> Measurement<$lt> {
            fn column_types() -> Vec<(&'static str, String)> {
                vec![$((stringify!($name), <$ty as Column>::clickhouse_type()),)*]
            }

            /// Appends this row's RowBinary encoding.
            pub fn encode(&self, out: &mut Vec<u8>) {
                $(Column::encode(&self.$name, out);)*
            }

            /// The same row, owning every string.
            pub fn into_owned(self) -> Measurement<'static> {
                Measurement { $($name: IntoOwned::into_owned(self.$name),)* }
            }

            /// Reads one row from the front of `input`, advancing it past the row.
            pub fn decode(input: &mut &[u8]) -> Result<Measurement<'static>, RowDecodeError> {
                Ok(Measurement { $($name: Column::decode(input)?,)* })
            }

            /// Reads a row of an earlier layout, its first `n` columns in this order and
            /// encoding; the columns after them are their defaults (`None`, empty, 0).
            pub fn decode_prefix(
                input: &mut &[u8],
                n: usize,
            ) -> Result<Measurement<'static>, RowDecodeError> {
                let mut k = 0;
                Ok(Measurement {
                    $($name: {
                        k += 1;
                        if k <= n { Column::decode(input)? } else { Default::default() }
                    },)*
                })
            }
        }
    };
}

measurement_columns! {
    <'a>
    /// The client-made measurement id; one row per id after `FINAL`.
    id: Uuid,
    /// Site key, 1 to 64 characters from `A-Za-z0-9._-`.
    site: Cow<'a, str>,
    /// Server time of acceptance, seconds since the Unix epoch (ClickHouse `DateTime('UTC')`).
    received_at: DateTime,
    /// Page URL, WHATWG-normalised, without fragment or credentials, at most 2048 bytes.
    url: Cow<'a, str>,
    /// Client time in milliseconds since the Unix epoch; `None` when absent, invalid or skewed.
    ts: Option<i64>,
    /// Referrer, normalised as `url` is, at most 2048 bytes.
    referrer: Option<Cow<'a, str>>,
    /// One of `navigate`, `reload`, `back_forward`, `back_forward_cache`, `prerender`,
    /// `restore`.
    navigation_type: Option<Cow<'a, str>>,
    /// Time to first byte, milliseconds, 0 to 3,600,000.
    ttfb_ms: Option<f64>,
    /// First Contentful Paint, milliseconds, 0 to 3,600,000.
    fcp_ms: Option<f64>,
    /// Largest Contentful Paint, milliseconds, 0 to 3,600,000.
    lcp_ms: Option<f64>,
    /// Interaction to Next Paint, milliseconds, 0 to 3,600,000.
    inp_ms: Option<f64>,
    /// `DOMContentLoaded` event end, milliseconds, 0 to 3,600,000.
    dom_content_loaded_ms: Option<f64>,
    /// `load` event end, milliseconds, 0 to 3,600,000.
    load_ms: Option<f64>,
    /// Cumulative Layout Shift, unitless, 0 to 100.
    cls: Option<f64>,
    /// Viewport width in CSS pixels, 0 to 100,000.
    viewport_width: Option<u32>,
    /// One of `slow-2g`, `2g`, `3g`, `4g`.
    effective_connection_type: Option<Cow<'a, str>>,
    /// The request's `User-Agent`, truncated to [`MAX_USER_AGENT_BYTES`].
    user_agent: Cow<'a, str>,
    /// The site's `sample_rate` in force when the measurement was accepted, 0 to 1: the
    /// share of page views whose script sends, so that an aggregate can weight each row by
    /// its inverse. Spool records written before this column existed read as 1 (every page
    /// view was sent then).
    #[serde(default = "every_page_view")]
    sample_rate: f64,
    /// When the page view started, seconds since the Unix epoch: the time the partition and
    /// the sorting key's day derive from, the same for every send of one page view
    /// ([`page_view_at`]). Columns from here on are new in v2 of the table; spool records of
    /// earlier releases get them from [`complete_earlier`].
    #[serde(default)]
    page_view_at: DateTime,
    /// `mobile`, `tablet`, `desktop`, `bot` or `unknown`, from the user agent
    /// ([`crate::useragent`]).
    #[serde(default)]
    device_type: Label<'a>,
    /// Browser family from the user agent (`Chrome`, `Mobile Safari`, `Firefox`, ...).
    #[serde(default)]
    browser: Label<'a>,
    /// The browser's major version, digits; empty when unknown.
    #[serde(default)]
    browser_version: Label<'a>,
    /// OS family from the user agent (`Windows`, `iOS`, `Android`, ...).
    #[serde(default)]
    os: Label<'a>,
    /// A CSS selector of the LCP element (contract v3): tag names, ids and classes only, at
    /// most [`crate::beacon::MAX_SELECTOR_BYTES`]. Columns from here on are new in v3 of the
    /// table (attribution); rows of earlier releases have them NULL.
    #[serde(default)]
    lcp_target: Option<Cow<'a, str>>,
    /// A CSS selector of the slowest interaction's target.
    #[serde(default)]
    inp_target: Option<Cow<'a, str>>,
    /// A CSS selector of the largest layout shift's source.
    #[serde(default)]
    cls_target: Option<Cow<'a, str>>,
    /// The LCP element's resource, normalised as `url` is.
    #[serde(default)]
    lcp_url: Option<Cow<'a, str>>,
    /// LCP part: from TTFB to the LCP resource's request start, milliseconds, 0 to `lcp_ms`.
    #[serde(default)]
    lcp_resource_load_delay_ms: Option<f64>,
    /// LCP part: the LCP resource's load, milliseconds, 0 to `lcp_ms`.
    #[serde(default)]
    lcp_resource_load_duration_ms: Option<f64>,
    /// LCP part: from the resource's end to the paint, milliseconds, 0 to `lcp_ms`.
    #[serde(default)]
    lcp_element_render_delay_ms: Option<f64>,
    /// `pointer` or `keyboard`: the slowest interaction's kind.
    #[serde(default)]
    inp_type: Option<Cow<'a, str>>,
    /// INP phase: input delay, milliseconds, 0 to `inp_ms`.
    #[serde(default)]
    inp_input_delay_ms: Option<f64>,
    /// INP phase: processing duration, milliseconds, 0 to `inp_ms`.
    #[serde(default)]
    inp_processing_duration_ms: Option<f64>,
    /// INP phase: presentation delay, milliseconds, 0 to `inp_ms`.
    #[serde(default)]
    inp_presentation_delay_ms: Option<f64>,
    /// The script that ran longest in the slowest interaction's long animation frames,
    /// normalised as `url` is.
    #[serde(default)]
    inp_script_url: Option<Cow<'a, str>>,
    /// Start time of the largest layout shift, milliseconds, 0 to 3,600,000.
    #[serde(default)]
    cls_time_ms: Option<f64>,
    /// Value of the largest layout shift, 0 to `cls`.
    #[serde(default)]
    cls_value: Option<f64>,
}

/// How many columns a row of v2 of the table had (`CSPOOL03` spool records): every column
/// before `lcp_target`, in the same order and encoding.
pub const V2_COLUMNS: usize = 23;

/// A `ts` this far behind `received_at` is skewed: 7 days, in milliseconds (contract §2).
pub const MAX_TS_BEHIND_MS: i64 = 7 * 24 * 60 * 60 * 1000;
/// How far ahead of `received_at` a `ts` still files the page view (its `page_view_at`, the
/// table's day and partition), although it is stored as NULL beyond [`MAX_TS_AHEAD_MS`]:
/// 1 day, in milliseconds. Whether a `ts` files the row is judged against each send's own
/// receipt, so a resend folds only when all its sends agree; a client clock minutes fast is
/// common, and with the 5-minute bound a beacon whose clock was 5 minutes and a few seconds
/// fast would be filed by `ts` on a resend and by its receipt on the first send (two days
/// near midnight UTC, never folding). A day moves that edge to where clocks rarely are, and
/// keeps every row of one insert within a few months (ClickHouse refuses an insert that
/// touches more than `max_partitions_per_insert_block`, 100, partitions).
pub const FILING_MAX_AHEAD_MS: i64 = 24 * 60 * 60 * 1000;

/// The `ts` (milliseconds) that files a page view received at `received_at_ms`: one within
/// [`MAX_TS_BEHIND_MS`] behind and [`FILING_MAX_AHEAD_MS`] ahead
/// of the receipt (see there for why the bound ahead is wider than the skew bound of the
/// stored `ts`); `None` otherwise, and the receipt files it.
pub fn filing_ts(ts: Option<i64>, received_at_ms: i64) -> Option<i64> {
    ts.filter(|t| {
        *t <= received_at_ms.saturating_add(FILING_MAX_AHEAD_MS)
            && *t >= received_at_ms.saturating_sub(MAX_TS_BEHIND_MS)
    })
}

/// The page view's time (Unix seconds) from what every send of it carries: the client's `ts`
/// when it files the page view ([`filing_ts`]: our script sets `ts` once, when the page view
/// starts, and keeps it for every send), else `received_at`. The table's DDL gives
/// `page_view_at` a `DEFAULT` of the stored `ts` else `received_at`, so that a writer of an
/// earlier release, which does not send the column, files its rows where this one does (they
/// differ only for a `ts` between 5 minutes and a day ahead, which the stored `ts` lacks).
///
/// Every resend of a beacon that carries `ts` therefore has the same partition and sorting
/// key, whenever and through whichever collector it arrives, unless its sends fall on both
/// sides of a filing bound (a clock more than a day fast, a resend 7 days late). A beacon
/// without `ts` falls back to its own `received_at`: its resends fold when they arrive on the
/// same UTC day (a resend across midnight UTC of such a beacon can be stored twice; nothing is
/// lost).
pub fn page_view_at(ts: Option<i64>, received_at: DateTime) -> DateTime {
    match ts {
        Some(ms) => DateTime(ms.div_euclid(1000).clamp(0, i64::from(u32::MAX)) as u32),
        None => received_at,
    }
}

/// A row of an earlier release (a spool record written before `page_view_at` and the user-agent
/// columns existed) with those columns derived as intake derives them now.
pub fn complete_earlier(mut m: Measurement<'static>) -> Measurement<'static> {
    let ts = filing_ts(m.ts, i64::from(m.received_at.0) * 1000);
    m.page_view_at = page_view_at(ts, m.received_at);
    let agent = crate::useragent::UserAgents::shared().get(&m.user_agent);
    m.device_type = Label(Cow::Borrowed(agent.device_type));
    m.browser = Label(Cow::Owned(agent.browser.clone()));
    m.browser_version = Label(Cow::Owned(agent.browser_version.clone()));
    m.os = Label(Cow::Owned(agent.os.clone()));
    m
}

/// How many columns a row of the previous release had (`CSPOOL02` spool records): the
/// columns before `page_view_at`, which a v3 row begins with in the same order and encoding.
pub const EARLIER_COLUMNS: usize = 18;

/// Decodes one row of the previous release's RowBinary layout (its first [`EARLIER_COLUMNS`]
/// columns), completed by [`complete_earlier`].
pub fn decode_earlier(input: &mut &[u8]) -> Result<Measurement<'static>, RowDecodeError> {
    Measurement::decode_prefix(input, EARLIER_COLUMNS).map(complete_earlier)
}

fn every_page_view() -> f64 {
    1.0
}

/// Rows encoded for the spool: what one request appends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedRows {
    /// The rows, RowBinary, one after another.
    pub bytes: Vec<u8>,
    /// How many rows `bytes` holds.
    pub count: u32,
    /// The earliest `received_at` among them (Unix seconds; 0 when there is none).
    pub earliest_received_at: u32,
}

impl EncodedRows {
    /// Encodes `rows`, in order.
    pub fn encode<'a, 'b: 'a>(rows: impl IntoIterator<Item = &'a Measurement<'b>>) -> Self {
        let mut out = EncodedRows {
            bytes: Vec::with_capacity(512),
            count: 0,
            earliest_received_at: u32::MAX,
        };
        for m in rows {
            m.encode(&mut out.bytes);
            out.count += 1;
            out.earliest_received_at = out.earliest_received_at.min(m.received_at.0);
        }
        if out.count == 0 {
            out.earliest_received_at = 0;
        }
        out
    }
}

/// Decodes every row of a RowBinary byte string (for people and for the failure path: the
/// spool dump, kept-aside files, splitting a refused batch; never on the way to ClickHouse).
pub fn decode_all(mut bytes: &[u8]) -> Result<Vec<Measurement<'static>>, RowDecodeError> {
    let mut rows = Vec::new();
    while !bytes.is_empty() {
        rows.push(Measurement::decode(&mut bytes)?);
    }
    Ok(rows)
}

/// The byte offset where each row of a RowBinary byte string starts, and its length as the
/// last entry (so row `i` is `bounds[i]..bounds[i + 1]`).
pub fn row_bounds(bytes: &[u8]) -> Result<Vec<usize>, RowDecodeError> {
    let mut bounds = vec![0];
    let mut rest = bytes;
    while !rest.is_empty() {
        Measurement::decode(&mut rest)?;
        bounds.push(bytes.len() - rest.len());
    }
    Ok(bounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample(n: u128) -> Measurement<'static> {
        Measurement {
            id: Uuid::from_u128(0x7f1c_2a3e_9b4d_4c6e_8f00_0000_0000_0000 | n),
            site: "shop-1".into(),
            received_at: DateTime(1_780_000_000 + n as u32),
            url: format!("https://shop.example/p/{n}?q=ü").into(),
            ts: Some(1_779_999_999_000),
            referrer: n.is_multiple_of(2).then(|| "https://ref.example/".into()),
            navigation_type: Some("navigate".into()),
            ttfb_ms: Some(12.5),
            fcp_ms: None,
            lcp_ms: Some(250.25),
            inp_ms: None,
            dom_content_loaded_ms: Some(300.0),
            load_ms: Some(900.0),
            cls: Some(0.12),
            viewport_width: Some(390),
            effective_connection_type: None,
            user_agent: "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0"
                .into(),
            sample_rate: 0.5,
            page_view_at: DateTime(1_779_999_999),
            device_type: Label("desktop".into()),
            browser: Label("Firefox".into()),
            browser_version: Label("125".into()),
            os: Label("Linux".into()),
            lcp_target: Some("main>img.hero".into()),
            inp_target: n.is_multiple_of(2).then(|| "#add".into()),
            cls_target: None,
            lcp_url: Some("https://shop.example/hero.jpg".into()),
            lcp_resource_load_delay_ms: Some(20.5),
            lcp_resource_load_duration_ms: Some(100.0),
            lcp_element_render_delay_ms: Some(117.25),
            inp_type: Some("pointer".into()),
            inp_input_delay_ms: None,
            inp_processing_duration_ms: Some(0.0),
            inp_presentation_delay_ms: None,
            inp_script_url: None,
            cls_time_ms: Some(1234.5),
            cls_value: Some(0.1),
        }
    }

    #[test]
    fn rows_round_trip_and_bounds_split_them() {
        let rows: Vec<_> = (0..5).map(sample).collect();
        let enc = EncodedRows::encode(&rows);
        assert_eq!(enc.count, 5);
        assert_eq!(enc.earliest_received_at, 1_780_000_000);
        assert_eq!(decode_all(&enc.bytes).unwrap(), rows);
        let bounds = row_bounds(&enc.bytes).unwrap();
        assert_eq!(bounds.len(), 6);
        let third = &enc.bytes[bounds[2]..bounds[3]];
        assert_eq!(decode_all(third).unwrap(), vec![sample(2)]);
        assert!(decode_all(&enc.bytes[..enc.bytes.len() - 1]).is_err());
    }

    /// The exact bytes of one row, against the RowBinary rules in the module doc.
    #[test]
    fn encoding_follows_rowbinary() {
        let mut m = sample(1);
        m.url = "u".into();
        m.site = "s".repeat(200).into();
        let mut out = Vec::new();
        m.encode(&mut out);
        let (high, low) = m.id.as_u64_pair();
        assert_eq!(&out[..8], &high.to_le_bytes());
        assert_eq!(&out[8..16], &low.to_le_bytes());
        // 200 = 0b1_1001000: LEB128 0xC8 0x01.
        assert_eq!(&out[16..18], &[0xC8, 0x01]);
        let after_site = 18 + 200;
        assert_eq!(
            &out[after_site..after_site + 4],
            &(1_780_000_001u32).to_le_bytes()
        );
        assert_eq!(&out[after_site + 4..after_site + 6], &[1, b'u']);
        assert_eq!(out[after_site + 6], 0, "ts present");
        assert_eq!(out[after_site + 15], 1, "referrer NULL (odd n)");
    }

    /// Our RowBinary, sent as the writer sends it (`insert_formatted_with`), is what the
    /// `clickhouse` crate's own deserializer (its test mock) reads as the same row: a field
    /// of the wrong width or order would fail there or change a value.
    #[tokio::test]
    async fn agrees_with_the_clickhouse_crate() {
        #[derive(Debug, PartialEq, clickhouse::Row, Serialize, Deserialize)]
        struct Crate {
            #[serde(with = "clickhouse::serde::uuid")]
            id: Uuid,
            site: String,
            received_at: u32,
            url: String,
            ts: Option<i64>,
            referrer: Option<String>,
            navigation_type: Option<String>,
            ttfb_ms: Option<f64>,
            fcp_ms: Option<f64>,
            lcp_ms: Option<f64>,
            inp_ms: Option<f64>,
            dom_content_loaded_ms: Option<f64>,
            load_ms: Option<f64>,
            cls: Option<f64>,
            viewport_width: Option<u32>,
            effective_connection_type: Option<String>,
            user_agent: String,
            sample_rate: f64,
            page_view_at: u32,
            device_type: String,
            browser: String,
            browser_version: String,
            os: String,
            lcp_target: Option<String>,
            inp_target: Option<String>,
            cls_target: Option<String>,
            lcp_url: Option<String>,
            lcp_resource_load_delay_ms: Option<f64>,
            lcp_resource_load_duration_ms: Option<f64>,
            lcp_element_render_delay_ms: Option<f64>,
            inp_type: Option<String>,
            inp_input_delay_ms: Option<f64>,
            inp_processing_duration_ms: Option<f64>,
            inp_presentation_delay_ms: Option<f64>,
            inp_script_url: Option<String>,
            cls_time_ms: Option<f64>,
            cls_value: Option<f64>,
        }
        let text = |s: &Option<Cow<'_, str>>| s.as_deref().map(str::to_owned);
        let crate_row = |m: &Measurement<'_>| Crate {
            id: m.id,
            site: m.site.to_string(),
            received_at: m.received_at.0,
            url: m.url.to_string(),
            ts: m.ts,
            referrer: m.referrer.as_deref().map(str::to_owned),
            navigation_type: m.navigation_type.as_deref().map(str::to_owned),
            ttfb_ms: m.ttfb_ms,
            fcp_ms: m.fcp_ms,
            lcp_ms: m.lcp_ms,
            inp_ms: m.inp_ms,
            dom_content_loaded_ms: m.dom_content_loaded_ms,
            load_ms: m.load_ms,
            cls: m.cls,
            viewport_width: m.viewport_width,
            effective_connection_type: m.effective_connection_type.as_deref().map(str::to_owned),
            user_agent: m.user_agent.to_string(),
            sample_rate: m.sample_rate,
            page_view_at: m.page_view_at.0,
            device_type: m.device_type.to_string(),
            browser: m.browser.to_string(),
            browser_version: m.browser_version.to_string(),
            os: m.os.to_string(),
            lcp_target: text(&m.lcp_target),
            inp_target: text(&m.inp_target),
            cls_target: text(&m.cls_target),
            lcp_url: text(&m.lcp_url),
            lcp_resource_load_delay_ms: m.lcp_resource_load_delay_ms,
            lcp_resource_load_duration_ms: m.lcp_resource_load_duration_ms,
            lcp_element_render_delay_ms: m.lcp_element_render_delay_ms,
            inp_type: text(&m.inp_type),
            inp_input_delay_ms: m.inp_input_delay_ms,
            inp_processing_duration_ms: m.inp_processing_duration_ms,
            inp_presentation_delay_ms: m.inp_presentation_delay_ms,
            inp_script_url: text(&m.inp_script_url),
            cls_time_ms: m.cls_time_ms,
            cls_value: m.cls_value,
        };
        let rows: Vec<_> = (0..3).map(sample).collect();
        assert_eq!(
            <Crate as clickhouse::Row>::COLUMN_NAMES,
            COLUMNS,
            "same columns, same order"
        );

        let mock = clickhouse::test::Mock::new();
        let client = clickhouse::Client::default()
            .with_url(mock.url())
            .with_validation(false);
        // We encode; the crate decodes.
        let recorded = mock.add(clickhouse::test::handlers::record::<Crate>());
        let sql = format!(
            "INSERT INTO measurements ({}) FORMAT RowBinary",
            COLUMNS.join(",")
        );
        let mut insert = client.insert_formatted_with(sql);
        insert
            .send(EncodedRows::encode(&rows).bytes.into())
            .await
            .unwrap();
        insert.end().await.unwrap();
        let decoded: Vec<Crate> = recorded.collect().await;
        assert_eq!(decoded, rows.iter().map(crate_row).collect::<Vec<_>>());
    }

    /// The table's DDL declares exactly [`columns`], names and types, in this order.
    #[test]
    fn the_schema_declares_these_columns() {
        let ddl = include_str!("../../schema/clickhouse/002_measurements.sql");
        let body = &ddl[ddl.find('(').unwrap() + 1..ddl.find("\n)").unwrap()];
        let declared: Vec<(String, String)> = body
            .lines()
            .map(|l| l.trim().trim_end_matches(','))
            .filter(|l| !l.is_empty())
            .map(|l| {
                let mut words = l.split_whitespace();
                (
                    words.next().unwrap().to_owned(),
                    words.next().unwrap().to_owned(),
                )
            })
            .collect();
        let ours: Vec<(String, String)> = columns()
            .into_iter()
            .map(|(n, t)| (n.to_owned(), t))
            .collect();
        assert_eq!(declared, ours);
    }

    /// A row of the previous release (`CSPOOL02`: the first 18 columns) decodes with the new
    /// columns derived, and its bytes are the prefix of the same row today.
    #[test]
    fn a_row_of_the_previous_release_is_completed() {
        let now = without_attribution(sample(3));
        let mut bytes = Vec::new();
        now.encode(&mut bytes);
        let mut tail = Vec::new();
        now.page_view_at.encode(&mut tail);
        for l in [
            &now.device_type,
            &now.browser,
            &now.browser_version,
            &now.os,
        ] {
            l.encode(&mut tail);
        }
        // The attribution columns, each a NULL (one byte).
        tail.extend(std::iter::repeat_n(1u8, COLUMNS.len() - V2_COLUMNS));
        let earlier = &bytes[..bytes.len() - tail.len()];
        let mut input = earlier;
        let m = decode_earlier(&mut input).unwrap();
        assert!(input.is_empty());
        assert_eq!(
            m, now,
            "page_view_at from ts, the agent parsed from the user agent"
        );
        let mut no_ts = sample(4);
        no_ts.ts = None;
        assert_eq!(
            complete_earlier(no_ts.clone()).page_view_at,
            no_ts.received_at,
            "without ts, the time of receipt"
        );
    }

    /// `m` as a row of v2 of the table: no attribution.
    pub(crate) fn without_attribution(m: Measurement<'static>) -> Measurement<'static> {
        Measurement {
            lcp_target: None,
            inp_target: None,
            cls_target: None,
            lcp_url: None,
            lcp_resource_load_delay_ms: None,
            lcp_resource_load_duration_ms: None,
            lcp_element_render_delay_ms: None,
            inp_type: None,
            inp_input_delay_ms: None,
            inp_processing_duration_ms: None,
            inp_presentation_delay_ms: None,
            inp_script_url: None,
            cls_time_ms: None,
            cls_value: None,
            ..m
        }
    }

    /// A row of v2 of the table (a `CSPOOL03` record) reads with its attribution NULL.
    #[test]
    fn a_row_of_v2_reads_without_attribution() {
        let full = sample(2);
        let mut bytes = Vec::new();
        full.encode(&mut bytes);
        let v2 = without_attribution(full.clone());
        let mut v2_bytes = Vec::new();
        v2.encode(&mut v2_bytes);
        v2_bytes.truncate(v2_bytes.len() - (COLUMNS.len() - V2_COLUMNS));
        let mut input = &v2_bytes[..];
        assert_eq!(
            Measurement::decode_prefix(&mut input, V2_COLUMNS).unwrap(),
            v2
        );
        assert!(input.is_empty());
        let mut input = &bytes[..];
        assert_eq!(Measurement::decode(&mut input).unwrap(), full);
    }

    #[test]
    fn the_page_view_time_is_ts_else_received_at() {
        assert_eq!(
            page_view_at(Some(1_780_000_000_999), DateTime(5)),
            DateTime(1_780_000_000)
        );
        assert_eq!(page_view_at(None, DateTime(5)), DateTime(5));
        assert_eq!(page_view_at(Some(-1), DateTime(5)), DateTime(0));
    }

    /// A spool record written before `sample_rate` existed (the JSON of a row of that
    /// release) still replays, as a row of a page view that was always sent.
    #[test]
    fn a_record_without_sample_rate_reads_as_rate_one() {
        let old = r#"{"id":"7f1c2a3e-9b4d-4c6e-8f00-123456789abc","site":"s","received_at":1780000000,
            "url":"https://a.example/","ts":null,"referrer":null,"navigation_type":"navigate",
            "ttfb_ms":1.5,"fcp_ms":null,"lcp_ms":null,"inp_ms":null,"dom_content_loaded_ms":null,
            "load_ms":null,"cls":null,"viewport_width":390,"effective_connection_type":null,
            "user_agent":"UA"}"#;
        let m = complete_earlier(
            serde_json::from_str::<Measurement>(old)
                .unwrap()
                .into_owned(),
        );
        assert_eq!(m.sample_rate, 1.0);
        assert_eq!(m.viewport_width, Some(390));
        let again: Measurement = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(again, m);
    }

    /// RowBinary against JSONEachRow for the spool (module doc): the cost to encode 100,000
    /// typical rows, and their size. Run by hand; a speed figure is not a test.
    #[test]
    #[ignore]
    fn encoding_cost() {
        let rows: Vec<_> = (0..100_000u128).map(sample).collect();
        let t = std::time::Instant::now();
        let mut rb = Vec::new();
        for m in &rows {
            m.encode(&mut rb);
        }
        let rb_time = t.elapsed();
        let t = std::time::Instant::now();
        let mut js = Vec::new();
        for m in &rows {
            serde_json::to_writer(&mut js, m).unwrap();
            js.push(b'\n');
        }
        let js_time = t.elapsed();
        let t = std::time::Instant::now();
        let back = decode_all(&rb).unwrap();
        let rb_decode = t.elapsed();
        assert_eq!(back.len(), rows.len());
        println!(
            "RowBinary: encode {rb_time:?}, {} bytes, decode {rb_decode:?}; JSONEachRow: encode {js_time:?}, {} bytes",
            rb.len(),
            js.len()
        );
    }
}

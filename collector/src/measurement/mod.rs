//! The row: one validated measurement, declared once in the field table ([`fields`]), judged
//! by its rules ([`rules`]), filed by its page view's time ([`filing`]), and encoded once.
//!
//! - [`fields`]: the table, the row ([`Measurement`]) with every field's doc, type, kind (sent
//!   or derived), rule and layout; its derive makes from it the request object
//!   ([`RawBeacon`]), [`FIELDS`], [`COLUMNS`], the RowBinary codec, and [`judge`]'s work,
//!   [`Judged`] (the measurement before any site).
//! - [`site`]: the site stage, where a [`Judged`] meets its site's rules and becomes the row.
//! - [`column`]: RowBinary type by type; [`rules`]: the field rules of contract §2;
//!   [`filing`]: `page_view_at`; [`layouts`]: rows of earlier layouts made current;
//!   [`stored`]: rows at rest (earlier spools, kept-aside files) held to today's rules.
//!
//! The table's DDL (`schema/clickhouse/*.sql`) cannot be generated from the table (`migrate`
//! applies those files to servers of several versions), so a unit test checks that the DDL
//! declares exactly these columns with these types.
//!
//! # One encoding: RowBinary
//!
//! Intake encodes each accepted measurement once, as a RowBinary row, into its spool record
//! ([`encode`]); the writer sends the records' bytes as they are (`INSERT … FORMAT RowBinary`),
//! and nothing between decodes a row. RowBinary rather than JSONEachRow, measured with
//! `cargo test --release -p collector encoding_cost -- --ignored --nocapture` (100,000 typical
//! measurements on the 2-core CI VM, 1 December 2026): RowBinary encodes in 21 ms (0.2 µs a
//! row) into 22.3 MB, JSONEachRow (serde_json) in 93 ms into 47.6 MB. RowBinary is less than
//! half the bytes to sync, read and send, costs a quarter of the CPU to make, and ClickHouse
//! parses it without text conversion; the price is that the spool is not readable with `cat`,
//! which `collector spool dump` answers.
//!
//! # Layouts
//!
//! Each section of the table is a layout: the columns a release added. A spool record carries
//! its rows' layout, and the spool hands a record of an earlier layout to [`layouts::upgrade`]
//! (through [`LAYOUTS`]) without ever reading a row itself; so a column added to the table
//! needs no new spool format, only a new section.

mod column;
pub mod dimensions;
pub mod fields;
pub mod filing;
mod heavy_hitters;
pub mod layouts;
pub mod minimise;
pub mod page_groups;
pub mod rules;
pub mod site;
pub mod stored;
pub mod timing;

pub use column::{Column, DateTime, IntoOwned, Label, RowDecodeError};
pub use fields::{judge, Judged, Measurement, RawBeacon, COLUMNS, FIELDS, LAYOUT_SECTIONS};
pub use layouts::read_record;
pub use rules::{Context, Field, Rejection};

use crate::spool::{Layouts, Record};

/// Whether a field is sent by the browser or set by the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// Sent; the measurement is rejected without it.
    Required,
    /// Sent; dropped alone when invalid.
    Optional,
    /// Set by the collector.
    Derived,
}

/// One entry of the field table, as data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldSpec {
    /// Field and column name.
    pub name: &'static str,
    /// Sent or derived.
    pub kind: FieldKind,
    /// The layout the column was added in.
    pub layout: u16,
    /// The rejection of a measurement without this (required) field.
    pub missing: Rejection,
    /// The rejection of a measurement whose (required) field is invalid.
    pub invalid: Rejection,
}

/// The current layout: the table's last section.
pub const LAYOUT: u16 = LAYOUT_SECTIONS[LAYOUT_SECTIONS.len() - 1].0;

/// What the spool is handed at open: the current layout and the upgrade of earlier ones.
pub const LAYOUTS: Layouts = Layouts {
    current: LAYOUT,
    upgrade: layouts::upgrade,
};

/// The columns of a row, in table (and RowBinary) order: name and ClickHouse type.
pub fn columns() -> Vec<(&'static str, String)> {
    Measurement::columns()
}

/// The names of the request fields, in table order.
pub fn request_fields() -> impl Iterator<Item = &'static str> {
    FIELDS
        .iter()
        .filter(|f| f.kind != FieldKind::Derived)
        .map(|f| f.name)
}

/// The optional fields, dropped one by one when invalid: the `field` values of
/// `collector_measurements_field_dropped_total`.
pub fn optional_fields() -> impl Iterator<Item = &'static str> {
    FIELDS
        .iter()
        .filter(|f| f.kind == FieldKind::Optional)
        .map(|f| f.name)
}

/// The rejections of a required field missing or invalid (`missing id`, `invalid id`, ...),
/// in table order.
pub fn field_rejections() -> impl Iterator<Item = Rejection> {
    FIELDS
        .iter()
        .filter(|f| f.kind == FieldKind::Required)
        .flat_map(|f| [f.missing, f.invalid])
}

/// Encodes `rows`, in order, as the spool record of one request (current layout).
// Never inlined, so that a profile of the whole-program (LTO) build names the station.
#[inline(never)]
pub fn encode<'a, 'b: 'a>(rows: impl IntoIterator<Item = &'a Measurement<'b>>) -> Record {
    let mut out = Record {
        layout: LAYOUT,
        rows: 0,
        earliest_received_at: u32::MAX,
        payload: Vec::with_capacity(512),
    };
    for m in rows {
        m.encode(&mut out.payload);
        out.rows += 1;
        out.earliest_received_at = out.earliest_received_at.min(m.received_at.0);
    }
    if out.rows == 0 {
        out.earliest_received_at = 0;
    }
    out
}

/// Decodes every row of a RowBinary byte string of the current layout (for people and for the
/// failure path: kept-aside files, splitting a refused batch; never on the way to ClickHouse).
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

/// The site of one RowBinary row of the current layout (its first bytes: the `id`, then the
/// `site` string), without decoding the rest; `None` when the bytes do not start so.
pub fn site_of(row: &[u8]) -> Option<&str> {
    let mut input = row.get(16..)?;
    let (mut len, mut shift) = (0usize, 0);
    loop {
        let (&b, rest) = input.split_first()?;
        input = rest;
        len |= usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
    std::str::from_utf8(input.get(..len)?).ok()
}

/// A kept-aside file's body for rows (RowBinary, current layout) ClickHouse refused with
/// `reason`: `{"reason": …, "measurements": [rows as JSON]}`, the table's column format, ready
/// for `INSERT … FORMAT JSONEachRow` once the cause is fixed; and how many rows it holds. Rows
/// that do not decode (only a bug gets here: the frames were checksummed) are kept as
/// hexadecimal under `rowbinary_hex`, counted as one.
pub fn kept_aside_json(rows: &[u8], reason: &str) -> (Vec<u8>, usize) {
    let (body, count) = match decode_all(rows) {
        Ok(measurements) => (
            serde_json::json!({ "reason": reason, "measurements": measurements }),
            measurements.len(),
        ),
        Err(e) => (
            serde_json::json!({
                "reason": reason,
                "undecodable": e.to_string(),
                "rowbinary_hex": hex::encode(rows),
            }),
            1,
        ),
    };
    (serde_json::to_vec_pretty(&body).unwrap_or_default(), count)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};
    use std::borrow::Cow;
    use uuid::Uuid;

    // The update makes a column added to the table take its default here, with no edit.
    #[allow(clippy::needless_update)]
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
            server_timing_name: vec!["cdn-cache".into(), "db".into()],
            server_timing_dur: vec![0.0, 12.5],
            server_timing_desc: vec!["HIT".into(), "".into()],
            cdn_cache: Label("hit".into()),
            dimension_names: if n.is_multiple_of(2) {
                vec!["variant".into()]
            } else {
                vec![]
            },
            dimension_values: if n.is_multiple_of(2) {
                vec!["b".into()]
            } else {
                vec![]
            },
            page_group: Label("product".into()),
            // Columns added later are at their defaults.
            ..Default::default()
        }
    }

    #[test]
    fn rows_round_trip_and_bounds_split_them() {
        let rows: Vec<_> = (0..5).map(sample).collect();
        let enc = encode(&rows);
        assert_eq!((enc.layout, enc.rows), (LAYOUT, 5));
        assert_eq!(enc.earliest_received_at, 1_780_000_000);
        assert_eq!(decode_all(&enc.payload).unwrap(), rows);
        let bounds = row_bounds(&enc.payload).unwrap();
        assert_eq!(bounds.len(), 6);
        let third = &enc.payload[bounds[2]..bounds[3]];
        assert_eq!(decode_all(third).unwrap(), vec![sample(2)]);
        assert!(decode_all(&enc.payload[..enc.payload.len() - 1]).is_err());
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

    /// A row as the `clickhouse` crate's own (de)serializer sees it: every column, in order.
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
        country: String,
        server_timing_name: Vec<String>,
        server_timing_dur: Vec<f64>,
        server_timing_desc: Vec<String>,
        cdn_cache: String,
        dimension_names: Vec<String>,
        dimension_values: Vec<String>,
        page_group: String,
    }

    impl From<&Measurement<'_>> for Crate {
        fn from(m: &Measurement<'_>) -> Crate {
            let texts = |v: &[Cow<'_, str>]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            let text = |s: &Option<Cow<'_, str>>| s.as_deref().map(str::to_owned);
            Crate {
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
                effective_connection_type: m
                    .effective_connection_type
                    .as_deref()
                    .map(str::to_owned),
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
                country: m.country.to_string(),
                server_timing_name: texts(&m.server_timing_name),
                server_timing_dur: m.server_timing_dur.clone(),
                server_timing_desc: texts(&m.server_timing_desc),
                cdn_cache: m.cdn_cache.to_string(),
                dimension_names: texts(&m.dimension_names),
                dimension_values: texts(&m.dimension_values),
                page_group: m.page_group.to_string(),
            }
        }
    }

    /// Our RowBinary, sent as the writer sends it (`insert_formatted_with`), is what the
    /// `clickhouse` crate's own deserializer (its test mock) reads as the same row: a field
    /// of the wrong width or order would fail there or change a value.
    #[tokio::test]
    async fn agrees_with_the_clickhouse_crate() {
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
        insert.send(encode(&rows).payload.into()).await.unwrap();
        insert.end().await.unwrap();
        let decoded: Vec<Crate> = recorded.collect().await;
        assert_eq!(decoded, rows.iter().map(Crate::from).collect::<Vec<_>>());
    }

    /// The table's DDL declares exactly [`columns`], names and types, in this order.
    #[test]
    fn the_schema_declares_these_columns() {
        let ddl = include_str!("../../../schema/clickhouse/002_measurements.sql");
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

    /// `m` as a row of layout 5: none of the columns of layout 6.
    pub(crate) fn in_layout_5(m: Measurement<'static>) -> Measurement<'static> {
        Measurement {
            server_timing_name: vec![],
            server_timing_dur: vec![],
            server_timing_desc: vec![],
            cdn_cache: Label::default(),
            dimension_names: vec![],
            dimension_values: vec![],
            page_group: Label::default(),
            ..m
        }
    }

    /// `m` as a row of layout 3: no attribution, nor any column added after.
    pub(crate) fn without_attribution(m: Measurement<'static>) -> Measurement<'static> {
        let m = in_layout_5(m);
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

    /// `m` encoded with only the columns of `layout` (a row as that layout's release wrote
    /// it): the current encoding cut after those columns.
    pub(crate) fn encoded_in(m: &Measurement<'_>, layout: u16) -> Vec<u8> {
        let mut full = Vec::new();
        m.encode(&mut full);
        let mut input = &full[..];
        Measurement::decode_prefix(&mut input, layouts::columns_in(layout).unwrap()).unwrap();
        full[..full.len() - input.len()].to_vec()
    }

    #[test]
    fn the_site_of_a_row_is_read_from_its_first_columns() {
        assert_eq!(&COLUMNS[..2], ["id", "site"], "site_of reads these two");
        let mut m = sample(1);
        m.site = "s".repeat(200).into();
        let mut row = Vec::new();
        m.encode(&mut row);
        assert_eq!(site_of(&row), Some(&*m.site));
        assert_eq!(site_of(&row[..20]), None);
        assert_eq!(site_of(&row[..10]), None);
    }

    #[test]
    fn the_layouts_are_the_tables_sections() {
        assert_eq!(LAYOUT, LAYOUT_SECTIONS.last().unwrap().0);
        assert_eq!(layouts::columns_in(2), Some(18));
        assert_eq!(layouts::columns_in(3), Some(23));
        assert_eq!(layouts::columns_in(LAYOUT), Some(COLUMNS.len()));
        assert_eq!(layouts::columns_in(99), None);
        assert!(FIELDS.windows(2).all(|w| w[0].layout <= w[1].layout));
    }

    /// A payload that holds no whole rows says why, for people, and `collector spool dump`
    /// lists that text as the record's `error`.
    #[test]
    fn an_unreadable_record_says_why() {
        let bytes = encoded_in(&sample(3), 3);
        let cut = layouts::read_record(3, &bytes[..bytes.len() - 1]).unwrap_err();
        assert_eq!(
            cut.to_string(),
            "not a RowBinary measurement: cut short (layout 3)"
        );
        assert_eq!(
            serde_json::to_value(&cut).unwrap(),
            serde_json::Value::String(cut.to_string())
        );
        let json = layouts::read_record(1, b"{}").unwrap_err();
        assert_eq!(
            json.to_string(),
            "not a JSON array of measurements (layout 1): invalid type: map, expected a sequence at line 1 column 0"
        );
    }

    /// A row of layout 2 (`CSPOOL02`: 18 columns) reads with the columns of layout 3 derived
    /// as intake derives them, and the attribution NULL.
    #[test]
    fn a_row_of_layout_2_is_completed() {
        let now = without_attribution(sample(3));
        let bytes = encoded_in(&now, 2);
        let read = layouts::read_record(2, &bytes).unwrap();
        assert_eq!(
            read,
            vec![now],
            "page_view_at from ts, the agent parsed from the user agent"
        );
        let mut no_ts = sample(4);
        no_ts.ts = None;
        assert_eq!(
            layouts::complete_earlier(no_ts.clone()).page_view_at,
            no_ts.received_at,
            "without ts (and a UUIDv4 id), the time of receipt"
        );
    }

    /// A row of layout 3 (`CSPOOL03`) reads with its attribution NULL; the upgrade makes it a
    /// record of the current layout.
    #[test]
    fn a_row_of_layout_3_reads_without_attribution() {
        let full = sample(2);
        let v3 = without_attribution(full.clone());
        let bytes = encoded_in(&v3, 3);
        assert_eq!(layouts::read_record(3, &bytes).unwrap(), vec![v3.clone()]);
        let up = layouts::upgrade(3, &bytes).unwrap();
        assert_eq!((up.layout, up.rows), (LAYOUT, 1));
        assert_eq!(decode_all(&up.payload).unwrap(), vec![v3]);
        assert_eq!(layouts::upgrade(3, &bytes[..bytes.len() - 1]), None);
    }

    /// A row of layout 5 (`country`, before Server-Timing, dimensions and page groups) reads
    /// with those columns empty, and upgrades to a record of the current layout.
    #[test]
    fn a_row_of_layout_5_reads_without_the_columns_of_layout_6() {
        let v5 = in_layout_5(sample(4));
        let bytes = encoded_in(&v5, 5);
        assert_eq!(layouts::read_record(5, &bytes).unwrap(), vec![v5.clone()]);
        let up = layouts::upgrade(5, &bytes).unwrap();
        assert_eq!((up.layout, up.rows), (LAYOUT, 1));
        assert_eq!(decode_all(&up.payload).unwrap(), vec![v5]);
        assert_eq!(LAYOUT, 6);
    }

    /// A spool record of the JSON release (layout 1), written before `sample_rate` existed,
    /// still replays, as a row of a page view that was always sent.
    #[test]
    fn a_record_of_layout_1_without_sample_rate_reads_as_rate_one() {
        let old = r#"[{"id":"7f1c2a3e-9b4d-4c6e-8f00-123456789abc","site":"s","received_at":1780000000,
            "url":"https://a.example/","ts":null,"referrer":null,"navigation_type":"navigate",
            "ttfb_ms":1.5,"fcp_ms":null,"lcp_ms":null,"inp_ms":null,"dom_content_loaded_ms":null,
            "load_ms":null,"cls":null,"viewport_width":390,"effective_connection_type":null,
            "user_agent":"UA"}]"#;
        let rows = layouts::read_record(1, old.as_bytes()).unwrap();
        let m = &rows[0];
        assert_eq!(m.sample_rate, 1.0);
        assert_eq!(m.viewport_width, Some(390));
        assert_eq!(m.page_view_at, DateTime(1_780_000_000));
        let again: Measurement = serde_json::from_str(&serde_json::to_string(m).unwrap()).unwrap();
        assert_eq!(&again, m);
        let up = layouts::upgrade(1, old.as_bytes()).unwrap();
        assert_eq!((up.rows, up.earliest_received_at), (1, 1_780_000_000));
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

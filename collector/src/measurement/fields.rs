//! The field table: every field of a measurement, once, in column order, as a field of the
//! row ([`Measurement`]): its doc (units, bounds), its Rust and so ClickHouse type, and in its
//! `#[field(...)]` attribute whether the browser sends it (`required`, `optional`, `settled`)
//! or the collector derives it (`derived`; `site`: the site stage, [`super::site`]), its rule
//! ([`super::rules`]; a rule may name `ctx`, the [`super::Context`], and any field before it),
//! and the layout it was added in. Everything else reads this table through what the derive
//! ([`field_table`], the workspace crate `field-table`) makes of it: [`Judged`] and
//! [`judge`], [`RawBeacon`], [`FIELDS`], [`COLUMNS`], [`LAYOUT_SECTIONS`] and the RowBinary
//! codec.
//!
//! Adding a column is: an entry at the end, under a new `layout` section (rows of earlier
//! layouts read with the new column at its default; a derivation for them goes in
//! [`super::layouts`]), a schema migration under `schema/` (a unit test holds the DDL to this
//! table), and the script, if the browser sends it.
//!
//! Layout 1 is the JSON of the first release's spools, which has no section: its rows read
//! through serde, with the attributes below.

use std::borrow::Cow;

use field_table::FieldTable;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::column::{DateTime, Label};
use super::rules::{self, Context, Rejection, CONNECTION_TYPES, INP_TYPES, MAX_CLS, MAX_MS};
use super::{dimensions, filing, timing};

/// One measurement of one page view, validated and normalised: a row of `measurements`,
/// borrowing what it can from the request (`'static` when owned). The field table: see the
/// module doc, and [`field_table`] for what the derive makes of it.
///
/// Field names are the column names (`schema/clickhouse/002_measurements.sql`) and, for
/// request fields, the names in the request body (contract §2 and §3). It is encoded once, as
/// RowBinary ([`Measurement::encode`]); the JSON form (serde) is for people: `collector spool
/// dump`, kept-aside files, and spools of the JSON release.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, FieldTable)]
// Request fields sent without a column of their own, since layout 6: judged first,
// dropped alone when invalid (as `optional`); the derived columns and the site stage read
// them by name.
// The page's navigation Server-Timing entries (contract v4): at most 10 of `{"name",
// "dur", "desc"}`, stored as the `server_timing_*` arrays ([`timing`]).
#[field(input(server_timing: Vec<timing::Timing<'a>> = timing::server_timing))]
// Values under names (contract v4), stored as the `dimension_*` arrays by the site
// stage, which keeps the names the site declared ([`dimensions::settle`]).
#[field(input(dimensions: dimensions::Pairs<'a> = dimensions::dimensions))]
#[field(input_layout = 6)]
pub struct Measurement<'a> {
    /// The client-made measurement id; one row per id after `FINAL`. Our script makes
    /// UUIDv7 ids (v4), whose time files a page view sent without `ts` ([`filing`]).
    #[field(layout = 2, required = rules::id)]
    pub id: Uuid,
    /// Site key, 1 to 64 characters from `A-Za-z0-9._-`.
    #[field(required = rules::site_key)]
    pub site: Cow<'a, str>,
    /// Server time of acceptance, seconds since the Unix epoch (ClickHouse
    /// `DateTime('UTC')`).
    #[field(derived = DateTime::from_ms(ctx.received_at_ms))]
    pub received_at: DateTime,
    /// Page URL, WHATWG-normalised, without fragment or credentials, at most 2048 bytes;
    /// minimised by intake as its site keeps it ([`super::minimise`]) before it is stored.
    #[field(required = rules::url)]
    pub url: Cow<'a, str>,
    /// Client time in milliseconds since the Unix epoch; `None` when absent, invalid or
    /// skewed (more than 5 minutes ahead of or 7 days behind `received_at`).
    #[field(optional = rules::client_time(ctx.received_at_ms))]
    pub ts: Option<i64>,
    /// Referrer, normalised as `url` is, at most 2048 bytes; minimised by intake: its origin
    /// from another site, as `url` from the same site ([`super::minimise`]).
    #[field(optional = rules::url)]
    pub referrer: Option<Cow<'a, str>>,
    /// One of `navigate`, `reload`, `back_forward`, `back_forward_cache`, `prerender`,
    /// `restore`, `soft_navigation`.
    #[field(optional = rules::navigation)]
    pub navigation_type: Option<Cow<'a, str>>,
    /// Time to first byte, milliseconds, 0 to 3,600,000.
    #[field(optional = rules::ms)]
    pub ttfb_ms: Option<f64>,
    /// First Contentful Paint, milliseconds, 0 to 3,600,000.
    #[field(optional = rules::ms)]
    pub fcp_ms: Option<f64>,
    /// Largest Contentful Paint, milliseconds, 0 to 3,600,000.
    #[field(optional = rules::ms)]
    pub lcp_ms: Option<f64>,
    /// Interaction to Next Paint, milliseconds, 0 to 3,600,000.
    #[field(optional = rules::ms)]
    pub inp_ms: Option<f64>,
    /// `DOMContentLoaded` event end, milliseconds, 0 to 3,600,000.
    #[field(optional = rules::ms)]
    pub dom_content_loaded_ms: Option<f64>,
    /// `load` event end, milliseconds, 0 to 3,600,000.
    #[field(optional = rules::ms)]
    pub load_ms: Option<f64>,
    /// Cumulative Layout Shift, unitless, 0 to 100.
    #[field(optional = rules::cls)]
    pub cls: Option<f64>,
    /// Viewport width in CSS pixels, 0 to 100,000.
    #[field(optional = rules::css_pixels)]
    pub viewport_width: Option<u32>,
    /// One of `slow-2g`, `2g`, `3g`, `4g` (Network Information API).
    #[field(optional = rules::one_of(CONNECTION_TYPES))]
    pub effective_connection_type: Option<Cow<'a, str>>,
    /// The request's `User-Agent`, at most [`rules::MAX_USER_AGENT_BYTES`].
    #[field(derived = Cow::Borrowed(ctx.user_agent))]
    pub user_agent: Cow<'a, str>,
    /// The `sample_rate` its page view was sampled at, 0 to 1, so that an aggregate can
    /// weight each row by its inverse: the rate the script drew at (contract v4), as the
    /// site stage settles it against the site ([`super::site`], [`crate::sampling`]).
    /// Rows of layout 1 without it read as 1 (every page view was sent then).
    #[serde(default = "every_page_view")]
    #[field(settled = rules::rate)]
    pub sample_rate: f64,
    /// When the page view started, seconds since the Unix epoch: the time the partition and
    /// the sorting key's day derive from, the same for every send of one page view
    /// ([`filing::page_view_at`]).
    #[serde(default)]
    #[field(layout = 3, derived = filing::page_view_at(&id, ts.sent().copied(), ctx.received_at_ms))]
    pub page_view_at: DateTime,
    /// `mobile`, `tablet`, `desktop`, `bot` or `unknown`, from the user agent
    /// ([`crate::useragent`]).
    #[serde(default)]
    #[field(derived = Label(Cow::Borrowed(ctx.agent.device_type)))]
    pub device_type: Label<'a>,
    /// Browser family from the user agent (`Chrome`, `Mobile Safari`, `Firefox`, ...).
    #[serde(default)]
    #[field(derived = Label(Cow::Borrowed(&ctx.agent.browser)))]
    pub browser: Label<'a>,
    /// The browser's major version, digits; empty when unknown.
    #[serde(default)]
    #[field(derived = Label(Cow::Borrowed(&ctx.agent.browser_version)))]
    pub browser_version: Label<'a>,
    /// OS family from the user agent (`Windows`, `iOS`, `Android`, ...).
    #[serde(default)]
    #[field(derived = Label(Cow::Borrowed(&ctx.agent.os)))]
    pub os: Label<'a>,
    /// A CSS selector of the LCP element (contract v3): tag names, ids and classes only, at
    /// most [`rules::MAX_SELECTOR_BYTES`].
    #[serde(default)]
    #[field(layout = 4, optional = rules::selector)]
    pub lcp_target: Option<Cow<'a, str>>,
    /// A CSS selector of the slowest interaction's target.
    #[serde(default)]
    #[field(optional = rules::selector)]
    pub inp_target: Option<Cow<'a, str>>,
    /// A CSS selector of the largest layout shift's source.
    #[serde(default)]
    #[field(optional = rules::selector)]
    pub cls_target: Option<Cow<'a, str>>,
    /// The LCP element's resource: scheme, host, port and masked path (contract v4 §2).
    #[serde(default)]
    #[field(optional = rules::resource_url)]
    pub lcp_url: Option<Cow<'a, str>>,
    /// LCP part: from TTFB to the LCP resource's request start, milliseconds, 0 to `lcp_ms`.
    #[serde(default)]
    #[field(optional = rules::part_of(&lcp_ms, MAX_MS))]
    pub lcp_resource_load_delay_ms: Option<f64>,
    /// LCP part: the LCP resource's load, milliseconds, 0 to `lcp_ms`.
    #[serde(default)]
    #[field(optional = rules::part_of(&lcp_ms, MAX_MS))]
    pub lcp_resource_load_duration_ms: Option<f64>,
    /// LCP part: from the resource's end to the paint, milliseconds, 0 to `lcp_ms`.
    #[serde(default)]
    #[field(optional = rules::part_of(&lcp_ms, MAX_MS))]
    pub lcp_element_render_delay_ms: Option<f64>,
    /// `pointer` or `keyboard`: the slowest interaction's kind.
    #[serde(default)]
    #[field(optional = rules::one_of(INP_TYPES))]
    pub inp_type: Option<Cow<'a, str>>,
    /// INP phase: input delay, milliseconds, 0 to `inp_ms`.
    #[serde(default)]
    #[field(optional = rules::part_of(&inp_ms, MAX_MS))]
    pub inp_input_delay_ms: Option<f64>,
    /// INP phase: processing duration, milliseconds, 0 to `inp_ms`.
    #[serde(default)]
    #[field(optional = rules::part_of(&inp_ms, MAX_MS))]
    pub inp_processing_duration_ms: Option<f64>,
    /// INP phase: presentation delay, milliseconds, 0 to `inp_ms`.
    #[serde(default)]
    #[field(optional = rules::part_of(&inp_ms, MAX_MS))]
    pub inp_presentation_delay_ms: Option<f64>,
    /// The script that ran longest in the slowest interaction's long animation frames:
    /// scheme, host, port and masked path (contract v4 §2).
    #[serde(default)]
    #[field(optional = rules::resource_url)]
    pub inp_script_url: Option<Cow<'a, str>>,
    /// Start time of the largest layout shift, milliseconds, 0 to 3,600,000.
    #[serde(default)]
    #[field(optional = rules::ms)]
    pub cls_time_ms: Option<f64>,
    /// Value of the largest layout shift, 0 to `cls`.
    #[serde(default)]
    #[field(optional = rules::part_of(&cls, MAX_CLS))]
    pub cls_value: Option<f64>,
    /// The client's country (contract v4): ISO 3166-1 alpha-2 from `COLLECTOR_GEO_DB`;
    /// empty without a database, for an address it does not list, and for private and
    /// loopback addresses. The address itself is never stored.
    #[serde(default)]
    #[field(layout = 5, derived = Label(Cow::Borrowed(ctx.country)))]
    pub country: Label<'a>,
    /// The names of the page's Server-Timing entries, at most 10, each 1 to 64 bytes
    /// (contract v4); rows of earlier layouts: empty.
    #[serde(default)]
    #[field(layout = 6, derived = timing::column(&server_timing, timing::stored_name))]
    pub server_timing_name: Vec<Cow<'a, str>>,
    /// Their durations, milliseconds, 0 to 3,600,000 (0 when not sent), in the same order.
    #[serde(default)]
    #[field(derived = timing::column(&server_timing, |t| t.dur))]
    pub server_timing_dur: Vec<f64>,
    /// Their descriptions, at most 64 bytes (empty when not sent), in the same order.
    #[serde(default)]
    #[field(derived = timing::column(&server_timing, timing::stored_desc))]
    pub server_timing_desc: Vec<Cow<'a, str>>,
    /// `hit`, `miss`, `stale`, `pass` or empty: the CDN's cache status from the first
    /// Server-Timing entry `cdn-cache` or `cfCacheStatus` ([`timing::cdn_cache`]).
    #[serde(default)]
    #[field(derived = timing::cdn_cache(&server_timing))]
    pub cdn_cache: Label<'a>,
    /// The names of the dimensions stored, at most 5, each declared by the site
    /// (`--dimension`), in byte order: the site stage keeps the declared ones of those sent
    /// ([`dimensions::settle`]).
    #[serde(default)]
    #[field(site)]
    pub dimension_names: Vec<Cow<'a, str>>,
    /// Their values, at most 64 bytes, masked as a URL's path; per site, name and UTC day
    /// a collector keeps the 100 seen most often, the others `(other)` (contract v5 §2,
    /// [`dimensions::DistinctValues`]).
    #[serde(default)]
    #[field(site)]
    pub dimension_values: Vec<Cow<'a, str>>,
    /// The page group (contract v4): the name of the site's first page-group rule the
    /// minimised path matches, else the path with its variable parts as `*`
    /// ([`super::page_groups`]); set by the site stage ([`super::site`]). Rows of earlier
    /// layouts: empty.
    #[serde(default)]
    #[field(site)]
    pub page_group: Label<'a>,
}

/// Judges one measurement object by the table's rules, field by field in table order,
/// knowing no site ([`judged_by_the_table`], which the derive makes): every column that
/// needs no site, what was dropped, and whether a `ts` was withheld for clock skew. Errors:
/// the first required field missing or invalid (`missing id`, `invalid url`, ...).
pub fn judge<'a>(raw: RawBeacon<'a>, ctx: &Context<'a>) -> Result<Judged<'a>, Rejection> {
    judged_by_the_table(raw, ctx)
}

/// The `sample_rate` of a row that has none (layout 1): every page view was sent.
fn every_page_view() -> f64 {
    1.0
}

//! The field table: every field of a measurement, once, in column order: its doc (units,
//! bounds), its Rust and so ClickHouse type, whether the browser sends it (`required`,
//! `optional`, `settled`) or the collector derives it (`derived`; `site`: the site stage), its
//! rule, and the layout it was added in. Everything else reads this table (see
//! [`super::table`] for what it makes).
//!
//! Adding a column is: an entry at the end, under a new `layout` section (rows of earlier
//! layouts read with the new column at its default; a derivation for them goes in
//! [`super::layouts`]), a schema migration under `schema/` (a unit test holds the DDL to this
//! table), and the script, if the browser sends it.
//!
//! Layout 1 is the JSON of the first release's spools, which has no section: its rows read
//! through serde, with the attributes below.

use std::borrow::Cow;

use uuid::Uuid;

use super::column::{DateTime, Label};
use super::rules::{self, CONNECTION_TYPES, INP_TYPES, MAX_CLS, MAX_MS};
use super::{dimensions, filing, timing};

measurement_table! {
    <'a> judged with ctx;

    sent without a column since layout 6 {
        /// The page's navigation Server-Timing entries (contract v4): at most 10 of `{"name",
        /// "dur", "desc"}`, stored as the `server_timing_*` arrays ([`timing`]).
        server_timing: Vec<timing::Timing<'a>> = optional(timing::server_timing),
        /// Values under names (contract v4), stored as the `dimension_*` arrays by the site
        /// stage, which keeps the names the site declared ([`dimensions::settle`]).
        dimensions: dimensions::Pairs<'a> = optional(dimensions::dimensions),
    }

    layout 2 {
        /// The client-made measurement id; one row per id after `FINAL`. Our script makes
        /// UUIDv7 ids (v4), whose time files a page view sent without `ts` ([`filing`]).
        id: Uuid = required(rules::id),
        /// Site key, 1 to 64 characters from `A-Za-z0-9._-`.
        site: Cow<'a, str> = required(rules::site_key),
        /// Server time of acceptance, seconds since the Unix epoch (ClickHouse
        /// `DateTime('UTC')`).
        received_at: DateTime = derived(DateTime::from_ms(ctx.received_at_ms)),
        /// Page URL, WHATWG-normalised, without fragment or credentials, at most 2048 bytes;
        /// minimised by intake as its site keeps it ([`super::minimise`]) before it is stored.
        url: Cow<'a, str> = required(rules::url),
        /// Client time in milliseconds since the Unix epoch; `None` when absent, invalid or
        /// skewed (more than 5 minutes ahead of or 7 days behind `received_at`).
        ts: Option<i64> = optional(rules::client_time(ctx.received_at_ms)),
        /// Referrer, normalised as `url` is, at most 2048 bytes; minimised by intake: its origin
        /// from another site, as `url` from the same site ([`super::minimise`]).
        referrer: Option<Cow<'a, str>> = optional(rules::url),
        /// One of `navigate`, `reload`, `back_forward`, `back_forward_cache`, `prerender`,
        /// `restore`, `soft_navigation`.
        navigation_type: Option<Cow<'a, str>> = optional(rules::navigation),
        /// Time to first byte, milliseconds, 0 to 3,600,000.
        ttfb_ms: Option<f64> = optional(rules::ms),
        /// First Contentful Paint, milliseconds, 0 to 3,600,000.
        fcp_ms: Option<f64> = optional(rules::ms),
        /// Largest Contentful Paint, milliseconds, 0 to 3,600,000.
        lcp_ms: Option<f64> = optional(rules::ms),
        /// Interaction to Next Paint, milliseconds, 0 to 3,600,000.
        inp_ms: Option<f64> = optional(rules::ms),
        /// `DOMContentLoaded` event end, milliseconds, 0 to 3,600,000.
        dom_content_loaded_ms: Option<f64> = optional(rules::ms),
        /// `load` event end, milliseconds, 0 to 3,600,000.
        load_ms: Option<f64> = optional(rules::ms),
        /// Cumulative Layout Shift, unitless, 0 to 100.
        cls: Option<f64> = optional(rules::cls),
        /// Viewport width in CSS pixels, 0 to 100,000.
        viewport_width: Option<u32> = optional(rules::css_pixels),
        /// One of `slow-2g`, `2g`, `3g`, `4g` (Network Information API).
        effective_connection_type: Option<Cow<'a, str>> = optional(rules::one_of(CONNECTION_TYPES)),
        /// The request's `User-Agent`, at most [`rules::MAX_USER_AGENT_BYTES`].
        user_agent: Cow<'a, str> = derived(Cow::Borrowed(ctx.user_agent)),
        /// The `sample_rate` its page view was sampled at, 0 to 1, so that an aggregate can
        /// weight each row by its inverse: the rate the script drew at (contract v4), as the
        /// site stage settles it against the site ([`super::site`], [`crate::sampling`]).
        /// Rows of layout 1 without it read as 1 (every page view was sent then).
        #[serde(default = "every_page_view")]
        sample_rate: f64 = settled(rules::rate),
    }

    layout 3 {
        /// When the page view started, seconds since the Unix epoch: the time the partition and
        /// the sorting key's day derive from, the same for every send of one page view
        /// ([`filing::page_view_at`]).
        #[serde(default)]
        page_view_at: DateTime = derived(filing::page_view_at(&id, ts.sent().copied(), ctx.received_at_ms)),
        /// `mobile`, `tablet`, `desktop`, `bot` or `unknown`, from the user agent
        /// ([`crate::useragent`]).
        #[serde(default)]
        device_type: Label<'a> = derived(Label(Cow::Borrowed(ctx.agent.device_type))),
        /// Browser family from the user agent (`Chrome`, `Mobile Safari`, `Firefox`, ...).
        #[serde(default)]
        browser: Label<'a> = derived(Label(Cow::Borrowed(&ctx.agent.browser))),
        /// The browser's major version, digits; empty when unknown.
        #[serde(default)]
        browser_version: Label<'a> = derived(Label(Cow::Borrowed(&ctx.agent.browser_version))),
        /// OS family from the user agent (`Windows`, `iOS`, `Android`, ...).
        #[serde(default)]
        os: Label<'a> = derived(Label(Cow::Borrowed(&ctx.agent.os))),
    }

    layout 4 {
        /// A CSS selector of the LCP element (contract v3): tag names, ids and classes only, at
        /// most [`rules::MAX_SELECTOR_BYTES`].
        #[serde(default)]
        lcp_target: Option<Cow<'a, str>> = optional(rules::selector),
        /// A CSS selector of the slowest interaction's target.
        #[serde(default)]
        inp_target: Option<Cow<'a, str>> = optional(rules::selector),
        /// A CSS selector of the largest layout shift's source.
        #[serde(default)]
        cls_target: Option<Cow<'a, str>> = optional(rules::selector),
        /// The LCP element's resource: scheme, host, port and masked path (contract v4 §2).
        #[serde(default)]
        lcp_url: Option<Cow<'a, str>> = optional(rules::resource_url),
        /// LCP part: from TTFB to the LCP resource's request start, milliseconds, 0 to `lcp_ms`.
        #[serde(default)]
        lcp_resource_load_delay_ms: Option<f64> = optional(rules::part_of(&lcp_ms, MAX_MS)),
        /// LCP part: the LCP resource's load, milliseconds, 0 to `lcp_ms`.
        #[serde(default)]
        lcp_resource_load_duration_ms: Option<f64> = optional(rules::part_of(&lcp_ms, MAX_MS)),
        /// LCP part: from the resource's end to the paint, milliseconds, 0 to `lcp_ms`.
        #[serde(default)]
        lcp_element_render_delay_ms: Option<f64> = optional(rules::part_of(&lcp_ms, MAX_MS)),
        /// `pointer` or `keyboard`: the slowest interaction's kind.
        #[serde(default)]
        inp_type: Option<Cow<'a, str>> = optional(rules::one_of(INP_TYPES)),
        /// INP phase: input delay, milliseconds, 0 to `inp_ms`.
        #[serde(default)]
        inp_input_delay_ms: Option<f64> = optional(rules::part_of(&inp_ms, MAX_MS)),
        /// INP phase: processing duration, milliseconds, 0 to `inp_ms`.
        #[serde(default)]
        inp_processing_duration_ms: Option<f64> = optional(rules::part_of(&inp_ms, MAX_MS)),
        /// INP phase: presentation delay, milliseconds, 0 to `inp_ms`.
        #[serde(default)]
        inp_presentation_delay_ms: Option<f64> = optional(rules::part_of(&inp_ms, MAX_MS)),
        /// The script that ran longest in the slowest interaction's long animation frames:
        /// scheme, host, port and masked path (contract v4 §2).
        #[serde(default)]
        inp_script_url: Option<Cow<'a, str>> = optional(rules::resource_url),
        /// Start time of the largest layout shift, milliseconds, 0 to 3,600,000.
        #[serde(default)]
        cls_time_ms: Option<f64> = optional(rules::ms),
        /// Value of the largest layout shift, 0 to `cls`.
        #[serde(default)]
        cls_value: Option<f64> = optional(rules::part_of(&cls, MAX_CLS)),
    }

    layout 5 {
        /// The client's country (contract v4): ISO 3166-1 alpha-2 from `COLLECTOR_GEO_DB`;
        /// empty without a database, for an address it does not list, and for private and
        /// loopback addresses. The address itself is never stored.
        #[serde(default)]
        country: Label<'a> = derived(Label(Cow::Borrowed(ctx.country))),
    }

    layout 6 {
        /// The names of the page's Server-Timing entries, at most 10, each 1 to 64 bytes
        /// (contract v4); rows of earlier layouts: empty.
        #[serde(default)]
        server_timing_name: Vec<Cow<'a, str>> = derived(timing::column(&server_timing, timing::stored_name)),
        /// Their durations, milliseconds, 0 to 3,600,000 (0 when not sent), in the same order.
        #[serde(default)]
        server_timing_dur: Vec<f64> = derived(timing::column(&server_timing, |t| t.dur)),
        /// Their descriptions, at most 64 bytes (empty when not sent), in the same order.
        #[serde(default)]
        server_timing_desc: Vec<Cow<'a, str>> = derived(timing::column(&server_timing, timing::stored_desc)),
        /// `hit`, `miss`, `stale`, `pass` or empty: the CDN's cache status from the first
        /// Server-Timing entry `cdn-cache` or `cfCacheStatus` ([`timing::cdn_cache`]).
        #[serde(default)]
        cdn_cache: Label<'a> = derived(timing::cdn_cache(&server_timing)),
        /// The names of the dimensions stored, at most 5, each declared by the site
        /// (`--dimension`), in byte order: the site stage keeps the declared ones of those sent
        /// ([`dimensions::settle`]).
        #[serde(default)]
        dimension_names: Vec<Cow<'a, str>> = site(),
        /// Their values, at most 64 bytes, masked as a URL's path; per site, name and UTC day
        /// a collector keeps the 100 seen most often, the others `(other)` (contract v5 §2,
        /// [`dimensions::DistinctValues`]).
        #[serde(default)]
        dimension_values: Vec<Cow<'a, str>> = site(),
        /// The page group (contract v4): the name of the site's first page-group rule the
        /// minimised path matches, else the path with its variable parts as `*`
        /// ([`super::page_groups`]); set by the site stage ([`super::site`]). Rows of earlier
        /// layouts: empty.
        #[serde(default)]
        page_group: Label<'a> = site(),
    }
}

/// The `sample_rate` of a row that has none (layout 1): every page view was sent.
fn every_page_view() -> f64 {
    1.0
}

//! Rows at rest held to today's rules (contract v5 §5): what an earlier release left in a spool
//! folder (segments of an earlier layout, kept-aside files, `damaged-*.seg` copies) is
//! minimised as intake minimises a measurement now, with its site's settings, and the rows of a
//! purged site are dropped. The spool calls [`SiteRules::frame`] and [`SiteRules::kept_aside`]
//! through [`crate::spool::AtRest`]; it never reads a row itself.
//!
//! Every stored string is held to the §2 rules ([`minimise_row`]): the `url`
//! and `referrer` as the site keeps them ([`super::minimise::urls`]), the resource URLs to
//! their masked path, the selectors and the page group masked as a path, dimension values and
//! Server-Timing names masked on their decoded text, a Server-Timing description kept for a
//! cache entry only, and the user agent's addresses and tokens masked. Masking what is already
//! masked changes nothing, so a row written by this release comes back byte for byte, and a
//! file rewritten once is left alone the next time.
//!
//! A site the settings do not know (deleted, or the store unreachable with no snapshot) is
//! minimised as strictly as the rules allow: no query parameter kept, a referrer from another
//! host its origin only ("a shop may see more masked than these rules require, never less").

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use super::column::Label;
use super::minimise::{mask_agent, mask_text, resource_url};
use super::rules::normalise_url;
use super::timing::CACHE_ENTRIES;
use super::{encode, layouts, Measurement};
use crate::spool::{AtRest, KeptAside, Record};

/// What a site keeps of a URL: its `--keep-query` patterns and its allowed origins (whose
/// hosts count as the same site for a referrer).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keeps {
    /// The query parameters it keeps (names, or prefixes ending in `*`).
    pub keep_query: Vec<String>,
    /// Its allowed origins, `scheme://host[:port]`.
    pub origins: Vec<String>,
}

/// The sites' settings as the rules at rest need them: what each keeps, and which are purged.
#[derive(Debug, Default)]
pub struct SiteRules {
    sites: HashMap<String, Keeps>,
    purged: HashSet<String>,
    /// Rows dropped so far per purged site (the passes run on several threads).
    dropped: Mutex<HashMap<String, u64>>,
}

/// The columns [`minimise_row`] may change: the only ones a kept-aside row is
/// rewritten in (the others keep their text as it was written).
const MINIMISED: [&str; 12] = [
    "url",
    "referrer",
    "user_agent",
    "lcp_url",
    "inp_script_url",
    "lcp_target",
    "inp_target",
    "cls_target",
    "page_group",
    "dimension_values",
    "server_timing_name",
    "server_timing_desc",
];

/// What a site the settings do not know keeps: nothing of a query, no other host.
static STRICT: Keeps = Keeps {
    keep_query: Vec::new(),
    origins: Vec::new(),
};

impl SiteRules {
    /// The rules for `sites` (key, what it keeps, whether it is purged).
    pub fn new(sites: impl IntoIterator<Item = (String, Keeps, bool)>) -> SiteRules {
        let mut rules = SiteRules::default();
        for (key, keeps, purged) in sites {
            if purged {
                rules.purged.insert(key.clone());
            }
            rules.sites.insert(key, keeps);
        }
        rules
    }

    /// What `site` keeps; the strictest for a site these rules do not know.
    pub fn keeps(&self, site: &str) -> &Keeps {
        self.sites.get(site).unwrap_or(&STRICT)
    }

    /// Whether `site` is purged: its rows are dropped.
    pub fn is_purged(&self, site: &str) -> bool {
        self.purged.contains(site)
    }

    /// The keys of the purged sites.
    pub fn purged(&self) -> impl Iterator<Item = &str> {
        self.purged.iter().map(String::as_str)
    }

    /// How many rows of `site` these rules have dropped so far.
    pub fn dropped_of(&self, site: &str) -> u64 {
        let dropped = self.dropped.lock().unwrap_or_else(|e| e.into_inner());
        dropped.get(site).copied().unwrap_or(0)
    }

    /// Whether a row of `site` is dropped (its site is purged); counts it if so.
    fn drops(&self, site: &str) -> bool {
        if !self.is_purged(site) {
            return false;
        }
        let mut dropped = self.dropped.lock().unwrap_or_else(|e| e.into_inner());
        *dropped.entry(site.to_owned()).or_default() += 1;
        true
    }

    /// `m` held to the rules: minimised with its site's settings.
    pub fn minimise(&self, m: &mut Measurement<'_>) {
        let keeps = self.keeps(&m.site);
        minimise_row(m, &keeps.keep_query, &keeps.origins);
    }

    /// The rows of a spool frame of `layout` as intake would write them today: a record of the
    /// current layout, every row minimised ([`SiteRules::minimise`]), the rows of purged sites
    /// left out (a record of 0 rows when none is left); `None` when `payload` does not hold
    /// whole rows of `layout`.
    pub fn frame(&self, layout: u16, payload: &[u8]) -> Option<Record> {
        let mut rows = layouts::read_record(layout, payload).ok()?;
        rows.retain(|m| !self.drops(&m.site));
        for m in &mut rows {
            self.minimise(m);
        }
        Some(encode(&rows))
    }

    /// A kept-aside file's body (`{"reason", "measurements": [rows as JSON]}`, written by
    /// [`super::kept_aside_json`] or by an earlier release, whose rows lack later columns)
    /// held to the rules: each row's columns minimised where they are present (no column is
    /// added), the rows of purged sites dropped. A body that is not such a file (an undecodable
    /// batch kept as hexadecimal, which holds no row the rules can read) is left as it is.
    pub fn kept_aside(&self, body: &[u8]) -> KeptAside {
        let Ok(mut file) = serde_json::from_slice::<serde_json::Value>(body) else {
            return KeptAside::unread();
        };
        let Some(rows) = file
            .get_mut("measurements")
            .and_then(serde_json::Value::as_array_mut)
        else {
            return KeptAside::unread();
        };
        let before = rows.len();
        rows.retain(|r| !r["site"].as_str().is_some_and(|s| self.drops(s)));
        let dropped = before - rows.len();
        let mut changed = dropped > 0;
        for row in rows.iter_mut() {
            changed |= self.minimise_json(row);
        }
        let left = rows.len();
        KeptAside {
            body: changed.then(|| serde_json::to_vec_pretty(&file).unwrap_or_default()),
            rows_left: left,
            rows_dropped: dropped,
        }
    }

    /// Minimises one kept-aside row in place, only the columns it holds; whether it changed.
    /// A row that does not read as a measurement is left as it is.
    fn minimise_json(&self, row: &mut serde_json::Value) -> bool {
        let Ok(mut m) = serde_json::from_value::<Measurement<'static>>(row.clone()) else {
            return false;
        };
        self.minimise(&mut m);
        let Ok(serde_json::Value::Object(minimised)) = serde_json::to_value(&m) else {
            return false;
        };
        let Some(columns) = row.as_object_mut() else {
            return false;
        };
        let mut changed = false;
        for (name, value) in columns.iter_mut() {
            if !MINIMISED.contains(&name.as_str()) {
                continue;
            }
            if let Some(new) = minimised.get(name) {
                if new != value {
                    *value = new.clone();
                    changed = true;
                }
            }
        }
        changed
    }
}

impl AtRest for SiteRules {
    fn frame(&self, layout: u16, payload: &[u8]) -> Option<Record> {
        SiteRules::frame(self, layout, payload)
    }

    fn kept_aside(&self, body: &[u8]) -> KeptAside {
        SiteRules::kept_aside(self, body)
    }
}

/// Holds a stored row to the §2 rules (contract v5), as intake stores a measurement now:
/// `url` and `referrer` as the site keeps them (`keep`, `origins`: see
/// [`super::minimise::urls`]), `lcp_url` and `inp_script_url` as resource URLs, the page
/// group masked as a path, selectors, dimension values and Server-Timing names masked on
/// their decoded text, a Server-Timing description kept for a cache entry only,
/// and the user agent with its addresses and tokens masked. Idempotent.
pub fn minimise_row(row: &mut Measurement<'_>, keep: &[String], origins: &[String]) {
    normalise_stored_urls(row);
    super::minimise::urls(&mut row.url, &mut row.referrer, keep, origins);
    for url in [&mut row.lcp_url, &mut row.inp_script_url]
        .into_iter()
        .flatten()
    {
        if let Some(minimised) = resource_url(url) {
            set(url, Cow::Owned(minimised));
        }
    }
    for selector in [
        &mut row.lcp_target,
        &mut row.inp_target,
        &mut row.cls_target,
    ]
    .into_iter()
    .flatten()
    {
        // On its decoded text too, as intake masks a selector ([`super::rules::selector`]).
        let masked = mask_text(selector).into_owned();
        set(selector, Cow::Owned(masked));
    }
    // On its decoded text too: an old row's page group came from its path unminimised.
    let page_group = mask_text(&row.page_group.0).into_owned();
    if page_group != *row.page_group.0 {
        row.page_group = Label(Cow::Owned(page_group));
    }
    for value in row
        .dimension_values
        .iter_mut()
        .chain(row.server_timing_name.iter_mut())
    {
        let masked = mask_text(value).into_owned();
        set(value, Cow::Owned(masked));
    }
    for (name, desc) in row
        .server_timing_name
        .iter()
        .zip(row.server_timing_desc.iter_mut())
    {
        let kept = if CACHE_ENTRIES.contains(&name.as_ref()) {
            mask_text(desc).into_owned()
        } else {
            String::new()
        };
        set(desc, Cow::Owned(kept));
    }
    let agent = mask_agent(&row.user_agent).into_owned();
    set(&mut row.user_agent, Cow::Owned(agent));
}

/// A stored row's URLs as the `url` rule writes them ([`normalise_url`]) before they are
/// minimised, which reads a URL by position and so takes only what that rule writes: the
/// first release stored `referrer` and the resource URLs as sent, and a `\` or a space in such
/// a text would otherwise be read as part of its host and kept whole (found by an adversarial
/// review, issue 53). A referrer or resource URL the rule does not take (not http(s), no host)
/// is dropped, as intake drops it; a page `url` the rule does not take is written as the `url`
/// crate parses it, or left as it is when it does not parse (it is required: never dropped).
/// A URL already normalised is left unchanged, so minimising stays idempotent.
fn normalise_stored_urls(row: &mut Measurement<'_>) {
    match normalise_url(&row.url) {
        Some(url) => set(&mut row.url, Cow::Owned(url)),
        None => {
            if let Ok(url) = url::Url::parse(&row.url) {
                set(&mut row.url, Cow::Owned(url.into()));
            }
        }
    }
    for slot in [&mut row.referrer, &mut row.lcp_url, &mut row.inp_script_url] {
        if let Some(url) = slot.as_deref() {
            match normalise_url(url) {
                Some(normalised) => set(slot.as_mut().expect("held"), Cow::Owned(normalised)),
                None => *slot = None,
            }
        }
    }
}

/// Replaces `slot` with `value` when they differ (a borrowed slot stays borrowed otherwise).
fn set<'a>(slot: &mut Cow<'a, str>, value: Cow<'a, str>) {
    if *slot != value {
        *slot = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measurement::tests::{encoded_in, sample, without_attribution};
    use crate::measurement::{decode_all, kept_aside_json, LAYOUT};

    const SECRET: &str = "Ab3dE5f9Gh2JkL2mN0pQ7rS";

    fn rules() -> SiteRules {
        SiteRules::new([
            (
                "shop-1".to_owned(),
                Keeps {
                    keep_query: vec!["utm_*".into()],
                    origins: vec!["https://shop.example".into()],
                },
                false,
            ),
            ("gone".to_owned(), Keeps::default(), true),
        ])
    }

    /// A row as a release before v4 stored it: a token and an address everywhere.
    fn leaky(n: u128) -> Measurement<'static> {
        let mut m = sample(n);
        m.url = format!(
            "https://shop.example/reset/{SECRET}?token={SECRET}&utm_source=news&q=jane@example.com"
        )
        .into();
        m.referrer = Some(format!("https://mail.example/inbox/{SECRET}?u=jane@example.com").into());
        m.user_agent = "Mozilla/5.0 jane@example.com Chrome/131.0.6778.135".into();
        m.lcp_url = Some(format!("https://cdn.example/{SECRET}.jpg?sig={SECRET}").into());
        m.lcp_target = Some(format!("#order-{SECRET}").into());
        m.dimension_values = vec!["jane%40example.com".into()];
        m.dimension_names = vec!["variant".into()];
        m.server_timing_name = vec!["cdn-cache".into(), "db".into()];
        m.server_timing_desc = vec!["HIT".into(), format!("session={SECRET}").into()];
        m
    }

    /// The first release stored a referrer and a resource URL as sent. Minimising reads a URL
    /// by position, so a stored one is normalised first: a `\` is a `/` and a space breaks the
    /// host, as the `url` crate reads them (found by an adversarial review, issue 53).
    #[test]
    fn a_first_release_referrer_is_normalised_before_it_is_minimised() {
        let card = "4111111111111111";
        for (referrer, stored) in [
            (
                format!(r"https://mail.example\inbox\{card}"),
                Some("https://mail.example"),
            ),
            (
                format!(r"https://shop.example\account\{card}"),
                Some("https://shop.example/account/*"),
            ),
            (format!("https://mail.example {card}"), None),
            ("android-app://com.google.android.gm/".to_owned(), None),
            (
                format!("https://jane:pw@shop.example/cb#access_token={SECRET}"),
                Some("https://shop.example/cb"),
            ),
            (
                "HTTPS://Shop.Example:443/a?utm_x=1".to_owned(),
                Some("https://shop.example/a?utm_x=1"),
            ),
        ] {
            let mut m = leaky(7);
            m.referrer = Some(referrer.clone().into());
            m.lcp_url = Some(format!(r"https://cdn.example\img\{card}.jpg").into());
            rules().minimise(&mut m);
            assert_eq!(m.referrer.as_deref(), stored, "{referrer}");
            assert_eq!(m.lcp_url.as_deref(), Some("https://cdn.example/img/*.jpg"));
            // And through an earlier layout's frame, as the spool reads one.
            let mut m = leaky(8);
            m.referrer = Some(referrer.clone().into());
            let payload = serde_json::to_vec(&vec![m]).unwrap();
            let record = rules().frame(1, &payload).expect("layout 1 reads");
            let rows = decode_all(&record.payload).unwrap();
            assert_eq!(rows[0].referrer.as_deref(), stored, "{referrer}");
            assert!(!String::from_utf8_lossy(&record.payload).contains(card));
        }
    }

    #[test]
    fn a_leaky_row_is_minimised_with_its_sites_settings_and_then_stays() {
        let mut m = leaky(1);
        rules().minimise(&mut m);
        assert_eq!(m.url, "https://shop.example/reset/*?utm_source=news");
        assert_eq!(m.referrer.as_deref(), Some("https://mail.example"));
        assert_eq!(m.user_agent, "Mozilla/5.0 * Chrome/131.0.6778.135");
        assert_eq!(m.lcp_url.as_deref(), Some("https://cdn.example/*"));
        assert_eq!(m.lcp_target.as_deref(), Some("#*"));
        assert_eq!(m.dimension_values, vec!["*"]);
        assert_eq!(m.server_timing_desc, vec!["HIT", ""]);
        let once = m.clone();
        rules().minimise(&mut m);
        assert_eq!(m, once, "idempotent");
    }

    /// Intake masks a selector on its decoded text (contract v5 §2): so does `migrate`.
    #[test]
    fn a_selectors_encoded_secret_is_masked_as_at_intake() {
        let mut m = leaky(3);
        m.lcp_target = Some("#u-jane%40example.com".into());
        m.inp_target = Some("button#o-4111%2D1111%2D1111%2D1111".into());
        m.cls_target = Some("div.a%2540b".into());
        rules().minimise(&mut m);
        assert_eq!(m.lcp_target.as_deref(), Some("#*"));
        assert_eq!(m.inp_target.as_deref(), Some("button#o-*"));
        assert_eq!(
            m.cls_target.as_deref(),
            Some("div.a%2540b"),
            "nothing to hide"
        );
    }

    #[test]
    fn an_unknown_site_keeps_no_query_and_no_other_host() {
        let mut m = leaky(2);
        m.site = "unknown".into();
        rules().minimise(&mut m);
        assert_eq!(m.url, "https://shop.example/reset/*");
    }

    /// A frame of layout 3 (before v4) becomes a minimised record of the current layout; the
    /// rows of a purged site go.
    #[test]
    fn an_earlier_frame_is_upgraded_minimised_and_purged() {
        let keep = without_attribution(leaky(3));
        let mut gone = without_attribution(leaky(4));
        gone.site = "gone".into();
        let mut payload = encoded_in(&keep, 3);
        payload.extend(encoded_in(&gone, 3));
        let record = rules().frame(3, &payload).unwrap();
        assert_eq!((record.layout, record.rows), (LAYOUT, 1));
        let rows = decode_all(&record.payload).unwrap();
        assert_eq!(rows[0].id, keep.id);
        assert!(!String::from_utf8_lossy(&record.payload).contains(SECRET));
        assert_eq!(rules().frame(3, &payload[..payload.len() - 1]), None);
    }

    #[test]
    fn a_kept_aside_file_is_minimised_in_place_and_a_purged_sites_rows_go() {
        let mut gone = leaky(6);
        gone.site = "gone".into();
        let mut rows = Vec::new();
        for m in [leaky(5), gone] {
            m.encode(&mut rows);
        }
        let (body, _) = kept_aside_json(&rows, "refused");
        let held = rules().kept_aside(&body);
        assert_eq!((held.rows_left, held.rows_dropped), (1, 1));
        let minimised = held.body.expect("changed");
        assert!(!String::from_utf8_lossy(&minimised).contains(SECRET));
        let again = rules().kept_aside(&minimised);
        assert_eq!((again.body, again.rows_left), (None, 1), "left alone");
        // A file of an earlier release: fewer columns, none added.
        let old = r#"{"reason":"r","measurements":[{"id":"7f1c2a3e-9b4d-4c6e-8f00-123456789abc","site":"shop-1","received_at":1780000000,"url":"https://shop.example/a?email=jane@example.com","user_agent":"UA"}]}"#;
        let held = rules().kept_aside(old.as_bytes());
        let v: serde_json::Value = serde_json::from_slice(&held.body.unwrap()).unwrap();
        let row = v["measurements"][0].as_object().unwrap();
        assert_eq!(row["url"], "https://shop.example/a");
        assert_eq!(row.len(), 5, "{row:?}");
        assert_eq!(rules().kept_aside(b"not json").body, None);
    }
}

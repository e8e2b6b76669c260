//! The site stage: a measurement judged without any site ([`super::Judged`], from
//! [`super::judge`]) meets its site's rules and becomes the row that is stored
//! ([`Measurement`]), in one call ([`settle`]):
//!
//! - its `url` and `referrer` minimised as the site keeps them ([`super::minimise::urls`],
//!   contract v4 §2; before anything reaches disk);
//! - its page group from the site's compiled rules, on the minimised URL
//!   ([`super::page_groups`]);
//! - of the dimensions sent, the ones the site declared ([`super::dimensions::settle`]; the
//!   others listed as dropped fields);
//! - its `sample_rate`: the rate sent, as the sampler settles it against the site's
//!   ([`crate::sampling::Sampler::settle`]).
//!
//! The columns only this stage sets are [`SiteColumns`]; the field table marks them `site()`
//! and `settled(...)` ([`super::fields`]).

use std::borrow::Cow;

use super::column::Label;
use super::dimensions::{self, DistinctValues};
use super::page_groups::PageGroups;
use super::{minimise, Judged, Measurement};
use crate::sampling::Sampler;

/// The columns of a row only the site stage sets: the `site()` and `settled(...)` entries of
/// the field table, by name ([`Judged::into_row`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SiteColumns<'a> {
    /// [`Measurement::sample_rate`].
    pub sample_rate: f64,
    /// [`Measurement::dimension_names`].
    pub dimension_names: Vec<Cow<'a, str>>,
    /// [`Measurement::dimension_values`].
    pub dimension_values: Vec<Cow<'a, str>>,
    /// [`Measurement::page_group`].
    pub page_group: Label<'a>,
}

/// A site's rules, as the site stage reads them (from its settings, `collector sites`).
pub struct SiteRules<'s> {
    /// The site key.
    pub key: &'s str,
    /// The query parameters it keeps (`--keep-query`: names, or prefixes ending in `*`).
    pub keep_query: &'s [String],
    /// Its allowed origins, `scheme://host[:port]`.
    pub origins: &'s [String],
    /// Its page-group rules, compiled.
    pub page_groups: &'s PageGroups,
    /// The dimension names it declared (`--dimension`).
    pub dimensions: &'s [String],
    /// Its configured sample rate, 0 to 1.
    pub sample_rate: f64,
    /// The sample rates of sites over their budget.
    pub sampler: &'s Sampler,
    /// The distinct dimension values stored per site, name and UTC day.
    pub distinct: &'s DistinctValues,
}

/// The row a judged measurement becomes under its site's rules (see the module doc), and the
/// dimensions dropped, each as `dimensions.NAME`.
pub fn settle<'a>(mut judged: Judged<'a>, site: &SiteRules<'_>) -> (Measurement<'a>, Vec<String>) {
    minimise::urls(
        &mut judged.url,
        &mut judged.referrer,
        site.keep_query,
        site.origins,
    );
    let page_group = Label(Cow::Owned(site.page_groups.group_of(&judged.url)));
    let day = judged.received_at.0 / 86_400;
    let sent = judged.dimensions.take().unwrap_or_default();
    let dims = dimensions::settle(sent, site.dimensions, site.distinct, site.key, day);
    let sample_rate = site
        .sampler
        .settle(site.key, site.sample_rate, judged.sample_rate);
    let row = judged.into_row(SiteColumns {
        sample_rate,
        dimension_names: dims.names,
        dimension_values: dims.values,
        page_group,
    });
    (row, dims.dropped)
}

//! Beacon decoding and validation: request body bytes in, validated measurements out.
//!
//! Pure functions with no I/O, so every rule of the contract (§2, `POST /api/v1/measurements`)
//! is unit-tested here:
//! - [`media`]: the content type and coding, and gzip inflated with the [`MAX_BODY_BYTES`]
//!   limit enforced while inflating, so a gzip bomb costs at most that much memory;
//! - [`decode`]: the body as `JSON.parse` reads it, one object or an array of at most
//!   [`MAX_BATCH`], each field kept undecoded so that a fault inside one value (beyond f64, a
//!   lone surrogate) costs only that field;
//! - [`validate`]: each object judged by the field table's rules ([`crate::measurement`]): a
//!   missing or invalid required field rejects that measurement; an invalid optional field is
//!   dropped and listed, and the rest of the measurement is kept.

pub mod decode;
pub mod media;

pub use decode::{parse, text, Item};
pub use media::{content_type_ok, encoding, inflate, Encoding};

pub use crate::measurement::rules::{is_site_key, normalise_url, MAX_USER_AGENT_BYTES};
use crate::measurement::{judge, rules::truncate};
pub use crate::measurement::{Context, Judged, Rejection};

/// Largest accepted body, in bytes, after decompression (contract §2: 64 KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most measurements in one array body (contract §2).
pub const MAX_BATCH: usize = 50;

/// Why a body could not be decoded at all. Each maps to one HTTP status in `error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// More than [`MAX_BODY_BYTES`] (after inflating): 413.
    #[error("body larger than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    /// Broken JSON syntax, empty, trailing bytes, broken gzip, more than [`MAX_BATCH`]: 400.
    #[error("{0}")]
    Malformed(String),
}

/// The rejection of a measurement whose site is not registered or is disabled.
pub const UNKNOWN_SITE: Rejection = "unknown or disabled site";
/// The rejection of a measurement whose `url` host is not the host of one of its site's
/// origins, when the site lists origins (contract v4 §2).
pub const URL_NOT_ALLOWED: Rejection = "url_not_allowed";
/// The reason counted for each measurement of a request answered 503 because its site lives
/// on a shard this collector does not know (contract v5 §3); nothing of the request is stored.
pub const UNKNOWN_SHARD: Rejection = "unknown_shard";

/// Every [`Rejection`] intake can give: the `reason` values of
/// `collector_measurements_rejected_total`, each exported from the start at 0. In order: an
/// array item that is not an object, each required field missing or invalid (in table order:
/// `missing id`, `invalid id`, ...), an unknown site, and a page not on its site's origins.
pub fn rejection_reasons() -> impl Iterator<Item = Rejection> {
    std::iter::once(decode::NOT_AN_OBJECT)
        .chain(crate::measurement::field_rejections())
        .chain([UNKNOWN_SITE, URL_NOT_ALLOWED, UNKNOWN_SHARD])
}

/// Validates one body element against the field rules of the contract (§2), as the field
/// table declares them ([`crate::measurement::judge`]), knowing no site.
///
/// Errors (rejections): `not a measurement object`, and a required field missing or invalid
/// (`missing id`, `invalid id`, `missing site`, `invalid site`, `missing url`, `invalid url`).
pub fn validate<'a>(item: Item<'a>, ctx: &Context<'a>) -> Result<Judged<'a>, Rejection> {
    judge(item?, ctx)
}

/// The user agent as stored (contract §2): the `User-Agent` header's bytes as UTF-8, an invalid
/// byte replaced by U+FFFD, with e-mail addresses and tokens masked but not its numbers (v5,
/// [`crate::measurement::minimise::mask_agent`]), cut at [`MAX_USER_AGENT_BYTES`] on a
/// character boundary; empty without the header.
pub fn user_agent(header: Option<&[u8]>) -> String {
    let Some(bytes) = header else {
        return String::new();
    };
    // Masked before it is cut, so that no part of an address or a token is left at the cut.
    // The server bounds a request's headers (16 KiB), and masking is linear.
    // Valid UTF-8 (nearly every header) is checked a word at a time, as in `decode::text`.
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    };
    let masked = crate::measurement::minimise::mask_agent(&text);
    truncate(&masked, MAX_USER_AGENT_BYTES).to_owned()
}

#[cfg(test)]
pub(crate) mod tests;

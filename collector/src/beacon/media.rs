//! What a request body is: its media type, its content coding, and the bytes after inflating.
//!
//! Media types and codings are compared as HTTP says (RFC 9110 §8.3.1, §8.4.1): names are
//! case-insensitive, parameters follow `;` with optional whitespace and may be quoted strings,
//! and `Content-Encoding` is a list of codings in the order they were applied.

use std::borrow::Cow;
use std::io::Read;

use super::{DecodeError, MAX_BODY_BYTES};

/// Content-Encoding of a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// No encoding (`identity` or absent).
    Identity,
    /// `gzip` (RFC 1952).
    Gzip,
}

/// Labels of the UTF-8 encoding in the WHATWG Encoding Standard (§4.2, "Names and labels"),
/// which browsers use for `charset`.
const UTF8_LABELS: [&str; 6] = [
    "unicode-1-1-utf-8",
    "unicode11utf8",
    "unicode20utf8",
    "utf-8",
    "utf8",
    "x-unicode20utf8",
];

/// Judges the `Content-Type` header (contract §2): `application/json`, `text/plain` (what
/// `navigator.sendBeacon` sends for a string) or none at all (an absent or empty header) are
/// accepted. Parameters are ignored except a `charset` that does not name UTF-8.
pub fn content_type_ok(value: Option<&[u8]>) -> bool {
    let Some(value) = value else { return true };
    let Ok(value) = std::str::from_utf8(value) else {
        return false;
    };
    if value.trim().is_empty() {
        return true;
    }
    let (essence, params) = value.split_once(';').unwrap_or((value, ""));
    let essence = essence.trim();
    if !essence.eq_ignore_ascii_case("application/json")
        && !essence.eq_ignore_ascii_case("text/plain")
    {
        return false;
    }
    parameters(params).all(|(name, value)| {
        !name.eq_ignore_ascii_case("charset")
            || UTF8_LABELS.iter().any(|l| value.eq_ignore_ascii_case(l))
    })
}

/// The `name=value` parameters of a media type after its essence, values unquoted (a
/// quoted-string may hold `;`). A malformed parameter is skipped, as RFC 9110 lets a
/// recipient ignore what it cannot parse.
fn parameters(mut rest: &str) -> impl Iterator<Item = (&str, Cow<'_, str>)> {
    std::iter::from_fn(move || loop {
        rest = rest.trim_start_matches([' ', '\t', ';']);
        if rest.is_empty() {
            return None;
        }
        let stop = rest.find([';', '=']).unwrap_or(rest.len());
        let name = rest[..stop].trim();
        if !rest[stop..].starts_with('=') {
            // A parameter without a value.
            rest = &rest[stop..];
            continue;
        }
        let after = rest[stop + 1..].trim_start();
        if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            value.push(escaped);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            rest = &quoted[end..];
            rest = rest.split_once(';').map_or("", |(_, r)| r);
            return Some((name, Cow::Owned(value)));
        }
        let (value, next) = after.split_once(';').unwrap_or((after, ""));
        rest = next;
        if name.is_empty() {
            continue;
        }
        return Some((name, Cow::Borrowed(value.trim())));
    })
}

/// Judges the `Content-Encoding` header, a list of codings in the order they were applied;
/// `None` for an unsupported one (415). `identity` and empty list elements are no coding;
/// `gzip` and its alias `x-gzip` (RFC 9110 §8.4.1.3) may appear once.
pub fn encoding(value: Option<&[u8]>) -> Option<Encoding> {
    let Some(value) = value else {
        return Some(Encoding::Identity);
    };
    let mut result = Encoding::Identity;
    for coding in std::str::from_utf8(value).ok()?.split(',').map(str::trim) {
        if coding.is_empty() || coding.eq_ignore_ascii_case("identity") {
            continue;
        }
        let gzip = coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip");
        if !gzip || result == Encoding::Gzip {
            return None;
        }
        result = Encoding::Gzip;
    }
    Some(result)
}

/// Inflates a body if needed, never producing more than [`MAX_BODY_BYTES`].
pub fn inflate(body: &[u8], encoding: Encoding) -> Result<Cow<'_, [u8]>, DecodeError> {
    match encoding {
        Encoding::Identity if body.len() > MAX_BODY_BYTES => Err(DecodeError::TooLarge),
        Encoding::Identity => Ok(Cow::Borrowed(body)),
        Encoding::Gzip => {
            let mut out = Vec::with_capacity((body.len() * 4).min(MAX_BODY_BYTES + 1));
            // `take` stops the decoder one byte past the limit: a bomb never inflates further.
            flate2::read::MultiGzDecoder::new(body)
                .take(MAX_BODY_BYTES as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| DecodeError::Malformed(format!("invalid gzip body: {e}")))?;
            if out.len() > MAX_BODY_BYTES {
                return Err(DecodeError::TooLarge);
            }
            Ok(Cow::Owned(out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn content_types() {
        for ok in [
            &b"application/json"[..],
            b"text/plain;charset=UTF-8",
            b"Application/JSON ; charset=utf-8",
            b"TEXT/PLAIN; Charset=\"utf8\"",
            b"application/json; foo=bar; charset=utf-8",
            b"application/json; foo=\"a;charset=latin1\"",
            b"application/json; foo; charset=utf-8",
            b"text/plain;",
            b"",
            b"   ",
        ] {
            assert!(content_type_ok(Some(ok)), "{}", String::from_utf8_lossy(ok));
        }
        assert!(content_type_ok(None));
        for bad in [
            &b"application/x-www-form-urlencoded"[..],
            b"multipart/form-data; boundary=x",
            b"text/plain; charset=iso-8859-1",
            b"application/json;charset=\"UTF-16\"",
            b"application/json; charset=utf-8; charset=latin1",
            b"text/plain; foo; charset=latin1",
            b"text/html",
            b"application/json\xff",
        ] {
            assert!(
                !content_type_ok(Some(bad)),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn content_encodings() {
        assert_eq!(encoding(None), Some(Encoding::Identity));
        assert_eq!(encoding(Some(b"")), Some(Encoding::Identity));
        assert_eq!(encoding(Some(b"IDENTITY")), Some(Encoding::Identity));
        assert_eq!(encoding(Some(b"gzip")), Some(Encoding::Gzip));
        assert_eq!(encoding(Some(b"GZip")), Some(Encoding::Gzip));
        assert_eq!(encoding(Some(b"x-gzip")), Some(Encoding::Gzip));
        assert_eq!(encoding(Some(b"identity, gzip")), Some(Encoding::Gzip));
        assert_eq!(encoding(Some(b" gzip ,")), Some(Encoding::Gzip));
        assert_eq!(encoding(Some(b"gzip, gzip")), None);
        assert_eq!(encoding(Some(b"br")), None);
        assert_eq!(encoding(Some(b"gzip, br")), None);
        assert_eq!(encoding(Some(b"deflate")), None);
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn gzip_limits() {
        let body = br#"{"id":"x"}"#;
        assert_eq!(&*inflate(&gzip(body), Encoding::Gzip).unwrap(), body);
        let bomb = gzip(&vec![b' '; 50 * 1024 * 1024]);
        assert!(bomb.len() < MAX_BODY_BYTES);
        assert_eq!(inflate(&bomb, Encoding::Gzip), Err(DecodeError::TooLarge));
        let exact = gzip(&vec![b' '; MAX_BODY_BYTES]);
        assert_eq!(
            inflate(&exact, Encoding::Gzip).unwrap().len(),
            MAX_BODY_BYTES
        );
        let full = gzip(body);
        assert!(matches!(
            inflate(&full[..full.len() - 6], Encoding::Gzip),
            Err(DecodeError::Malformed(_))
        ));
        assert!(matches!(
            inflate(b"not gzip", Encoding::Gzip),
            Err(DecodeError::Malformed(_))
        ));
        assert_eq!(
            inflate(&vec![b' '; MAX_BODY_BYTES + 1], Encoding::Identity),
            Err(DecodeError::TooLarge)
        );
    }
}

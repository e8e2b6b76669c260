//! The tracking script, held in memory with its precompressed forms.
//!
//! Compiled into the binary (`assets/script.js`); gzip and brotli forms and their ETags are
//! computed once at start, so the request path only picks bytes.

use std::io::Write;

use axum::http::HeaderValue;
use bytes::Bytes;
use sha2::{Digest, Sha256};

/// The script compiled into the binary.
pub const BUILTIN: &str = include_str!("../assets/script.js");

/// One encoding of the script.
#[derive(Debug, Clone)]
pub struct Variant {
    /// `Content-Encoding` value; `None` for the identity form.
    pub encoding: Option<&'static str>,
    /// The bytes sent.
    pub body: Bytes,
    /// Strong ETag of this representation: `"<first 16 bytes of SHA-256 of the source,
    /// hex>[-gz|-br]"` (a strong validator differs between encodings, RFC 9110 §8.8.3).
    pub etag: HeaderValue,
}

/// The tracking script in every encoding served.
#[derive(Debug, Clone)]
pub struct Script {
    /// Uncompressed.
    pub identity: Variant,
    /// gzip (RFC 1952) at the best level.
    pub gzip: Variant,
    /// brotli (RFC 7932) at quality 11.
    pub brotli: Variant,
}

impl Script {
    /// Precompresses `source`.
    pub fn new(source: &[u8]) -> Script {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(source).expect("in-memory write");
        let gzip = gz.finish().expect("in-memory write");
        let mut brotli = Vec::new();
        {
            let mut w = brotli::CompressorWriter::new(&mut brotli, 4096, 11, 22);
            w.write_all(source).expect("in-memory write");
        }
        let version = hex::encode(&Sha256::digest(source)[..16]);
        let etag = |suffix: &str| {
            HeaderValue::from_str(&format!("\"{version}{suffix}\"")).expect("hex is a valid header")
        };
        Script {
            identity: Variant {
                encoding: None,
                body: Bytes::copy_from_slice(source),
                etag: etag(""),
            },
            gzip: Variant {
                encoding: Some("gzip"),
                body: Bytes::from(gzip),
                etag: etag("-gz"),
            },
            brotli: Variant {
                encoding: Some("br"),
                body: Bytes::from(brotli),
                etag: etag("-br"),
            },
        }
    }
}

impl Default for Script {
    fn default() -> Self {
        Script::new(BUILTIN.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn encodings_round_trip() {
        let s = Script::default();
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&s.gzip.body[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, s.identity.body);
        let mut out = Vec::new();
        brotli::Decompressor::new(&s.brotli.body[..], 4096)
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, s.identity.body);
    }

    /// The stated bound (README, "The tracking script"): under 2 KiB gzipped.
    #[test]
    fn script_is_under_two_kib_gzipped() {
        let s = Script::default();
        assert!(
            s.gzip.body.len() <= 2048,
            "{} bytes gzipped",
            s.gzip.body.len()
        );
    }

    #[test]
    fn etags_differ_by_encoding_and_version() {
        let s = Script::default();
        assert_eq!(s.identity.etag.len(), 34);
        assert_ne!(s.identity.etag, s.gzip.etag);
        assert_ne!(s.gzip.etag, s.brotli.etag);
        assert_ne!(s.identity.etag, s.brotli.etag);
        assert_ne!(
            Script::new(b"a").identity.etag,
            Script::new(b"b").identity.etag
        );
    }
}

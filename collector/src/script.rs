//! The tracking script, held in memory with its precompressed forms.
//!
//! Compiled into the binary (`assets/script.js`); the served form (without its comment lines
//! and indentation, [`served`]), its gzip and brotli forms and their ETags are computed once
//! at start, so the request path only picks bytes.

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
        Script::new(served(BUILTIN).as_bytes())
    }
}

/// The script as served: the source without the lines that hold only a comment and without
/// indentation, every line break kept. The source explains itself in comments; browsers need
/// none of it, and it is a sixth of the gzipped bytes. Safe for a script without template
/// literals or line continuations (a unit test checks ours has none), since a line break
/// outside them never lies inside a token, so neither the tokens nor automatic semicolon
/// insertion change. Comments after code on the same line are kept: telling `//` in a
/// string or a regular expression from a comment needs a JavaScript tokenizer.
pub fn served(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        let line = line.trim_start();
        // A `/* */` comment is the whole line when its first `*/` ends the line.
        let comment_only = line.starts_with("//")
            || (line.starts_with("/*")
                && line.len() >= 4
                && line.find("*/") == Some(line.len() - 2));
        if line.is_empty() || comment_only {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
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

    #[test]
    fn served_form_drops_only_comment_lines_and_indentation() {
        let source = "/* head */\n(function () {\n  // why\n  var a = 'http://x'; // kept\n\n  /* a */ var b = 1;\n})();\n";
        assert_eq!(
            served(source),
            "(function () {\nvar a = 'http://x'; // kept\n/* a */ var b = 1;\n})();\n"
        );
        // What would make dropping line starts unsafe is absent from the script.
        assert!(!BUILTIN.contains('`'), "no template literals");
        assert!(
            BUILTIN.lines().all(|l| !l.trim_end().ends_with('\\')),
            "no line continuations"
        );
        assert!(BUILTIN.len() > served(BUILTIN).len());
    }

    /// The stated bound (docs/script.md, "The tracking script"): under 4 KiB gzipped.
    #[test]
    fn script_is_under_four_kib_gzipped() {
        let s = Script::default();
        assert!(
            s.gzip.body.len() <= 4096,
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

//! The tracking script, held in memory with its precompressed forms.
//!
//! Compiled into the binary (`assets/script.js`), optionally replaced by a file at start;
//! gzip and brotli forms and a strong ETag (SHA-256 of the source) are computed once, so the
//! request path only picks bytes.

use std::io::Write;

use bytes::Bytes;
use sha2::{Digest, Sha256};

/// The script compiled into the binary.
pub const BUILTIN: &str = include_str!("../assets/script.js");

/// The tracking script in every encoding served.
#[derive(Debug, Clone)]
pub struct Script {
    /// Uncompressed source.
    pub identity: Bytes,
    /// gzip (RFC 1952) at the best level.
    pub gzip: Bytes,
    /// brotli (RFC 7932) at quality 11.
    pub brotli: Bytes,
    /// Strong ETag, quoted: `"<first 16 bytes of SHA-256, hex>"`.
    pub etag: String,
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
        let digest = Sha256::digest(source);
        Script {
            identity: Bytes::copy_from_slice(source),
            gzip: Bytes::from(gzip),
            brotli: Bytes::from(brotli),
            etag: format!("\"{}\"", hex::encode(&digest[..16])),
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
        flate2::read::GzDecoder::new(&s.gzip[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, s.identity);
        let mut out = Vec::new();
        brotli::Decompressor::new(&s.brotli[..], 4096)
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, s.identity);
        assert_eq!(s.etag.len(), 34);
        assert_ne!(Script::new(b"a").etag, Script::new(b"b").etag);
    }
}

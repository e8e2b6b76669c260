//! libpq's `sslmode` and `sslrootcert` in `COLLECTOR_DATABASE_URL` (contract v4 §3), which
//! tokio-postgres reads only in part (it knows `disable`, `prefer` and `require`, and refuses
//! `verify-ca` and `verify-full` as an invalid connection string): they are taken out of the
//! string here, the rest goes to tokio-postgres, and the TLS they ask for is rustls's
//! ([`crate::tls`]; rustls rather than native-tls: no OpenSSL to link or patch, one TLS stack
//! for both databases).
//!
//! As libpq (PostgreSQL docs, "SSL Support", table "SSL Mode Descriptions"): `disable` plain;
//! `prefer` (libpq's default) TLS when the server offers it, the certificate not checked;
//! `require` TLS, the certificate checked against `sslrootcert` when one is named (as libpq does
//! when a root file exists), else not; `verify-ca` the chain to `sslrootcert` (or the system's
//! roots); `verify-full` that and the host name. A Unix socket is never encrypted (libpq does
//! not either).

use std::path::PathBuf;
use std::sync::Arc;

use super::{client_config, TlsError, Verify};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS if the server offers it.
    Prefer,
    /// TLS.
    Require,
    /// TLS, the chain checked.
    VerifyCa,
    /// TLS, the chain and the host name checked.
    VerifyFull,
}

/// What a connection string says of TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ssl {
    /// `sslmode` (libpq's default: `prefer`).
    pub mode: SslMode,
    /// `sslrootcert`: the roots to check against.
    pub root_cert: Option<PathBuf>,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, TlsError> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => return Err(TlsError::SslMode(other.to_owned())),
        })
    }
}

impl Ssl {
    /// The mode tokio-postgres is given: it negotiates TLS (or not); the checks are ours.
    pub fn negotiation(&self) -> tokio_postgres::config::SslMode {
        match self.mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        }
    }

    /// The rustls configuration the mode asks for; `None` for `disable`. Errors: the root file
    /// cannot be read.
    pub fn client_config(&self) -> Result<Option<Arc<rustls::ClientConfig>>, TlsError> {
        let root = self.root_cert.as_deref();
        let verify = match self.mode {
            SslMode::Disable => return Ok(None),
            SslMode::Prefer => Verify::Nothing,
            SslMode::Require if root.is_some() => Verify::ChainOnly,
            SslMode::Require => Verify::Nothing,
            SslMode::VerifyCa => Verify::ChainOnly,
            SslMode::VerifyFull => Verify::Full,
        };
        client_config(root, verify)
            .map(Some)
            .map_err(|e| TlsError::RootCert(Box::new(e)))
    }
}

/// `url` (a URL or a key=value string) without `sslmode` and `sslrootcert`, and what they
/// said. Errors: an `sslmode` libpq does not know.
pub fn split(url: &str) -> Result<(String, Ssl), TlsError> {
    let mut ssl = Ssl {
        mode: SslMode::Prefer,
        root_cert: None,
    };
    let mut take = |key: &str, value: &str| -> Result<bool, TlsError> {
        match key {
            "sslmode" => ssl.mode = SslMode::parse(value)?,
            "sslrootcert" => ssl.root_cert = Some(PathBuf::from(value)),
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let (head, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_encoding::percent_decode_str(v).decode_utf8_lossy();
            if !take(k, &v)? {
                kept.push(pair);
            }
        }
        if kept.is_empty() {
            head.to_owned()
        } else {
            format!("{head}?{}", kept.join("&"))
        }
    } else {
        let mut kept = Vec::new();
        for pair in key_values(url) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if !take(k.trim(), v.trim().trim_matches('\''))? {
                kept.push(pair);
            }
        }
        kept.join(" ")
    };
    Ok((rest, ssl))
}

/// The `key=value` pairs of a libpq key/value string, split on white space outside single
/// quotes.
fn key_values(s: &str) -> Vec<&str> {
    let (mut pairs, mut start, mut quoted, mut escaped) = (Vec::new(), None, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '\'' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                if let Some(st) = start.take() {
                    pairs.push(&s[st..i]);
                }
                continue;
            }
            _ => {}
        }
        start.get_or_insert(i);
    }
    if let Some(st) = start {
        pairs.push(&s[st..]);
    }
    // `key = value` with spaces around `=` is one pair.
    let mut joined: Vec<&str> = Vec::new();
    for p in pairs {
        match joined.last_mut() {
            Some(last) if last.ends_with('=') || p.starts_with('=') => {
                let begin = last.as_ptr() as usize - s.as_ptr() as usize;
                let end = p.as_ptr() as usize - s.as_ptr() as usize + p.len();
                *last = &s[begin..end];
            }
            _ => joined.push(p),
        }
    }
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_and_sslrootcert_are_taken_out_of_urls_and_key_values() {
        let (rest, ssl) =
            split("postgres://u@db.example:5432,db2:5433/c?sslmode=verify-full&sslrootcert=%2Fca.pem&application_name=x")
                .unwrap();
        assert_eq!(
            rest,
            "postgres://u@db.example:5432,db2:5433/c?application_name=x"
        );
        assert_eq!(ssl.mode, SslMode::VerifyFull);
        assert_eq!(
            ssl.root_cert.as_deref(),
            Some(std::path::Path::new("/ca.pem"))
        );
        let (rest, ssl) = split("postgres://h/c").unwrap();
        assert_eq!(
            (rest.as_str(), ssl.mode),
            ("postgres://h/c", SslMode::Prefer)
        );
        let (rest, ssl) =
            split("host=h port=5432 sslmode = 'verify-ca' sslrootcert=/c.pem dbname=c").unwrap();
        assert_eq!(rest, "host=h port=5432 dbname=c");
        assert_eq!(ssl.mode, SslMode::VerifyCa);
        assert!(split("host=h sslmode=sometimes").is_err());
        assert_eq!(
            split("host=h sslmode=require").unwrap().1.negotiation(),
            tokio_postgres::config::SslMode::Require
        );
    }

    #[test]
    fn the_rest_is_what_tokio_postgres_reads() {
        for url in [
            "postgres://u:p@h:1/c?sslmode=verify-full",
            "host=h user=u password='a b' sslmode=verify-ca",
        ] {
            let (rest, _) = split(url).unwrap();
            rest.parse::<tokio_postgres::Config>()
                .unwrap_or_else(|e| panic!("{url} -> {rest}: {e}"));
        }
    }
}

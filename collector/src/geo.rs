//! The visitor's country from the client address (contract v4 §2 `country`), and then the
//! address is forgotten: it is used for this lookup and the rate limits only, never written to
//! the spool, a row, a kept-aside file, a log line or a metric label.
//!
//! `COLLECTOR_GEO_DB` names a MaxMind DB file (MMDB), read with the `maxminddb` crate, in either
//! layout of the free country databases: MaxMind GeoLite2-Country and DB-IP (`country.iso_code`)
//! or the ip-location-db packages (`country_code`). The file is read again when it is replaced
//! (its size, modification time or inode changes; checked every [`RELOAD_CHECK`]), without a
//! restart; a replacement that does not read is logged and the database in use stays.
//! Private, loopback, link-local and unspecified addresses have no country, and neither has an
//! address the database does not list: `country` is then empty.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use maxminddb::{PathElement, Reader};
use tokio::sync::watch;

/// How often the database file is checked for a replacement.
pub const RELOAD_CHECK: Duration = Duration::from_secs(10);

/// What identifies one version of the file: size, modification time, inode.
type Stamp = (u64, Option<SystemTime>, u64);

/// Why the country database does not read.
#[derive(Debug, thiserror::Error)]
pub enum GeoError {
    /// The file cannot be read (its metadata, say: it is missing).
    #[error("{0}")]
    File(#[from] std::io::Error),
    /// The file is not a MaxMind DB.
    #[error("not a MaxMind DB: {0}")]
    NotMaxMind(#[from] maxminddb::MaxMindDbError),
}

/// The country database in use, if one is configured. Cheap to clone.
#[derive(Clone, Default)]
pub struct Countries {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    path: PathBuf,
    reader: RwLock<Arc<Reader<Vec<u8>>>>,
    stamp: Mutex<Stamp>,
}

impl Countries {
    /// No database: every `country` is empty.
    pub fn none() -> Countries {
        Countries::default()
    }

    /// The database at `path`. Errors: the file cannot be read or is not a MaxMind DB (a
    /// description for the operator).
    pub fn open(path: &Path) -> Result<Countries, GeoError> {
        let (reader, stamp) = read(path)?;
        Ok(Countries {
            inner: Some(Arc::new(Inner {
                path: path.to_owned(),
                reader: RwLock::new(Arc::new(reader)),
                stamp: Mutex::new(stamp),
            })),
        })
    }

    /// Whether a database is configured (the client address is then worked out for each
    /// request).
    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// The ISO 3166-1 alpha-2 code of `ip`'s country, upper case; empty without a database,
    /// for an address it does not list, and for private and loopback addresses.
    pub fn country(&self, ip: IpAddr) -> String {
        let Some(inner) = &self.inner else {
            return String::new();
        };
        let ip = ip.to_canonical();
        if !is_public(ip) {
            return String::new();
        }
        let reader = inner.reader.read().unwrap().clone();
        lookup(&reader, ip).unwrap_or_default()
    }

    /// Reads the file again whenever it is replaced, checking every [`RELOAD_CHECK`], until
    /// `shutdown` turns true. Without a database, returns at once.
    pub async fn run_reloader(self, mut shutdown: watch::Receiver<bool>) {
        let Some(inner) = self.inner else {
            return;
        };
        loop {
            tokio::select! {
                () = tokio::time::sleep(RELOAD_CHECK) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            let Ok(now) = stamp(&inner.path) else {
                continue;
            };
            if *inner.stamp.lock().unwrap() == now {
                continue;
            }
            let path = inner.path.clone();
            match tokio::task::spawn_blocking(move || read(&path)).await {
                Ok(Ok((reader, stamp))) => {
                    *inner.reader.write().unwrap() = Arc::new(reader);
                    *inner.stamp.lock().unwrap() = stamp;
                    tracing::info!(file = %inner.path.display(), "geo: the country database was replaced; reading the new one");
                }
                Ok(Err(e)) => {
                    // Kept as it is; tried again when the file changes again.
                    *inner.stamp.lock().unwrap() = now;
                    tracing::warn!(file = %inner.path.display(), error = %e, "geo: the replaced country database does not read; the one in use stays");
                }
                Err(_) => {}
            }
        }
    }
}

/// Reads the file at `path` as a MaxMind DB, with its stamp.
fn read(path: &Path) -> Result<(Reader<Vec<u8>>, Stamp), GeoError> {
    let before = stamp(path)?;
    let reader = Reader::open_readfile(path)?;
    Ok((reader, before))
}

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.len(), m.modified().ok(), m.ino()))
}

/// The country code of `ip` in either layout, if it has a valid one.
fn lookup(reader: &Reader<Vec<u8>>, ip: IpAddr) -> Option<String> {
    let found = reader.lookup(ip).ok()?;
    let paths: [&[PathElement<'_>]; 2] = [
        &[PathElement::Key("country"), PathElement::Key("iso_code")],
        &[PathElement::Key("country_code")],
    ];
    paths.iter().find_map(|path| {
        let code: &str = found.decode_path(path).ok()??;
        (code.len() == 2 && code.bytes().all(|b| b.is_ascii_alphabetic()))
            .then(|| code.to_ascii_uppercase())
    })
}

/// Whether `ip` can have a country: not private, loopback, link-local, unspecified,
/// documentation-only or otherwise local (RFC 1918, RFC 4193, RFC 6598 shared space).
fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || (a == 100 && (64..128).contains(&b)))
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_addresses_have_no_country() {
        for local in [
            "10.1.2.3",
            "192.168.0.1",
            "172.16.0.1",
            "127.0.0.1",
            "100.64.0.1",
            "169.254.1.1",
            "::1",
            "fd00::1",
            "fe80::1",
        ] {
            assert!(!is_public(local.parse().unwrap()), "{local}");
        }
        for public in ["8.8.8.8", "2001:4860::8888", "100.128.0.1"] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    /// The two layouts, from databases made by `tests/fixtures/geo-db.pl` (Debian's
    /// libmaxmind-db-writer-perl): GeoLite2's `country.iso_code` and ip-location-db's
    /// `country_code`, IPv4 (also IPv4-mapped IPv6) and IPv6, upper case.
    #[test]
    fn countries_of_both_layouts() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        let geolite = Countries::open(&fixtures.join("geo-geolite2.mmdb")).unwrap();
        let ip_db = Countries::open(&fixtures.join("geo-ip-location-db.mmdb")).unwrap();
        let at = |c: &Countries, ip: &str| c.country(ip.parse().unwrap());
        assert_eq!(at(&geolite, "192.0.2.9"), "FR");
        assert_eq!(at(&geolite, "::ffff:192.0.2.9"), "FR");
        assert_eq!(at(&geolite, "2001:db8:1::5"), "JP");
        assert_eq!(at(&geolite, "198.51.100.1"), "", "not listed");
        assert_eq!(at(&ip_db, "198.51.100.1"), "DE");
        assert_eq!(at(&ip_db, "2001:db8:2::1"), "BR");
        assert_eq!(at(&ip_db, "10.0.0.1"), "", "private");
    }

    #[test]
    fn without_a_database_every_country_is_empty() {
        assert_eq!(Countries::none().country("8.8.8.8".parse().unwrap()), "");
        assert!(Countries::open(Path::new("/nonexistent.mmdb")).is_err());
    }
}

//! Reading setting values, with every bad one reported and none stopping the others
//! ([`Problems`]).

use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;
use url::Url;

use crate::tls::TlsError;

/// Why one setting's value is bad: the reason shown after `COLLECTOR_NAME="value": ` (see
/// [`Problems`]). A part that may hold a password is never in it.
#[derive(Debug, thiserror::Error)]
pub enum ValueError {
    /// `COLLECTOR_CLIENT_IP_HEADER` names neither header.
    #[error("must be X-Forwarded-For or Forwarded")]
    ClientIpHeader,
    /// `COLLECTOR_CLICKHOUSE_TABLE_FORM` is neither form.
    #[error("must be replicated or single")]
    TableForm,
    /// A password file cannot be read (the file is named by the setting, never its content).
    #[error("{0}")]
    SecretFile(std::io::Error),
    /// A placeholder password from `deploy/env.example` (see [`not_placeholder`]).
    #[error(
        "a placeholder password ({prefix}-...; deploy/env.example): set a real one, e.g. `openssl rand -hex 24`",
        prefix = PLACEHOLDER_PREFIX
    )]
    Placeholder,
    /// Not an address, and not a host name that resolves.
    #[error("{0}")]
    Address(std::net::AddrParseError),
    /// A host name that resolves to no address.
    #[error("resolves to no address")]
    NoAddress,
    /// A ClickHouse URL that does not parse; `shown` is `<hidden>` when it may hold a password.
    #[error("{shown}: {source}")]
    Url {
        /// The URL as written, or `<hidden>`.
        shown: String,
        /// Why it does not parse.
        source: url::ParseError,
    },
    /// A ClickHouse URL that is not `http://` or `https://` with a host.
    #[error("{0}: must be an http:// or https:// URL")]
    NotHttp(String),
    /// A ClickHouse URL with a user or password (named by its host only).
    #[error("{0}: credentials in the URL are not supported (they would show in logs and metrics): use COLLECTOR_CLICKHOUSE_USER and COLLECTOR_CLICKHOUSE_PASSWORD_FILE")]
    Credentials(String),
    /// A ClickHouse URL with a query (named by its host only).
    #[error("{0}: a query is not supported (ClickHouse would read a user and password from it, and it would show in logs and metrics): use COLLECTOR_CLICKHOUSE_USER and COLLECTOR_CLICKHOUSE_PASSWORD_FILE")]
    Query(String),
    /// A ClickHouse URL listed twice.
    #[error("{0}: listed twice")]
    UrlTwice(String),
    /// An empty list of ClickHouse URLs.
    #[error("at least one URL is required")]
    NoUrl,
    /// A part of `COLLECTOR_CLICKHOUSE_SHARDS` that is not `NAME=URL,...`.
    #[error("{0}: must be NAME=URL,URL,...")]
    NotShard(String),
    /// A shard name that is not 1 to 32 of `a-z`, `0-9`, `_` and `-`.
    #[error("{0}: a shard name is 1 to 32 of a-z, 0-9, _ and -")]
    ShardName(String),
    /// A shard named twice.
    #[error("shard {0}: named twice")]
    ShardTwice(String),
    /// A shard without a replica URL.
    #[error("shard {0}: no replica URL")]
    NoReplica(String),
    /// A bad URL list of the shard `shard`.
    #[error("shard {shard}: {source}")]
    ShardUrls {
        /// The shard's name.
        shard: String,
        /// What is wrong with its URLs.
        source: Box<ValueError>,
    },
    /// One replica URL in two shards.
    #[error("{url}: a replica of both shard {other} and shard {shard}")]
    TwoShards {
        /// The URL, without its trailing `/`.
        url: String,
        /// The shard listing it first.
        other: String,
        /// The shard listing it again.
        shard: String,
    },
    /// An empty `COLLECTOR_CLICKHOUSE_SHARDS`.
    #[error("at least one shard is required")]
    NoShard,
    /// A part of a CIDR list that is neither a CIDR nor an address.
    #[error("{0}: not a CIDR like 10.0.0.0/8 or an address")]
    NotCidr(String),
    /// The TLS a URL or a CA file asks for cannot be set up.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// `COLLECTOR_DATABASE_URL` is not a connection string tokio-postgres takes.
    #[error("{0}")]
    DatabaseUrl(tokio_postgres::Error),
    /// `sslmode=verify-full` with only a `hostaddr`: no name to verify against.
    #[error("sslmode=verify-full with a hostaddr but no host: no name to verify the server's certificate against (libpq refuses it too); add host=NAME")]
    NoHostToVerify,
}

/// The longest duration any setting accepts: longer ones are surely a mistake (and some, such
/// as the dedup window, would overflow timers).
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The header a trusted proxy names the client in (`COLLECTOR_CLIENT_IP_HEADER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientIpHeader {
    /// `X-Forwarded-For`: the default.
    #[default]
    XForwardedFor,
    /// `Forwarded` (RFC 7239).
    Forwarded,
}

impl ClientIpHeader {
    /// Parses a header name, case-insensitively: `X-Forwarded-For` or `Forwarded`.
    pub fn parse(name: &str) -> Result<ClientIpHeader, ValueError> {
        match name.trim().to_ascii_lowercase().as_str() {
            "x-forwarded-for" => Ok(ClientIpHeader::XForwardedFor),
            "forwarded" => Ok(ClientIpHeader::Forwarded),
            _ => Err(ValueError::ClientIpHeader),
        }
    }

    /// The header's name, lower-case, as [`axum::http::HeaderMap`] looks it up.
    pub fn name(self) -> &'static str {
        match self {
            ClientIpHeader::XForwardedFor => "x-forwarded-for",
            ClientIpHeader::Forwarded => "forwarded",
        }
    }
}

/// Every bad value found so far, each as `COLLECTOR_NAME="value" (--name): reason`, naming
/// both ways of giving it (a value may come from the environment or from a flag). A reader
/// that finds a bad value records it and answers a placeholder, so that the values after it
/// are judged too and an operator sees them all at once.
#[derive(Debug, Default)]
pub(super) struct Problems(pub Vec<String>);

impl Problems {
    /// Records that `COLLECTOR_<name>`, shown as `shown`, is bad for `reason`.
    pub fn report(&mut self, name: &str, shown: &str, reason: impl std::fmt::Display) {
        let flag = flag_of(name).map_or_else(String::new, |f| format!(" (--{f})"));
        self.0
            .push(format!("COLLECTOR_{name}={shown:?}{flag}: {reason}"));
    }

    /// The value of `result`, or `None` with the error reported.
    pub fn check<T, E: std::fmt::Display>(
        &mut self,
        name: &str,
        shown: &str,
        result: Result<T, E>,
    ) -> Option<T> {
        result.map_err(|e| self.report(name, shown, e)).ok()
    }

    /// A humantime duration (`10s`, `250ms`) of at least `min` and at most [`MAX_DURATION`].
    pub fn duration(&mut self, name: &str, value: &str, min: Duration) -> Duration {
        match humantime::parse_duration(value.trim()) {
            Ok(d) if d > MAX_DURATION => self.report(name, value, "must be at most 7 days"),
            // Zero would switch a guard off (a timeout) or turn a cache into a busy loop (10
            // full reloads a second with a TTL of 0): refused, not taken literally.
            Ok(d) if d < min => self.report(name, value, format!("must be at least {min:?}")),
            Ok(d) => return d,
            Err(e) => self.report(
                name,
                value,
                format!("not a duration like 10s or 250ms: {}", why(value.trim(), e)),
            ),
        }
        // A placeholder that passes the later checks: reported once.
        Duration::from_secs(1)
    }

    /// A humantime duration counted in days or more (`395d`, `2years`): at least `min`, at
    /// most 100 years.
    pub fn long_duration(&mut self, name: &str, value: &str, min: Duration) -> Duration {
        const MAX: Duration = Duration::from_secs(100 * 365 * 86_400);
        match humantime::parse_duration(value.trim()) {
            Ok(d) if d > MAX => self.report(name, value, "must be at most 100 years"),
            Ok(d) if d < min => self.report(name, value, format!("must be at least {min:?}")),
            Ok(d) => return d,
            Err(e) => self.report(
                name,
                value,
                format!("not a duration like 395d: {}", why(value.trim(), e)),
            ),
        }
        MAX
    }

    /// A whole number above 0.
    pub fn positive(&mut self, name: &str, value: &str) -> u64 {
        match value.trim().parse::<u64>() {
            Ok(n) if n > 0 => n,
            _ => {
                self.report(name, value, "must be a whole number above 0");
                1
            }
        }
    }

    /// A rate per second, 0 for off.
    pub fn rate(&mut self, name: &str, value: &str) -> u32 {
        value.trim().parse::<u32>().unwrap_or_else(|_| {
            self.report(name, value, "must be a whole number (0 turns it off)");
            0
        })
    }

    /// A value that must not be empty.
    pub fn required(&mut self, name: &str, value: &str) {
        if value.trim().is_empty() {
            self.report(name, "", "must be set");
        }
    }
}

/// A password: never shown (its `Debug` is `<hidden>`), never logged, never in a metric or an
/// error answer.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<hidden>")
    }
}

impl Secret {
    /// The password itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// The password in the file at `path`: its first line, without the line ending. Errors: the
/// file cannot be read (the error names the file, never its content).
pub fn secret_file(path: &str) -> Result<Secret, ValueError> {
    let text = std::fs::read_to_string(path.trim()).map_err(ValueError::SecretFile)?;
    let line = text.lines().next().unwrap_or("");
    not_placeholder(line)?;
    Ok(Secret(line.to_owned()))
}

/// The prefix of the placeholder passwords in `deploy/env.example` (`change-me-collector`...).
pub const PLACEHOLDER_PREFIX: &str = "change-me";

/// Refuses a placeholder password (one starting with [`PLACEHOLDER_PREFIX`], in any case):
/// copied from `deploy/env.example` and never replaced, it is public (issue 52, 5). The error
/// never holds the password.
pub fn not_placeholder(password: &str) -> Result<(), ValueError> {
    let placeholder = password
        .get(..PLACEHOLDER_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(PLACEHOLDER_PREFIX));
    if placeholder {
        return Err(ValueError::Placeholder);
    }
    Ok(())
}

/// An address, or a host name resolved once, here (never per request).
pub fn socket_addr(value: &str) -> Result<SocketAddr, ValueError> {
    value
        .parse::<SocketAddr>()
        .map_err(ValueError::Address)
        .or_else(|e| {
            std::net::ToSocketAddrs::to_socket_addrs(value)
                .map_err(|_| e)?
                .next()
                .ok_or(ValueError::NoAddress)
        })
}

/// A SQL identifier safe to splice into DDL: `[A-Za-z_][A-Za-z0-9_]*`, at most 64 bytes.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 64
}

/// Whether a ClickHouse URL as written may hold a password: in its user information (`@`) or
/// in its query (ClickHouse's HTTP interface reads `?user=...&password=...`). Such a text is
/// never echoed.
pub fn may_hold_password(url: &str) -> bool {
    url.contains(['@', '?'])
}

/// A comma-separated list of ClickHouse HTTP(S) URLs, in order, none twice, without
/// credentials or a query (either may carry a password, which would show in logs and metric
/// labels).
pub fn clickhouse_urls(s: &str) -> Result<Vec<Url>, ValueError> {
    let mut urls = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        // A malformed URL may still hold a password: never echoed.
        let shown = if may_hold_password(part) {
            "<hidden>"
        } else {
            part
        };
        let url = Url::parse(part).map_err(|source| ValueError::Url {
            shown: shown.to_owned(),
            source,
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(ValueError::NotHttp(shown.to_owned()));
        }
        let host = || url.host_str().unwrap_or("?").to_owned();
        // They would show in logs and metric labels: refused, without echoing them.
        if !url.username().is_empty() || url.password().is_some() {
            return Err(ValueError::Credentials(host()));
        }
        if url.query().is_some() {
            return Err(ValueError::Query(host()));
        }
        if urls.contains(&url) {
            return Err(ValueError::UrlTwice(shown.to_owned()));
        }
        urls.push(url);
    }
    if urls.is_empty() {
        return Err(ValueError::NoUrl);
    }
    Ok(urls)
}

/// A shard's name (contract v5 §3): 1 to 32 of `a-z`, `0-9`, `_` and `-`; it names the
/// shard's spool folder and a metric label.
pub fn is_shard_name(s: &str) -> bool {
    (1..=32).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// `COLLECTOR_CLICKHOUSE_SHARDS`: `NAME=URL,URL,...` separated by `;` (contract v5 §1), each
/// URL as [`clickhouse_urls`] takes it. Errors: a bad or duplicate name, a shard without a
/// URL, a URL in two shards, none at all. A part holding `@` is never echoed (it may hold a
/// password).
pub fn clickhouse_shards(s: &str) -> Result<Vec<(String, Vec<Url>)>, ValueError> {
    let mut shards: Vec<(String, Vec<Url>)> = Vec::new();
    for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let shown = |p: &str| {
            if may_hold_password(p) {
                "<hidden>".to_owned()
            } else {
                p.to_owned()
            }
        };
        let Some((name, urls)) = part.split_once('=') else {
            return Err(ValueError::NotShard(shown(part)));
        };
        let name = name.trim();
        if !is_shard_name(name) {
            return Err(ValueError::ShardName(shown(name)));
        }
        if shards.iter().any(|(n, _)| n == name) {
            return Err(ValueError::ShardTwice(name.to_owned()));
        }
        if urls.trim().is_empty() {
            return Err(ValueError::NoReplica(name.to_owned()));
        }
        let urls = clickhouse_urls(urls).map_err(|e| ValueError::ShardUrls {
            shard: name.to_owned(),
            source: Box::new(e),
        })?;
        for url in &urls {
            if let Some((other, _)) = shards.iter().find(|(_, u)| u.contains(url)) {
                return Err(ValueError::TwoShards {
                    url: url.as_str().trim_end_matches('/').to_owned(),
                    other: other.clone(),
                    shard: name.to_owned(),
                });
            }
        }
        shards.push((name.to_owned(), urls));
    }
    if shards.is_empty() {
        return Err(ValueError::NoShard);
    }
    Ok(shards)
}

/// A comma-separated list of CIDRs or addresses.
pub fn cidrs(s: &str) -> Result<Vec<IpNet>, ValueError> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<IpNet>()
                .or_else(|_| p.parse::<std::net::IpAddr>().map(IpNet::from))
                .map_err(|_| ValueError::NotCidr(p.to_owned()))
        })
        .collect()
}

/// The flag that gives `COLLECTOR_<name>` on the command line (`listen` for `LISTEN`), looked
/// up among [`super::args::RawArgs`]'s arguments; `None` for a name that no flag reads.
fn flag_of(name: &str) -> Option<String> {
    use clap::Args;
    let env = format!("COLLECTOR_{name}");
    let command = super::args::RawArgs::augment_args(clap::Command::new("collector"));
    let flag = command
        .get_arguments()
        .find(|a| a.get_env().is_some_and(|e| *e == *env))?
        .get_long()?
        .to_owned();
    Some(flag)
}

/// What is wrong with `text` as a duration, in words an operator can act on: humantime's
/// own words for a unit ("unknown time unit \"x\", supported units: ..."), but the place of
/// a bad character named by the text itself rather than by a byte offset ("expected number
/// at 0").
fn why(text: &str, e: humantime::DurationError) -> String {
    use humantime::DurationError as E;
    let rest = |at: usize| text.get(at..).unwrap_or(text).to_owned();
    match e {
        E::NumberExpected(at) => format!("a number was expected at {:?}", rest(at)),
        E::InvalidCharacter(at) => format!(
            "{:?} is not allowed (a number, then a unit: letters and digits only)",
            rest(at).chars().next().unwrap_or(' ')
        ),
        other => other.to_string(),
    }
}

//! Structured logs (tracing) and rate-limited warnings.
//!
//! A warning that can repeat per request or per retry goes through [`warn_limited`]: it is
//! written at most once a second per kind, and the next one written says how many were
//! suppressed in between (also counted in `collector_log_suppressed_total`).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Shortest interval between two lines of one kind.
pub const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Lines suppressed so far; registered as `collector_log_suppressed_total`.
pub static SUPPRESSED: LazyLock<Counter> = LazyLock::new(Counter::default);

static LAST: LazyLock<Mutex<HashMap<&'static str, (Instant, u64)>>> =
    LazyLock::new(Default::default);

/// Installs the global subscriber: `RUST_LOG` filter (default `info`), text or JSON lines
/// on stderr.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Runs `log` unless a line of this `kind` was written less than [`LOG_INTERVAL`] ago, in
/// which case the line is counted as suppressed. Returns whether `log` ran.
pub fn warn_limited(kind: &'static str, log: impl FnOnce()) -> bool {
    let now = Instant::now();
    let suppressed = {
        let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
        match last.get_mut(kind) {
            Some((at, count)) if now.duration_since(*at) < LOG_INTERVAL => {
                *count += 1;
                SUPPRESSED.inc();
                return false;
            }
            Some((at, count)) => {
                *at = now;
                std::mem::take(count)
            }
            None => {
                last.insert(kind, (now, 0));
                0
            }
        }
    };
    if suppressed > 0 {
        tracing::warn!(
            kind,
            suppressed,
            "repeated log lines suppressed in the last second"
        );
    }
    log();
    true
}

/// `error` and every error under it (`source()` walked), joined with `": "`, skipping a
/// source whose text its parent already contains (many errors repeat their cause): the one
/// line a log needs to name the root cause.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        let part = e.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        next = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_names_the_root_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        assert_eq!(chain(&e), "outer: connection refused");
        #[derive(Debug, thiserror::Error)]
        #[error("db error: {0}")]
        struct Repeats(#[source] std::io::Error);
        let e = Repeats(std::io::Error::other("disk full"));
        assert_eq!(chain(&e), "db error: disk full");
    }

    #[test]
    fn ten_thousand_repeats_log_once() {
        let mut written = 0;
        for _ in 0..10_000 {
            if warn_limited("test_kind", || {}) {
                written += 1;
            }
        }
        assert_eq!(written, 1);
        assert!(SUPPRESSED.get() >= 9_999);
    }
}

//! The one error of the stack: what failed, with the last lines of the logs that say why.

use std::fmt;
use std::path::Path;

/// Lines of each log shown with an error ([`Error::with_logs`]).
pub const LOG_TAIL_LINES: usize = 25;

/// A stack operation that failed: a server that did not start, answer or stop in time, a
/// missing binary, a bad argument. The message is meant for a person and already holds the
/// tails of the server logs that explain it. Its `Debug` is its text too, so that a test's
/// `unwrap()` shows the log tails as lines.
pub struct Error {
    message: String,
}

impl Error {
    /// An error with `message` only.
    pub fn new(message: impl Into<String>) -> Error {
        Error {
            message: message.into(),
        }
    }

    /// An error with `message`, followed by the last [`LOG_TAIL_LINES`] lines of each
    /// non-empty file of `logs` (a missing file is skipped).
    pub fn with_logs(message: impl Into<String>, logs: &[&Path]) -> Error {
        let mut message = message.into();
        for log in logs {
            let Ok(text) = std::fs::read_to_string(log) else {
                continue;
            };
            if text.is_empty() {
                continue;
            }
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
            message.push_str(&format!(
                "\n----- last lines of {} -----\n{}",
                log.display(),
                tail.join("\n")
            ));
        }
        Error { message }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::new(e.to_string())
    }
}

/// What every stack operation returns.
pub type Result<T> = std::result::Result<T, Error>;

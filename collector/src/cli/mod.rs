//! The one-shot commands, one file each, and how a command fails ([`RunError`]).

pub mod args;
pub mod migrate;
pub mod probe;
pub mod purge;
pub mod report;
pub mod retention;
pub mod sites;
pub mod spool;

use std::sync::Arc;

pub use args::{Cli, Command, SiteLists, SitesCommand, SpoolCommand};

use crate::config::Config;
use crate::{metrics, settings};

/// Exit code for bad configuration or usage (contract §1).
pub const EXIT_CONFIG: i32 = 2;
/// Exit code for a runtime failure (a server unreachable, the spool locked, ...).
pub const EXIT_FAILURE: i32 = 1;

/// A failure that ends a command.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad usage (exit 2).
    #[error("{0}")]
    Usage(String),
    /// Anything else (exit 1).
    #[error("{0}")]
    Failed(String),
}

impl RunError {
    /// The process exit code: 2 for bad usage (contract §1), 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::Usage(_) => EXIT_CONFIG,
            RunError::Failed(_) => EXIT_FAILURE,
        }
    }
}

/// Any failure as [`RunError::Failed`], with its message.
pub(crate) fn failed(e: impl std::fmt::Display) -> RunError {
    RunError::Failed(e.to_string())
}

/// The settings store for one-shot commands (no backoff: one attempt, then exit).
pub(crate) fn cli_store(config: &Config) -> Result<settings::SettingsStore, RunError> {
    settings::SettingsStore::new(
        &config.settings.database_url,
        config.settings.password.as_ref(),
        std::time::Duration::ZERO,
        Arc::new(metrics::Metrics::new()),
    )
    .map_err(failed)
}

//! One error type: every message says what failed and where (a command, a file, a URL).

/// A failed step of the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A step failed; the message names it and what it acted on.
    #[error("{0}")]
    Failed(String),
    /// A file or process operation failed on `what` (a path or a command).
    #[error("{what}: {source}")]
    Io {
        /// The path or command acted on.
        what: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Starting, asking or stopping the server stack failed.
    #[error("the stack: {0}")]
    Stack(#[from] stack::Error),
}

/// The benchmark's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// A [`Error::Failed`] with `message`.
pub fn fail(message: impl Into<String>) -> Error {
    Error::Failed(message.into())
}

/// Adds what was acted on to an I/O error.
pub trait Context<T> {
    /// The error names `what` (a path or a command).
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Context<T> for std::io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Io {
            what: what(),
            source,
        })
    }
}

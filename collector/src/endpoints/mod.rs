//! One file per endpoint, as in Sentry Relay: each handler reads [`crate::server::AppState`]
//! and answers; errors go through [`crate::error::IntakeError`].

pub mod intake;
pub mod ops;
pub mod script;
pub mod sites;

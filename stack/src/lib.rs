//! The throw-away server stack of the tests and the demo.
pub mod ctx;
pub mod env;
pub mod error;
pub mod http;
pub mod ports;
pub mod process;
pub mod postgres;
pub mod clickhouse;
pub mod zookeeper;
pub mod ch26;

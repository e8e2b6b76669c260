//! ClickHouse, in one place: how an insert failed ([`errors`]), the INSERT itself
//! ([`insert`]), the schema with its two table forms ([`schema`]) and stored rows held to
//! today's rules ([`minimise`]). The writer
//! ([`crate::writer`]) and `collector migrate` ([`crate::cli::migrate`]) use it; it uses neither.
//!
//! Inside this module and everywhere else, `clickhouse::…` names the `clickhouse` crate (the
//! HTTP client); this module is `crate::clickhouse`.

pub mod cluster;
pub mod erase;
pub mod errors;
pub mod insert;
pub mod minimise;
pub mod schema;

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::config::ClickHouseConfig;

/// How long a pooled connection may stay idle: below the server's `keep_alive_timeout` (3 s by
/// default), so that the client gives a connection up before the server does.
const POOL_IDLE: Duration = Duration::from_secs(2);
/// TCP keep-alive probes on the connections to ClickHouse.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// A client of the ClickHouse server at `url` (as configured, without a trailing slash), as
/// `COLLECTOR_CLICKHOUSE_USER`, with its password, over `http://` or verified `https://`
/// (contract v4 §3): no row validation. `pooled`: connections are kept for reuse; else every
/// request opens a fresh one (for the retry after a pooled connection was found dead).
pub fn client(url: &str, config: &ClickHouseConfig, pooled: bool) -> clickhouse::Client {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_keepalive(Some(TCP_KEEPALIVE));
    http.enforce_http(false);
    let mut builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    builder.pool_idle_timeout(POOL_IDLE);
    if !pooled {
        builder.pool_max_idle_per_host(0);
    }
    let client = match &config.tls {
        // An https:// URL without TLS configured cannot happen: configuration made one for
        // every https:// URL; the connector refuses it rather than fall back to plain HTTP.
        Some(tls) => clickhouse::Client::with_http_client(
            builder.build(
                hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(ClientConfig::clone(tls))
                    .https_or_http()
                    .enable_http1()
                    .wrap_connector(http),
            ),
        ),
        None => {
            http.enforce_http(true);
            clickhouse::Client::with_http_client(builder.build(http))
        }
    };
    let client = client
        .with_url(url)
        .with_validation(false)
        .with_user(&config.user);
    match &config.password {
        Some(password) => client.with_password(password.expose()),
        None => client,
    }
}

type ClientConfig = rustls::ClientConfig;

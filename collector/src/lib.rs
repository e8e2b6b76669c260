//! The measurement collector: web-performance beacons in, ClickHouse rows out.
//!
//! # Layout
//!
//! One beacon travels one way; each station is one module:
//!
//! ```text
//! server (accept loop, limits, drain) ─► endpoints::intake
//!     ─► beacon (decode, validate, normalise) ─► settings (cache over PostgreSQL)
//!     ─► dedup (window by id) ─► measurement (encoded once, RowBinary)
//!     ─► spool (durable, group commit)                                ← 202 here
//!                                   │  frames of RowBinary rows, never decoded
//!              writer (own thread: batch, insert, bisect, confirm, failover)
//!                                   ─► ClickHouse replicas
//! ```
//!
//! - [`config`]: command line and `COLLECTOR_*` settings, every bad value reported at once.
//! - [`beacon`]: pure decoding and validation of request bodies; [`measurement`]: the row,
//!   its columns declared once, and its one encoding (RowBinary).
//! - [`settings`]: the `sites` store and the cache intake reads through.
//! - [`dedup`]: the in-memory dedup window.
//! - [`spool`]: the durable log where the request path ends and the write path begins.
//! - [`writer`]: batches from the spool into the preferred healthy replica, on a thread and
//!   runtime of its own at a lower priority than the request threads.
//! - [`server`]: the accept loop, connection and header limits, drain; it serves any router.
//! - [`endpoints`]: the routes ([`endpoints::router`]) and one handler per file, each reading
//!   the shared [`state`]; [`error`]: the intake's errors and their statuses.
//! - [`script`]: the tracking script.
//! - [`metrics`], [`logging`]: operations. [`migrate`]: schema for `collector migrate`.
//!
//! Intake never imports the writer and the writer never imports HTTP types: they meet only
//! in the spool. The server and the endpoints do not import each other either: [`run`] builds
//! the [`state`], hands `endpoints::router(state)` to [`server::serve`], and wires the rest.

#![warn(missing_docs)]

pub mod beacon;
pub mod clickhouse;
pub mod client_ip;
pub mod config;
pub mod dedup;
pub mod endpoints;
pub mod error;
pub mod limits;
pub mod logging;
pub mod measurement;
pub mod metrics;
pub mod migrate;
pub mod script;
pub mod server;
pub mod settings;
pub mod spool;
pub mod state;
pub mod useragent;
pub mod writer;

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use config::{Cli, Command, Settings, SitesCommand, SpoolCommand};

/// Exit code for bad configuration or usage (contract §1).
pub const EXIT_CONFIG: i32 = 2;
/// Exit code for a runtime failure (a server unreachable, the spool locked, ...).
pub const EXIT_FAILURE: i32 = 1;

/// Runs a parsed command line; returns the process exit code.
pub async fn run(cli: Cli) -> i32 {
    let settings = match Settings::from_args(&cli.args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("collector: {e}");
            return EXIT_CONFIG;
        }
    };
    logging::init(settings.log_format);
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => serve(settings).await,
        Command::Migrate => migrate::run(&settings).await,
        Command::Sites { command } => sites(&settings, command).await,
        Command::Probe => probe(&settings).await,
        Command::Spool { command } => spool_command(&settings, command),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("collector: {e}");
            e.exit_code()
        }
    }
}

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
    fn exit_code(&self) -> i32 {
        match self {
            RunError::Usage(_) => EXIT_CONFIG,
            RunError::Failed(_) => EXIT_FAILURE,
        }
    }
}

/// File descriptors kept for the collector's own use besides client connections: standard
/// streams, the runtime's epoll, event and signal descriptors, the listener, the spool's files
/// (lock, the segments being written and read, cursor, identity, settings snapshot, kept-aside
/// batches), the settings store's pool ([`settings::store::POOL_SIZE`] connections plus those
/// being opened) and the ClickHouse connections (per replica: pooled and fresh ones for
/// inserts, probes and schema checks). About 50 with three replicas; the reserve is five times
/// that, so that client connections can never take the descriptors the spool and the
/// databases need (an `EMFILE` there would answer 503 or stall the writer).
pub const RESERVED_FDS: usize = 256;
/// On shutdown, how long intake requests whose client has gone may take to finish after the
/// listener closed: longer than a request's own bounds (the claim wait and the append
/// timeout, 5 s each).
pub const REQUESTS_DRAIN: std::time::Duration = std::time::Duration::from_secs(12);

/// The open-connection cap to serve with: `COLLECTOR_MAX_CONNECTIONS`, lowered to what the
/// open-files limit holds once [`RESERVED_FDS`] are set aside. The soft limit is first raised
/// to the hard limit. Lowering the default (20,000) is logged at info level, as it is the
/// normal case on a host whose hard limit is about 20,000 (this project's CI VM: 20,000);
/// lowering a value that was set explicitly is a warning.
fn connection_limit(settings: &Settings) -> usize {
    let nofile = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => n,
        Err(e) => {
            let soft = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(0, |(soft, _)| soft);
            tracing::warn!(error = %logging::chain(&e), nofile = soft, "cannot raise the open-files limit");
            soft
        }
    };
    let holds = usize::try_from(nofile)
        .unwrap_or(usize::MAX)
        .saturating_sub(RESERVED_FDS);
    let wanted = settings.max_connections;
    if wanted <= holds {
        return wanted;
    }
    let cap = holds.max(1);
    if settings.max_connections_set {
        tracing::warn!(
            nofile,
            reserved = RESERVED_FDS,
            max_connections = wanted,
            serving = cap,
            "COLLECTOR_MAX_CONNECTIONS does not fit the open-files limit less the descriptors the collector keeps for itself; raise the hard limit (LimitNOFILE, ulimit -n, a container's nofile) or lower the setting"
        );
    } else {
        tracing::info!(
            nofile,
            reserved = RESERVED_FDS,
            serving = cap,
            "open connections capped to fit the open-files limit"
        );
    }
    cap
}

fn failed(e: impl std::fmt::Display) -> RunError {
    RunError::Failed(e.to_string())
}

async fn serve(settings: Settings) -> Result<(), RunError> {
    let max_connections = connection_limit(&settings);
    // Listen first: a taken address is reported before anything else starts.
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| {
            failed(format!(
                "cannot listen on {} (COLLECTOR_LISTEN): {e}",
                settings.listen
            ))
        })?;
    let metrics = Arc::new(metrics::Metrics::new());
    let (spool, reader) = spool::open(
        &settings.spool_dir,
        settings.spool_max_bytes,
        metrics.clone(),
    )
    .map_err(failed)?;
    let store = settings::SettingsStore::new(
        &settings.database_url,
        settings.settings_backoff,
        metrics.clone(),
    )
    .map_err(failed)?;
    let snapshot = settings::snapshot::path(&settings.spool_dir);
    let site_settings = settings::SiteSettings::new(
        store,
        settings.settings_ttl,
        Some(snapshot),
        metrics.clone(),
    );
    match site_settings.reload().await {
        Ok(n) => tracing::info!(sites = n, "settings: loaded every site"),
        Err(e) => {
            if let Err(snap) = site_settings.load_snapshot().await {
                tracing::warn!(error = %e, snapshot = %snap, "settings: store unreachable and no snapshot; loading on demand");
            }
        }
    }
    let site_settings_reloader = site_settings.clone();
    let dedup = dedup::Dedup::new(settings.dedup_capacity, settings.dedup_window);
    let limits = limits::Limits::new(
        settings.client_rate,
        settings.site_rate,
        settings.max_in_flight,
    );
    let state = state::AppState::new(state::Inner {
        settings: site_settings,
        dedup,
        spool,
        script: script::Script::default(),
        user_agents: {
            // Compiled before the listener opens, so that no beacon waits for it.
            useragent::UserAgents::warm_up();
            useragent::UserAgents::default()
        },
        metrics: metrics.clone(),
        limits: limits.clone(),
        trusted_proxies: settings.trusted_proxies.clone(),
        body_timeout: settings.body_timeout,
        draining: Default::default(),
        requests: TaskTracker::new(),
    });

    let (stop_writer, writer_shutdown) = watch::channel(false);
    let replicas = writer::Replicas::new(
        &settings.clickhouse_urls,
        &settings.clickhouse_database,
        metrics.clone(),
    );
    let batch_limits = writer::BatchLimits {
        max_rows: settings.batch_max_rows,
        max_bytes: settings.batch_max_bytes,
        max_age: settings.batch_max_age,
    };
    let probing = writer::probe::Settings {
        database: settings.clickhouse_database.clone(),
        max_delay: settings.catchup_max_delay,
        form: settings.clickhouse_table_form,
    };
    let pruner = tokio::spawn(limits.run_pruner(writer_shutdown.clone()));
    let reloader = tokio::spawn(site_settings_reloader.run_reloader(writer_shutdown.clone()));
    let writer = writer::spawn(
        reader,
        replicas,
        batch_limits,
        probing,
        metrics.clone(),
        writer_shutdown,
    )
    .map_err(|e| failed(format!("cannot start the writer thread: {e}")))?;

    tracing::info!(listen = %settings.listen, replicas = settings.clickhouse_urls.len(), "collector: serving");

    let drain_state = state.clone();
    let grace = settings.drain_grace;
    let close = async move {
        let with_grace = shutdown_signal().await;
        drain_state.start_draining();
        if with_grace {
            tracing::info!(grace = ?grace, "SIGTERM: /readyz now 503; closing the listener after the drain grace");
            tokio::time::sleep(grace).await;
        } else {
            tracing::info!("SIGINT: draining now");
        }
    };
    let connection_limits = server::ConnectionLimits {
        max_connections,
        header_timeout: settings.header_timeout,
    };
    server::serve(
        listener,
        endpoints::router(state.clone()),
        connection_limits,
        metrics.clone(),
        close,
    )
    .await;
    // Requests whose client left before the answer still finish: each is bounded by the
    // claim wait and the append timeout.
    state.requests.close();
    if tokio::time::timeout(REQUESTS_DRAIN, state.requests.wait())
        .await
        .is_err()
    {
        tracing::warn!("intake requests did not finish within the drain limit");
    }
    drop(state);
    tracing::info!("listener closed; flushing batches");
    let _ = stop_writer.send(true);
    // The writer ends within its drain deadline; its thread is joined off the runtime.
    let _ = tokio::task::spawn_blocking(move || writer.join()).await;
    let _ = reloader.await;
    let _ = pruner.await;
    tracing::info!("collector: stopped");
    Ok(())
}

/// `collector spool dump`.
fn spool_command(settings: &Settings, command: SpoolCommand) -> Result<(), RunError> {
    let SpoolCommand::Dump { all } = command;
    let dir = &settings.spool_dir;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let summary = match spool::dump::dump(dir, all, &mut out) {
        Ok(s) => s,
        // `collector spool dump | head`: the reader has seen enough.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
        Err(e) => return Err(failed(format!("spool folder {}: {e}", dir.display()))),
    };
    eprintln!(
        "collector: {} rows in {} frames of {} segments ({}); cursor at segment {} offset {}{}",
        summary.rows,
        summary.frames,
        summary.segments,
        if all {
            "all on disk"
        } else {
            "not yet confirmed by ClickHouse"
        },
        summary.cursor.segment,
        summary.cursor.offset,
        if summary.damaged > 0 {
            format!("; {} frames could not be decoded", summary.damaged)
        } else {
            String::new()
        }
    );
    Ok(())
}

/// Waits for SIGTERM (returns `true`: drain with grace) or SIGINT (`false`: no grace).
async fn shutdown_signal() -> bool {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => true,
        _ = int.recv() => false,
    }
}

/// `collector probe`: `GET /readyz` on the listen address (an unspecified address such as
/// `0.0.0.0` is probed on loopback), 2 s at most.
async fn probe(settings: &Settings) -> Result<(), RunError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut addr = settings.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let check = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /readyz HTTP/1.0\r\nHost: probe\r\n\r\n")
            .await?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(head)
    };
    match tokio::time::timeout(std::time::Duration::from_secs(2), check).await {
        Ok(Ok(head)) if head.ends_with(b" 200") => Ok(()),
        Ok(Ok(head)) => Err(failed(format!(
            "{addr}: /readyz answered {}",
            String::from_utf8_lossy(&head)
        ))),
        Ok(Err(e)) => Err(failed(format!("{addr}: {e}"))),
        Err(_) => Err(failed(format!("{addr}: no answer within 2 s"))),
    }
}

/// The settings store for one-shot commands (no backoff: one attempt, then exit).
pub(crate) fn cli_store(settings: &Settings) -> Result<settings::SettingsStore, RunError> {
    settings::SettingsStore::new(
        &settings.database_url,
        std::time::Duration::ZERO,
        Arc::new(metrics::Metrics::new()),
    )
    .map_err(failed)
}

async fn sites(settings: &Settings, command: SitesCommand) -> Result<(), RunError> {
    let store = cli_store(settings)?;
    match command {
        SitesCommand::Add {
            key,
            origins,
            sample_rate,
            disabled,
        } => {
            if !beacon::is_site_key(&key) {
                return Err(RunError::Usage(format!(
                    "--key {key:?}: must be 1 to 64 characters from A-Za-z0-9._-"
                )));
            }
            if !(0.0..=1.0).contains(&sample_rate) {
                return Err(RunError::Usage(format!(
                    "--sample-rate {sample_rate}: must be between 0 and 1"
                )));
            }
            let mut allowed = Vec::new();
            for o in &origins {
                allowed.push(settings::normalise_origin(o).ok_or_else(|| {
                    RunError::Usage(format!("--origin {o:?}: not an http(s) origin"))
                })?);
            }
            let site = settings::Site {
                key,
                allowed_origins: allowed,
                sample_rate,
                enabled: !disabled,
            };
            store.upsert(&site).await.map_err(failed)?;
            println!("site {} saved", site.key);
        }
        SitesCommand::List => {
            for s in store.fetch_all().await.map_err(failed)? {
                let origins = if s.allowed_origins.is_empty() {
                    "*".to_owned()
                } else {
                    s.allowed_origins.join(",")
                };
                println!(
                    "{}\t{}\tsample_rate={}\torigins={}",
                    s.key,
                    if s.enabled { "enabled" } else { "disabled" },
                    s.sample_rate,
                    origins
                );
            }
        }
        SitesCommand::Disable { key } | SitesCommand::Enable { key }
            if !beacon::is_site_key(&key) =>
        {
            return Err(RunError::Usage(format!("{key:?}: not a site key")));
        }
        SitesCommand::Disable { key } => set_enabled(&store, &key, false).await?,
        SitesCommand::Enable { key } => set_enabled(&store, &key, true).await?,
    }
    Ok(())
}

async fn set_enabled(
    store: &settings::SettingsStore,
    key: &str,
    enabled: bool,
) -> Result<(), RunError> {
    if store.set_enabled(key, enabled).await.map_err(failed)? {
        println!(
            "site {key} {}",
            if enabled { "enabled" } else { "disabled" }
        );
        Ok(())
    } else {
        Err(RunError::Failed(format!("no site {key:?}")))
    }
}

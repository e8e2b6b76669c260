//! The composition root of `collector serve`: builds every part from the configuration (the
//! listener, the spool, the settings store and its cache, the dedup window, the limits, the
//! writer and its replicas), wires them, serves, and on SIGTERM or SIGINT drains them in order:
//! `/readyz` 503 for the grace, the listener closed, in-flight requests finished, the writer
//! flushed within its deadline.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::cli::{self, failed, RunError};
use crate::config::Config;
use crate::{
    beacon, dedup, endpoints, geo, limits, logging, measurement, metrics, purges, sampling, script,
    server, settings, shards, spool, state, useragent, writer,
};

/// File descriptors kept for the collector's own use besides client connections: standard
/// streams, the runtime's epoll, event and signal descriptors, the listener, the spool's files
/// (lock, the segments being written and read, cursor, identity, settings snapshot, kept-aside
/// batches), the settings store's pool ([`settings::store::POOL_SIZE`] connections plus those
/// being opened) and the ClickHouse connections (per replica: pooled and fresh ones for
/// inserts, probes and schema checks). About 50 with three replicas; the reserve is five times
/// that, so that client connections can never take the descriptors the spool and the
/// databases need (an `EMFILE` there would answer 503 or stall the writer).
pub const RESERVED_FDS: usize = 256;
/// Connections the operations listener holds at most (Prometheus, a health check, an
/// operator).
pub const ADMIN_CONNECTIONS: usize = 64;
/// On shutdown, how long intake requests whose client has gone may take to finish after the
/// listener closed: longer than a request's own bounds (the claim wait and the append
/// timeout, 5 s each).
pub const REQUESTS_DRAIN: std::time::Duration = std::time::Duration::from_secs(12);

/// The open-connection cap to serve with: `COLLECTOR_MAX_CONNECTIONS`, lowered to what the
/// open-files limit holds once [`RESERVED_FDS`] are set aside. The soft limit is first raised
/// to the hard limit. Lowering the default (20,000) is logged at info level, as it is the
/// normal case on a host whose hard limit is about 20,000 (this project's CI VM: 20,000);
/// lowering a value that was set explicitly is a warning.
fn connection_limit(config: &Config) -> usize {
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
    let wanted = config.server.max_connections;
    if wanted <= holds {
        return wanted;
    }
    let cap = holds.max(1);
    if config.server.max_connections_set {
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

/// `collector serve`: runs until SIGTERM or SIGINT, then drains; `Ok` once drained. The
/// production seams: the `sites` table in PostgreSQL ([`settings::SettingsStore`]) and the
/// ClickHouse replicas of `COLLECTOR_CLICKHOUSE_URLS` over HTTP.
pub async fn serve(config: Config) -> Result<(), RunError> {
    // Listen first: a taken address is reported before anything else starts.
    let listener = bind(config.server.listen, "COLLECTOR_LISTEN").await?;
    let admin = bind(config.server.admin_listen, "COLLECTOR_ADMIN_LISTEN").await?;
    let metrics = Arc::new(metrics::Metrics::new());
    let store = settings::SettingsStore::new(
        &config.settings.database_url,
        config.settings.password.as_ref(),
        config.settings.backoff,
        metrics.clone(),
    )
    .map_err(failed)?;
    let seams = Seams {
        listener,
        admin,
        sites: Arc::new(store),
        metrics,
    };
    run(config, seams, shutdown_signal()).await
}

/// A listener on `addr`, or an error naming the setting.
async fn bind(
    addr: std::net::SocketAddr,
    setting: &str,
) -> Result<tokio::net::TcpListener, RunError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| failed(format!("cannot listen on {addr} ({setting}): {e}")))
}

/// What [`run`] is given besides the configuration: the listener and the site source. The
/// other seam, ClickHouse, is `config.clickhouse.shards`: any server that answers
/// ClickHouse's HTTP interface (the in-process tests start one in memory).
pub struct Seams {
    /// The bound listener intake serves on.
    pub listener: tokio::net::TcpListener,
    /// The bound operations listener (`/metrics`, `/readyz` with its reason).
    pub admin: tokio::net::TcpListener,
    /// Where site settings come from.
    pub sites: Arc<dyn settings::SiteSource>,
    /// The metrics registry every part reports to (shared with `sites` when it reports too).
    pub metrics: Arc<metrics::Metrics>,
}

/// Builds every part from `config` and `seams`, serves until `stop` resolves, then drains:
/// with `stop` answering `true` (SIGTERM), `/readyz` is 503 for `COLLECTOR_DRAIN_GRACE` before
/// the listener closes; with `false` (SIGINT) the listener closes at once. Then in-flight
/// intake requests finish (at most [`REQUESTS_DRAIN`]) and the writer flushes within its
/// deadline ([`writer::DRAIN_DEADLINE`]). `Ok` once drained; an error when a part cannot start
/// (the spool locked or unreadable, the writer thread).
pub async fn run(
    config: Config,
    seams: Seams,
    stop: impl std::future::Future<Output = bool> + Send + 'static,
) -> Result<(), RunError> {
    let max_connections = connection_limit(&config);
    let Seams {
        listener,
        admin,
        sites,
        metrics,
    } = seams;
    metrics
        .intake
        .init(beacon::rejection_reasons(), measurement::optional_fields());
    let countries = match &config.intake.geo_db {
        Some(path) => geo::Countries::open(path)
            .map_err(|e| RunError::Usage(format!("COLLECTOR_GEO_DB={:?}: {e}", path.display())))?,
        None => geo::Countries::none(),
    };
    let (site_settings, (spools, readers, at_open)) =
        settings_and_spools(&config, sites.clone(), &metrics).await?;
    let state = intake_state(
        &config,
        site_settings.clone(),
        spools,
        countries.clone(),
        &metrics,
    );
    let (stop_writer, shutdown) = watch::channel(false);
    let background = [
        tokio::spawn(state.bounds.limits.clone().run_pruner(shutdown.clone())),
        tokio::spawn(state.sites.sampler.clone().run(shutdown.clone())),
        tokio::spawn(site_settings.clone().run_reloader(shutdown.clone())),
        tokio::spawn(apply_retention(config.clone(), shutdown.clone())),
        tokio::spawn(countries.run_reloader(shutdown.clone())),
        tokio::spawn(purges::run(
            config.clone(),
            sites,
            site_settings.clone(),
            at_open,
            shutdown.clone(),
        )),
    ];
    let writer = start_writer(&config, readers, &metrics, site_settings.purged(), shutdown)?;
    tracing::info!(listen = %config.server.listen, shards = config.clickhouse.shards.len(), replicas = config.clickhouse.urls().count(), "collector: serving");

    let connection_limits = server::ConnectionLimits {
        max_connections,
        header_timeout: config.server.header_timeout,
    };
    let (close_admin, admin_server) = serve_admin(admin, &state, connection_limits, &metrics);
    let close = close_on(stop, state.clone(), config.server.drain_grace);
    let router = endpoints::router(state.clone());
    server::serve(listener, router, connection_limits, metrics, close).await;
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
    for task in background {
        let _ = task.await;
    }
    let _ = close_admin.send(());
    let _ = admin_server.await;
    tracing::info!("collector: stopped");
    Ok(())
}

/// Starts the operations listener on `admin` ([`ADMIN_CONNECTIONS`] connections at most). It
/// answers through the whole drain (`/readyz` 503 with why) and closes last: when the sender
/// returned is used or dropped; the handle ends once it closed.
fn serve_admin(
    admin: tokio::net::TcpListener,
    state: &state::AppState,
    limits: server::ConnectionLimits,
    metrics: &Arc<metrics::Metrics>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (close_admin, admin_closed) = tokio::sync::oneshot::channel::<()>();
    let admin_limits = server::ConnectionLimits {
        max_connections: ADMIN_CONNECTIONS,
        ..limits
    };
    let server = tokio::spawn(server::serve(
        admin,
        endpoints::admin_router(state.clone()),
        admin_limits,
        metrics.clone(),
        async move {
            let _ = admin_closed.await;
        },
    ));
    (close_admin, server)
}

/// The site settings, then the spools: what an earlier release left in them is held to the
/// sites' rules at open (contract v5 §5).
async fn settings_and_spools(
    config: &Config,
    sites: Arc<dyn settings::SiteSource>,
    metrics: &Arc<metrics::Metrics>,
) -> Result<(settings::SiteSettings, OpenSpools), RunError> {
    make_spool_folder(config);
    let site_settings = load_site_settings(config, sites, metrics).await;
    let spools = open_spools(config, &site_settings, metrics).await?;
    Ok((site_settings, spools))
}

/// The spools opened: the appending sides, each shard's reading side, and per purged site the
/// rows of it deleted at open.
type OpenSpools = (shards::ShardSpools, Vec<Readers>, Vec<(String, i64)>);

/// Opens every shard's spool ([`shards::open`]), holding what an earlier release left in it to
/// the rules the site settings make ([`purges::rules`]); with, per purged site, the rows of it
/// deleted then. Blocking file work, off the runtime's threads.
async fn open_spools(
    config: &Config,
    site_settings: &settings::SiteSettings,
    metrics: &Arc<metrics::Metrics>,
) -> Result<OpenSpools, RunError> {
    let rules = purges::rules(site_settings);
    let (config, metrics) = (config.clone(), metrics.clone());
    let opened = tokio::task::spawn_blocking(move || {
        let opened = shards::open(&config, &rules, &metrics);
        let at_open = rules
            .purged()
            .map(|s| (s.to_owned(), rules.dropped_of(s) as i64))
            .collect();
        opened.map(|(spools, readers)| (spools, readers, at_open))
    })
    .await
    .map_err(|e| failed(format!("opening the spools: {e}")))?;
    opened.map_err(|e| match e {
        shards::OpenError::Orphaned(_) => RunError::Usage(e.to_string()),
        shards::OpenError::Spool(_) => failed(e),
    })
}

/// Makes the spool folder, private as the spool makes it, so that the first settings load's
/// snapshot has a place before the spools open; a failure is the spool's to say.
fn make_spool_folder(config: &Config) {
    use std::os::unix::fs::DirBuilderExt;
    let made = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(spool::files::DIR_MODE)
        .create(&config.spool.dir);
    if let Err(e) = made {
        tracing::debug!(error = %e, "cannot make the spool folder yet; opening the spool says why");
    }
}

/// A shard's configuration and the reading side of its spool.
type Readers = (crate::config::ShardConfig, spool::SpoolReader);

/// The site settings cache over `sites`, loaded whole from the store, or from the snapshot in
/// the spool folder while the store is unreachable, or else left to load site by site.
async fn load_site_settings(
    config: &Config,
    sites: Arc<dyn settings::SiteSource>,
    metrics: &Arc<metrics::Metrics>,
) -> settings::SiteSettings {
    let snapshot = settings::snapshot::path(&config.spool.dir);
    let site_settings =
        settings::SiteSettings::new(sites, config.settings.ttl, Some(snapshot), metrics.clone());
    match site_settings.reload().await {
        Ok(n) => tracing::info!(sites = n, "settings: loaded every site"),
        Err(e) => {
            if let Err(snap) = site_settings.load_snapshot().await {
                tracing::warn!(error = %e, snapshot = %snap, "settings: store unreachable and no snapshot; loading on demand");
            }
        }
    }
    site_settings
}

/// The state the endpoints share: intake's stations and what the other routes read.
pub(crate) fn intake_state(
    config: &Config,
    site_settings: settings::SiteSettings,
    spools: shards::ShardSpools,
    countries: geo::Countries,
    metrics: &Arc<metrics::Metrics>,
) -> state::AppState {
    let intake = &config.intake;
    state::AppState::new(state::Inner {
        sites: state::Sites {
            sampler: sampling::Sampler::new(intake.site_rate, metrics.clone()),
            settings: site_settings,
            dimension_values: Default::default(),
        },
        senders: state::Senders {
            user_agents: {
                // Compiled before the listener opens, so that no beacon waits for it.
                useragent::UserAgents::warm_up();
                useragent::UserAgents::default()
            },
            trusted_proxies: intake.trusted_proxies.clone(),
            client_ip_header: intake.client_ip_header,
            countries,
        },
        storage: state::Storage {
            dedup: dedup::Dedup::new(intake.dedup_capacity, intake.dedup_window),
            spools,
        },
        bounds: state::Bounds {
            limits: limits::Limits::new(intake.client_rate, intake.site_rate, intake.max_in_flight),
            body_timeout: config.server.body_timeout,
        },
        script: script::Script::default(),
        metrics: metrics.clone(),
        draining: Default::default(),
        requests: TaskTracker::new(),
    })
}

/// Starts the writer thread over each shard's spool's reading side, with that shard's
/// replicas; it runs until `shutdown` turns true and every shard's drain ends.
fn start_writer(
    config: &Config,
    readers: Vec<(crate::config::ShardConfig, spool::SpoolReader)>,
    metrics: &Arc<metrics::Metrics>,
    purged: watch::Receiver<settings::PurgedSites>,
    shutdown: watch::Receiver<bool>,
) -> Result<std::thread::JoinHandle<()>, RunError> {
    let ch = &config.clickhouse;
    let batch_limits = writer::BatchLimits {
        max_rows: ch.batch_max_rows,
        max_bytes: ch.batch_max_bytes,
        max_age: ch.batch_max_age,
    };
    let shards = readers
        .into_iter()
        .enumerate()
        .map(|(position, (shard, reader))| {
            let expected = crate::clickhouse::cluster::Expected {
                shard: position,
                replicas: ch.shards.iter().map(|s| s.urls.len()).collect(),
            };
            writer::ShardWriter {
                reader,
                replicas: writer::Replicas::new(ch, &shard, metrics.clone()),
                probing: writer::probe::Options {
                    database: ch.database.clone(),
                    max_delay: ch.catchup_max_delay,
                    form: ch.table_form,
                    distributed: ch.sharded().then(|| (ch.cluster.clone(), expected)),
                },
            }
        })
        .collect();
    writer::spawn(shards, batch_limits, metrics.clone(), purged, shutdown)
        .map_err(|e| failed(format!("cannot start the writer thread: {e}")))
}

/// Applies the retention (`COLLECTOR_RETENTION`, [`cli::retention`]) at start and every
/// [`cli::retention::EVERY`] until `shutdown` turns true. It only deletes what has expired, so
/// several collectors doing it is harmless; a server that fails is tried again the next time.
async fn apply_retention(config: Config, mut shutdown: watch::Receiver<bool>) {
    loop {
        let run = cli::retention::run_once(
            &config,
            |line| tracing::info!("{line}"),
            |line| tracing::warn!("{line}"),
        );
        // A server that hangs must not hold the drain.
        let failed = tokio::select! {
            failed = run => failed,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        if !failed.is_empty() {
            tracing::warn!(servers = %failed.join(", "), "retention: tried again in a day");
        }
        tokio::select! {
            () = tokio::time::sleep(cli::retention::EVERY) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// When the listener closes: `stop` answered, `/readyz` turned 503, and, for a SIGTERM
/// (`stop` answering `true`), the drain grace passed.
async fn close_on(
    stop: impl std::future::Future<Output = bool>,
    state: state::AppState,
    grace: std::time::Duration,
) {
    let with_grace = stop.await;
    state.start_draining();
    if with_grace {
        tracing::info!(grace = ?grace, "SIGTERM: /readyz now 503; closing the listener after the drain grace");
        tokio::time::sleep(grace).await;
    } else {
        tracing::info!("SIGINT: draining now");
    }
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

//! `collector report --site KEY [--days N] [--by page_group|device_type|country|browser|dimension:NAME]
//! [--crux | --compare NAME=A,B | --deploy T] [--format table|json] [--html FILE]` (contract v4
//! and v5 §1): a site's numbers at a glance, its CrUX view, or two groups of its page views
//! compared with confidence, from ClickHouse ([`crate::report`]).
//!
//! The query goes to the servers of `COLLECTOR_CLICKHOUSE_URLS` in order, as the configured
//! user, until one answers: every replica holds every row, so any one that answers will do.
//! A site of which no server that answered holds a single row is unknown (exit 1, as `sites
//! update` of an unknown key).

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;

use super::RunError;
use crate::config::Config;
use crate::report::compare::{self, Sides};
use crate::report::{self, crux, crux_days, sql, GroupBy, Report};

/// The longest range a report covers: the longest retention (100 years).
pub const MAX_DAYS: u32 = 36_525;
/// How long one server may take to answer before the next is asked.
pub const SERVER_TIMEOUT: Duration = Duration::from_secs(60);
/// How far past now the range reaches: a page view's time comes from the browser's clock,
/// which may run up to 5 minutes ahead (contract §2, `ts`).
const AHEAD: u64 = 300;

/// `collector report`'s options.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The site key.
    #[arg(long)]
    pub site: String,
    /// How many days back from now (page views by `page_view_at`); with `--deploy`, the days
    /// before and the days after the instant.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=MAX_DAYS as i64))]
    pub days: u32,
    /// What page views are grouped by: device_type, country, browser, page_group or
    /// dimension:NAME.
    #[arg(long, default_value = "device_type", value_parser = clap::value_parser!(GroupBy))]
    pub by: GroupBy,
    /// The CrUX view: the 28 complete UTC days before today, per form factor, Chromium-based
    /// browsers only, hard navigations and with soft ones, with a daily trend.
    #[arg(long, conflicts_with_all = ["by", "days", "compare", "deploy"])]
    pub crux: bool,
    /// Compare two values of a dimension, `NAME=A,B` (e.g. `release=412,413`): each p75 with its
    /// 95 % confidence interval, and B − A with its own.
    #[arg(long, value_name = "NAME=A,B", value_parser = compare::parse_compare, conflicts_with_all = ["by", "deploy"])]
    pub compare: Option<Sides>,
    /// Compare the `--days` before instant T (RFC 3339, UTC) with the `--days` after it.
    #[arg(long, value_name = "T", value_parser = compare::parse_deploy, conflicts_with = "by")]
    pub deploy: Option<u64>,
    /// `table` for people, `json` for programs (the figures unrounded, shares 0 to 1).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Also write the report as one self-contained HTML page with charts to this file.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

impl ReportArgs {
    /// What is compared, if anything.
    fn sides(&self) -> Option<Sides> {
        self.compare.clone().or(self.deploy.map(Sides::Deploy))
    }
}

/// How the report is printed on standard output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// An aligned table.
    Table,
    /// One JSON document: every figure the table shows, as docs/contract.md lists them.
    Json,
}

/// How `collector report` fails.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The key is not a site key (exit 2).
    #[error("{0:?}: a site key is 1 to 64 characters from A-Za-z0-9._-")]
    BadKey(String),
    /// No server that answered holds a row of the site (exit 1).
    #[error("no site {site:?}: {server} holds no page view of it")]
    UnknownSite {
        /// The key asked for.
        site: String,
        /// The server that answered.
        server: String,
    },
    /// No server answered (exit 1); each with its error.
    #[error("no ClickHouse server answered: {}", .0.join("; "))]
    NoServer(Vec<String>),
    /// A server answered something the report cannot read (exit 1).
    #[error("{server} answered what the report cannot read: {why}")]
    BadAnswer {
        /// The server.
        server: String,
        /// What was wrong.
        why: report::ReportDataError,
    },
    /// One server's query failed (a step of [`ReportError::NoServer`]).
    #[error("{}", crate::logging::chain(.0))]
    Query(#[from] clickhouse::error::Error),
    /// One server gave no answer within [`SERVER_TIMEOUT`] (a step of
    /// [`ReportError::NoServer`]).
    #[error("no answer within {:?}", SERVER_TIMEOUT)]
    Timeout,
    /// One server's answer cannot be read (a step of [`ReportError::NoServer`]).
    #[error(transparent)]
    Answer(#[from] report::ReportDataError),
    /// The HTML file could not be written (exit 1).
    #[error("--html {0}: {1}")]
    Html(String, std::io::Error),
    /// With several shards, the site's shard could not be found in the settings store, or is
    /// not one of the configured shards (exit 1).
    #[error("the shard of site {site:?}: {why}")]
    Shard {
        /// The key asked for.
        site: String,
        /// Why not.
        why: String,
    },
}

impl From<ReportError> for RunError {
    fn from(e: ReportError) -> RunError {
        match e {
            ReportError::BadKey(_) => RunError::Usage(e.to_string()),
            _ => RunError::Failed(e.to_string()),
        }
    }
}

/// One of the report's views, ready to print.
#[derive(Debug, serde::Serialize)]
#[serde(untagged)]
pub enum View {
    /// Per group (`--by`).
    Groups(Report),
    /// `--crux`.
    Crux(crux::CruxReport),
    /// `--compare` or `--deploy`.
    Comparison(compare::Comparison),
}

impl View {
    /// The terminal table.
    fn table(&self) -> String {
        match self {
            View::Groups(r) => report::table::render(r),
            View::Crux(r) => report::table::render_crux(r),
            View::Comparison(r) => report::table::render_comparison(r),
        }
    }

    /// The HTML page.
    fn html(&self) -> String {
        match self {
            View::Groups(r) => report::html::render(r),
            View::Crux(r) => report::html::render_crux(r),
            View::Comparison(r) => report::html::render_comparison(r),
        }
    }
}

/// Runs `collector report`.
pub async fn run(config: &Config, args: ReportArgs) -> Result<(), RunError> {
    if !crate::beacon::is_site_key(&args.site) {
        return Err(ReportError::BadKey(args.site).into());
    }
    if let Some(path) = &args.html {
        // Before the queries: a page that cannot be written is said at once.
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        if parent.is_some_and(|p| !p.is_dir()) {
            let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such folder");
            return Err(ReportError::Html(path.display().to_string(), missing).into());
        }
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let view = if args.crux {
        View::Crux(fetch_crux(config, &args.site, now).await?)
    } else if let Some(sides) = args.sides() {
        View::Comparison(fetch_comparison(config, &args, &sides, now).await?)
    } else {
        View::Groups(fetch(config, &args, now).await?)
    };
    match args.format {
        Format::Table => print!("{}", view.table()),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&view).map_err(super::failed)?
        ),
    }
    if let Some(path) = &args.html {
        std::fs::write(path, view.html())
            .map_err(|e| ReportError::Html(path.display().to_string(), e))?;
        if args.format == Format::Table {
            println!("\nHTML report written to {}", path.display());
        }
    }
    Ok(())
}

/// The shard the site lives on (contract v5 §3), as its settings name it: a shard this
/// configuration does not list is an error (a shell without `COLLECTOR_CLICKHOUSE_SHARDS`
/// would read the wrong servers). With one configured shard, and the settings store
/// unreachable or without the site (rows written by other means), that shard, as before
/// shards.
async fn shard_of<'c>(
    config: &'c Config,
    site: &str,
) -> Result<&'c crate::config::ShardConfig, ReportError> {
    let err = |why: String| ReportError::Shard {
        site: site.to_owned(),
        why,
    };
    let found = match super::cli_store(config) {
        Ok(store) => store.fetch(site).await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let name = match (found, &config.clickhouse.shards[..]) {
        (Ok(Some(settings)), _) => settings.shard,
        (Ok(None) | Err(_), [only]) => return Ok(only),
        (Ok(None), _) => return Err(err("no such site in the settings store".into())),
        (Err(e), _) => return Err(err(e)),
    };
    config.clickhouse.shard(&name).ok_or_else(|| {
        err(format!(
            "shard {name} is not one this configuration lists (COLLECTOR_CLICKHOUSE_SHARDS)"
        ))
    })
}

/// What the first replica of the site's shard that answers, asked in the configured order,
/// says to `ask`, and which server that was: a shard that is down stops only its own sites'
/// reports. `ask` answers `None` when the server holds no row of the site at all.
async fn first_answer<T, F, Fut>(
    config: &Config,
    site: &str,
    ask: F,
) -> Result<(T, String), ReportError>
where
    F: Fn(clickhouse::Client) -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, ReportError>>,
{
    let shard = shard_of(config, site).await?;
    let mut problems = Vec::new();
    for url in &shard.urls {
        let url = url.as_str().trim_end_matches('/');
        let client = crate::clickhouse::client(url, &config.clickhouse, false);
        let answer = tokio::time::timeout(SERVER_TIMEOUT, ask(client))
            .await
            .unwrap_or(Err(ReportError::Timeout));
        match answer {
            Ok(None) => {
                return Err(ReportError::UnknownSite {
                    site: site.to_owned(),
                    server: url.to_owned(),
                })
            }
            Ok(Some(found)) => return Ok((found, url.to_owned())),
            Err(e) => problems.push(format!("{url}: {e}")),
        }
    }
    Err(ReportError::NoServer(problems))
}

/// Whether the server behind `client` holds any row of `site` (any time, bots too).
async fn known(
    client: &clickhouse::Client,
    database: &str,
    site: &str,
) -> Result<bool, ReportError> {
    let n: u64 = client
        .query(&sql::known_query(database, site))
        .fetch_one()
        .await?;
    Ok(n > 0)
}

/// The report per group (`--by`).
async fn fetch(config: &Config, args: &ReportArgs, now: u64) -> Result<Report, ReportError> {
    let to = now + AHEAD;
    let from = now.saturating_sub(u64::from(args.days) * 86_400);
    let database = &config.clickhouse.database;
    let query = sql::report_query(database, &args.site, &args.by, from, to);
    let (groups, server) = first_answer(config, &args.site, |client| {
        let query = &query;
        async move {
            let rows: Vec<sql::Row> = client.query(query).fetch_all().await?;
            if rows.is_empty() && !known(&client, database, &args.site).await? {
                return Ok(None);
            }
            rows.into_iter()
                .map(sql::Row::figures)
                .collect::<Result<Vec<_>, _>>()
                .map(Some)
                .map_err(ReportError::Answer)
        }
    })
    .await?;
    Ok(Report {
        site: args.site.clone(),
        days: args.days,
        by: args.by.clone(),
        from: sql::utc(from),
        to: sql::utc(to),
        server,
        groups,
    })
}

/// The CrUX view (`--crux`).
async fn fetch_crux(
    config: &Config,
    site: &str,
    now: u64,
) -> Result<crux::CruxReport, ReportError> {
    let range = crux::range(now);
    let database = &config.clickhouse.database;
    let (rows, server) = first_answer(config, site, |client| async move {
        let rows = crux_rows(&client, database, site, range).await?;
        if rows.is_empty() && !known(&client, database, site).await? {
            return Ok(None);
        }
        Ok(Some(rows))
    })
    .await?;
    crux::assemble(site, &server, range, rows).map_err(|why| ReportError::BadAnswer { server, why })
}

/// The CrUX view's answer from one server: the days its roll-up holds as they are now read
/// from it; the others computed from the rows, stored in the roll-up where the server lets this
/// user write it, and read (docs/queries.md, "The CrUX view"). A server without the roll-up's
/// tables, or a user that may not write them, still gets the whole view from the rows; a line
/// on stderr says so.
async fn crux_rows(
    client: &clickhouse::Client,
    database: &str,
    site: &str,
    (from, to): (u64, u64),
) -> Result<Vec<sql::Row>, ReportError> {
    let found: Vec<crux_days::DayRows> = client
        .query(&crux_days::rows_query(database, site, from, to))
        .fetch_all()
        .await?;
    let marks = client
        .query(&crux_days::marks_query(database, site, from, to))
        .fetch_all::<crux_days::Mark>()
        .await;
    let rows_sql = crux_days::rows_query(database, site, from, to);
    let mut plan = crux_days::plan(&found, marks.as_deref().unwrap_or_default());
    let days: Vec<u16> = plan.stale.iter().map(|d| d.day).collect();
    let computation: u64 = rand::random();
    let store = crux_days::store_query(database, site, &days, computation);
    if let (Ok(_), Some(store)) = (&marks, store) {
        let stored = async {
            client.query(&store).execute().await?;
            let groups: Vec<crux_days::StoredGroups> = client
                .query(&crux_days::groups_query(database, site, computation))
                .fetch_all()
                .await?;
            let now: Vec<crux_days::DayRows> = client.query(&rows_sql).fetch_all().await?;
            let marked = plan.unchanged(&now);
            if !marked.is_empty() {
                let marks = crux_days::marks_insert(database, site, &marked, &groups, computation);
                client.query(&marks).execute().await?;
            }
            Ok::<_, clickhouse::error::Error>(marked)
        };
        match stored.await {
            Ok(marked) => plan.stored_as(computation, &marked),
            Err(e) => eprintln!(
                "collector: the CrUX roll-up was not written ({}); {} days read from the rows",
                crate::logging::chain(&e),
                days.len()
            ),
        }
    } else if let Err(e) = &marks {
        eprintln!(
            "collector: no CrUX roll-up on this server ({e}; `collector migrate` makes it); the view reads every row"
        );
    }
    let days: Vec<u16> = plan.stale.iter().map(|d| d.day).collect();
    let sources: Vec<String> = [
        crux_days::stored_select(database, site, &plan.stored),
        crux_days::cohort_select(database, site, &days),
    ]
    .into_iter()
    .flatten()
    .collect();
    if sources.is_empty() {
        return Ok(Vec::new());
    }
    Ok(client
        .query(&crux_days::query(&sources))
        .fetch_all()
        .await?)
}

/// The comparison (`--compare` or `--deploy`).
async fn fetch_comparison(
    config: &Config,
    args: &ReportArgs,
    sides: &Sides,
    now: u64,
) -> Result<compare::Comparison, ReportError> {
    let range = sides.range(args.days, now);
    let database = &config.clickhouse.database;
    let site = &args.site;
    let (answer, server) = first_answer(config, site, |client| async move {
        let sums_sql = compare::sums_query(database, site, sides, range);
        let rows: Vec<compare::SumsRow> = client.query(&sums_sql).fetch_all().await?;
        if rows.is_empty() && !known(&client, database, site).await? {
            return Ok(None);
        }
        let sums = compare::sums_by_side(rows);
        let spread_sql = compare::spread_query(database, site, sides, range, &sums);
        // Neither side with a row in the range: the server answers no row at all (not an
        // outage): both sides have no data.
        let spread: compare::SpreadRow = client
            .query(&spread_sql)
            .fetch_optional()
            .await?
            .unwrap_or_default();
        let levels = compare::levels(&sums, &spread);
        let q_sql = compare::quantiles_query(database, site, sides, range, &levels);
        let quantiles: compare::QuantilesRow = client
            .query(&q_sql)
            .fetch_optional()
            .await?
            .unwrap_or_default();
        Ok(Some((sums, quantiles)))
    })
    .await?;
    let (sums, quantiles) = answer;
    compare::assemble(site, &server, sides, range, &sums, &quantiles)
        .map_err(|why| ReportError::BadAnswer { server, why })
}

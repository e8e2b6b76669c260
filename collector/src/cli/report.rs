//! `collector report --site KEY [--days N] [--by page_group|device_type|country|browser] [--format
//! table|json] [--html FILE]` (contract v4 §1): a site's numbers at a glance, from ClickHouse
//! ([`crate::report`]).
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
use crate::report::{self, sql, GroupBy, Report};

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
    /// How many days back from now (page views by `page_view_at`).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=MAX_DAYS as i64))]
    pub days: u32,
    /// What page views are grouped by.
    #[arg(long, value_enum, default_value_t = GroupBy::DeviceType)]
    pub by: GroupBy,
    /// `table` for people, `json` for programs (the figures unrounded, shares 0 to 1).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Also write the report as one self-contained HTML page with charts to this file.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

/// How the report is printed on standard output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// An aligned table.
    Table,
    /// One JSON document ([`Report`]'s fields).
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

/// Runs `collector report`.
pub async fn run(config: &Config, args: ReportArgs) -> Result<(), RunError> {
    if !crate::beacon::is_site_key(&args.site) {
        return Err(ReportError::BadKey(args.site).into());
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let report = fetch(config, &args, now).await?;
    match args.format {
        Format::Table => print!("{}", report::table::render(&report)),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(super::failed)?
        ),
    }
    if let Some(path) = &args.html {
        std::fs::write(path, report::html::render(&report))
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

/// The report from the first replica of the site's shard that answers, asked in the
/// configured order: a shard that is down stops only its own sites' reports.
async fn fetch(config: &Config, args: &ReportArgs, now: u64) -> Result<Report, ReportError> {
    let to = now + AHEAD;
    let from = now.saturating_sub(u64::from(args.days) * 86_400);
    let database = &config.clickhouse.database;
    let query = sql::report_query(database, &args.site, args.by, from, to);
    let shard = shard_of(config, &args.site).await?;
    let mut problems = Vec::new();
    for url in &shard.urls {
        let url = url.as_str().trim_end_matches('/');
        let client = crate::clickhouse::client(url, &config.clickhouse, false);
        let asked = ask(&client, &query, database, &args.site);
        let answer = tokio::time::timeout(SERVER_TIMEOUT, asked)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {SERVER_TIMEOUT:?}")));
        match answer {
            Ok(None) => {
                return Err(ReportError::UnknownSite {
                    site: args.site.clone(),
                    server: url.to_owned(),
                })
            }
            Ok(Some(groups)) => {
                return Ok(Report {
                    site: args.site.clone(),
                    days: args.days,
                    by: args.by,
                    from: sql::utc(from),
                    to: sql::utc(to),
                    server: url.to_owned(),
                    groups,
                })
            }
            Err(e) => problems.push(format!("{url}: {e}")),
        }
    }
    Err(ReportError::NoServer(problems))
}

/// The groups' figures from one server; `None` when it holds no row of the site at all.
async fn ask(
    client: &clickhouse::Client,
    query: &str,
    database: &str,
    site: &str,
) -> Result<Option<Vec<report::GroupFigures>>, String> {
    let chain = |e: clickhouse::error::Error| crate::logging::chain(&e);
    let rows: Vec<sql::Row> = client.query(query).fetch_all().await.map_err(chain)?;
    if rows.is_empty() {
        let known: u64 = client
            .query(&sql::known_query(database, site))
            .fetch_one()
            .await
            .map_err(chain)?;
        if known == 0 {
            return Ok(None);
        }
    }
    rows.into_iter()
        .map(sql::Row::figures)
        .collect::<Result<_, _>>()
        .map(Some)
}

//! One test's databases on a stack ([`TestEnv`]): made, migrated, queried, waited on; and the
//! `collector` command line run against them.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{
    as_i64, clickhouse_exec, clickhouse_query, col, collector_bin, pg_connect, Collector, Diag,
    Stack,
};

/// One test's databases on a stack.
pub struct TestEnv<'a> {
    /// The stack.
    pub stack: &'a Stack,
    /// Name of both the PostgreSQL and the ClickHouse database.
    pub db: String,
    /// Site registered for the test.
    pub site: String,
    /// The ClickHouse servers the collector writes to (the stack's replicas, or its 26.x
    /// server), in preference order.
    pub clickhouse: Vec<String>,
    /// `COLLECTOR_CLICKHOUSE_TABLE_FORM` for the collector and its commands.
    pub table_form: &'static str,
    /// What this test prints when it gives up waiting ([`Diag::give_up`]): its collectors,
    /// its ClickHouse servers' `system.replicas` rows, its shops' beacons, its browsers.
    pub diag: Diag,
}

impl Drop for TestEnv<'_> {
    fn drop(&mut self) {
        self.diag.clear_current();
    }
}

impl<'a> TestEnv<'a> {
    /// Fresh databases on `stack`, migrated, with site `site-1` (any origin) registered. With
    /// `TEST_CLICKHOUSE=ch26` in the environment, on the stack's 26.x server in the
    /// single-server form instead of its 18.16 replicas (`scripts/test.sh` runs the intake
    /// tests so a second time).
    pub async fn new(stack: &'a Stack) -> TestEnv<'a> {
        let env = match std::env::var("TEST_CLICKHOUSE").as_deref() {
            Ok("ch26") => TestEnv::empty_on_ch26(stack).await,
            Ok(other) => panic!("TEST_CLICKHOUSE={other}: only ch26 is known"),
            Err(_) => TestEnv::empty(stack).await,
        };
        env.cli(&["migrate"]).success();
        env.cli(&["sites", "add", "--key", "site-1"]).success();
        env
    }

    /// A fresh, empty PostgreSQL database on `stack`, nothing migrated and no site registered
    /// (for tests that run `migrate` their own way); `site` is `site-1`.
    pub async fn empty(stack: &'a Stack) -> TestEnv<'a> {
        let db = format!("t_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        pg_connect(&stack.database_url("postgres"), "postgres")
            .await
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .expect("create the test database");
        let clickhouse = stack.clickhouse_urls();
        let diag = Diag::new();
        diag.clickhouse(&clickhouse, &db);
        for r in stack.replicas() {
            diag.stack_server(&r.url(), stack.dir(), r.i());
        }
        if let Some(c) = stack.ch26() {
            diag.stack_server(&c.url(), stack.dir(), 0);
        }
        // A failed assertion of this test gets the report a wait that gave up gets.
        diag.make_current();
        TestEnv {
            stack,
            db,
            site: "site-1".into(),
            clickhouse,
            table_form: "replicated",
            diag,
        }
    }

    /// Fresh databases on `stack` whose ClickHouse is the stack's 26.x server alone, in the
    /// single-server table form, migrated, with site `site-1` registered.
    pub async fn on_ch26(stack: &'a Stack) -> TestEnv<'a> {
        let env = TestEnv::empty_on_ch26(stack).await;
        env.cli(&["migrate"]).success();
        env.cli(&["sites", "add", "--key", "site-1"]).success();
        env
    }

    /// As [`TestEnv::empty`], with the stack's 26.x server as the only ClickHouse and the
    /// single-server table form.
    pub async fn empty_on_ch26(stack: &'a Stack) -> TestEnv<'a> {
        let mut env = TestEnv::empty(stack).await;
        env.clickhouse = vec![stack.ch26_url()];
        env.table_form = "single";
        env.diag.clickhouse(&env.clickhouse, &env.db);
        env
    }

    /// Environment for a collector process using this test's databases.
    pub fn collector_env(&self) -> Vec<(String, String)> {
        vec![
            (
                "COLLECTOR_DATABASE_URL".into(),
                self.stack.database_url(&self.db),
            ),
            (
                "COLLECTOR_CLICKHOUSE_URLS".into(),
                self.clickhouse.join(","),
            ),
            ("COLLECTOR_CLICKHOUSE_DATABASE".into(), self.db.clone()),
            (
                "COLLECTOR_CLICKHOUSE_TABLE_FORM".into(),
                self.table_form.into(),
            ),
        ]
    }

    /// Runs `collector ARGS` against this test's databases.
    pub fn cli(&self, args: &[&str]) -> CliOutput {
        self.cli_with(&[], args)
    }

    /// Registers the site `key` (`collector sites add --key KEY OPTIONS`, e.g. `options`
    /// `["--origin", "https://shop.example"]`); panics with the command's output unless it
    /// exits 0.
    pub fn add_site(&self, key: &str, options: &[&str]) {
        let mut args = vec!["sites", "add", "--key", key];
        args.extend_from_slice(options);
        self.cli(&args).success();
    }

    /// Runs `collector ARGS` against this test's databases with some settings replaced.
    pub fn cli_with(&self, settings: &[(&str, &str)], args: &[&str]) -> CliOutput {
        let mut env = self.collector_env();
        env.extend(settings.iter().map(|(k, v)| ((*k).into(), (*v).into())));
        run_cli(args, env, &[])
    }

    /// Starts a collector on this test's databases with extra `COLLECTOR_*` settings.
    pub async fn collector(&self, extra: &[(&str, &str)]) -> Collector {
        let spool = tempfile::tempdir().unwrap();
        let mut env = self.collector_env();
        env.push((
            "COLLECTOR_SPOOL_DIR".into(),
            spool.path().to_str().unwrap().into(),
        ));
        for (k, v) in extra {
            env.push(((*k).into(), (*v).into()));
        }
        Collector::start(env, spool, self.diag.clone()).await
    }

    /// Runs a query on ClickHouse server `i` (from 0) of this test and returns its JSON rows;
    /// panics with ClickHouse's answer when it fails.
    pub async fn query(&self, replica: usize, sql: &str) -> Vec<Value> {
        clickhouse_query(&self.clickhouse[replica], sql)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "clickhouse query on {}: {sql}: {e}",
                    self.clickhouse[replica]
                )
            })
    }

    /// The `columns` of the rows of this test's table that match `filter` (an SQL condition),
    /// under `FINAL`, read from its first ClickHouse server ([`TestEnv::query`]).
    pub async fn final_rows(&self, columns: &str, filter: &str) -> Vec<Value> {
        self.measurements(columns, &format!("FINAL WHERE {filter}"))
            .await
    }

    /// `SELECT columns FROM` this test's table `rest` (`FINAL`, `WHERE …`, `GROUP BY …`) on its
    /// first ClickHouse server: the rows; panics as [`TestEnv::query`].
    pub async fn measurements(&self, columns: &str, rest: &str) -> Vec<Value> {
        let sql = format!("SELECT {columns} FROM {}.measurements {rest}", self.db);
        self.query(0, &sql).await
    }

    /// The number of rows of this test's table `rest` (`FINAL`, `WHERE …`) on its first
    /// ClickHouse server; panics as [`TestEnv::query`], or with the answer when it holds no
    /// count.
    pub async fn count(&self, rest: &str) -> i64 {
        let rows = self.measurements("count() AS n", rest).await;
        rows.first()
            .and_then(|r| as_i64(col(r, "n")))
            .unwrap_or_else(|| panic!("no count of {}.measurements {rest}: {rows:?}", self.db))
    }

    /// Runs a statement (no answer rows) on ClickHouse server `i` (from 0) of this test;
    /// panics with ClickHouse's answer when it fails.
    pub async fn exec(&self, replica: usize, sql: &str) {
        clickhouse_exec(&self.clickhouse[replica], sql)
            .await
            .unwrap_or_else(|e| panic!("clickhouse on {}: {sql}: {e}", self.clickhouse[replica]))
    }

    /// Rows of this test's `measurements` with the given ids, under FINAL, from replica 0.
    pub async fn rows(&self, ids: &[String]) -> Vec<Value> {
        let list = ids
            .iter()
            .map(|i| format!("'{i}'"))
            .collect::<Vec<_>>()
            .join(",");
        self.query(
            0,
            &format!(
                "SELECT {ROW_COLUMNS} FROM {}.measurements FINAL WHERE id IN ({list}) ORDER BY id",
                self.db
            ),
        )
        .await
    }

    /// Waits (up to `limit`) until `ids` are all visible under FINAL on replica 0, then
    /// returns their rows; panics naming the missing ids after `limit`.
    pub async fn wait_rows(&self, ids: &[String], limit: Duration) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let rows = self.rows(ids).await;
            let found: std::collections::HashSet<&str> = rows
                .iter()
                .map(|r| {
                    col(r, "id")
                        .as_str()
                        .unwrap_or_else(|| panic!("id is text: {r}"))
                })
                .collect();
            let missing: Vec<&String> = ids
                .iter()
                .filter(|id| !found.contains(id.as_str()))
                .collect();
            if missing.is_empty() {
                return rows;
            }
            if start.elapsed() >= limit {
                self.diag
                    .give_up(format!(
                        "{} of {} ids not visible in {}.measurements after {limit:?}: {missing:?}",
                        missing.len(),
                        ids.len(),
                        self.db
                    ))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every id in `acked` is stored, then asserts each is stored exactly once
    /// under FINAL.
    pub async fn assert_stored_once(&self, acked: &[String], limit: Duration) {
        let start = Instant::now();
        let sql = format!(
            "SELECT toString(id) AS id, count() AS n FROM {}.measurements FINAL GROUP BY id",
            self.db
        );
        loop {
            let rows = self.query(0, &sql).await;
            let stored: HashMap<String, i64> = rows
                .iter()
                .map(|r| {
                    (
                        col(r, "id")
                            .as_str()
                            .unwrap_or_else(|| panic!("id is text: {r}"))
                            .to_owned(),
                        as_i64(col(r, "n")).unwrap_or_else(|| panic!("n is a count: {r}")),
                    )
                })
                .collect();
            let missing: Vec<&String> = acked
                .iter()
                .filter(|id| !stored.contains_key(*id))
                .collect();
            if missing.is_empty() {
                let doubled: Vec<(&String, &i64)> =
                    stored.iter().filter(|(_, n)| **n != 1).collect();
                assert!(
                    doubled.is_empty(),
                    "ids stored more than once under FINAL: {doubled:?}"
                );
                return;
            }
            if start.elapsed() >= limit {
                self.diag
                    .give_up(format!(
                        "{} of {} acknowledged ids missing from {}.measurements after {limit:?}, e.g. {:?}",
                        missing.len(),
                        acked.len(),
                        self.db,
                        &missing[..missing.len().min(3)]
                    ))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Columns selected by [`TestEnv::rows`]: ids as text, `received_at` as Unix seconds.
pub const ROW_COLUMNS: &str = "toString(id) AS id, site, url, toUInt32(received_at) AS received_at, ts, referrer, \
    navigation_type, ttfb_ms, fcp_ms, lcp_ms, inp_ms, dom_content_loaded_ms, load_ms, cls, viewport_width, \
    effective_connection_type, user_agent, sample_rate";

/// Output of a CLI run.
pub struct CliOutput {
    /// Exit code.
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl CliOutput {
    /// Asserts exit code 0.
    pub fn success(&self) -> &Self {
        assert_eq!(
            self.code, 0,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self
    }
}

/// Runs `collector ARGS` with `env` added to the test process's environment and the
/// variables `unset` removed from it; panics when the binary cannot be started.
pub fn run_cli(args: &[&str], env: Vec<(String, String)>, unset: &[&str]) -> CliOutput {
    let mut command = Command::new(collector_bin());
    command.args(args);
    for name in unset {
        command.env_remove(name);
    }
    let out = command
        .envs(env)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", collector_bin().display()));
    CliOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

//! Helpers shared by the integration tests: real servers, one database pair per test.
//!
//! - [`Stack`]: PostgreSQL, ZooKeeper and ClickHouse replicas started by the `stack` crate
//!   (the same code the main-job script runs through `scripts/stack.sh`). [`Stack::shared`] is one stack reused by
//!   every test that does not break servers (found through `STACK_ENV`, or started under
//!   `target/test-stack`); [`Stack::own`] starts a private stack a test may kill parts of.
//! - [`TestEnv`]: a fresh PostgreSQL database and ClickHouse database for one test, migrated
//!   with `collector migrate`, with a site registered.
//! - [`Collector`]: the real `collector` binary as a child process on a free port.
pub mod access_fixtures;
pub mod browser;
pub mod containers;
pub mod diag;
pub mod freeze;
pub mod process;
pub mod spool_files;
/// The proxies in front of real ClickHouse servers, from the fakes both test tiers share.
pub use fake_clickhouse::{lost_answer, standin};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

pub use diag::{poll_until, wait_until, Diag};

/// Two tests of `async fn BODY(env: TestEnv)` on the shared stack: `ON_18` with a
/// [`TestEnv::new`] (the 18.16 replicas) and `ON_26` with a [`TestEnv::on_ch26`] (the 26.x
/// server); or, written `BODY: ON_18 => empty, ON_26 => empty_on_ch26`, with the `TestEnv`
/// constructors named. Written where `BODY` is, beside it; the tests keep the names given.
#[macro_export]
macro_rules! on_both_servers {
    ($body:ident: $on_18:ident, $on_26:ident) => {
        $crate::on_both_servers!($body: $on_18 => new, $on_26 => on_ch26);
    };
    ($body:ident: $on_18:ident => $new_18:ident, $on_26:ident => $new_26:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $on_18() {
            let stack = $crate::common::Stack::shared();
            $body($crate::common::TestEnv::$new_18(stack).await).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $on_26() {
            let stack = $crate::common::Stack::shared();
            $body($crate::common::TestEnv::$new_26(stack).await).await;
        }
    };
}

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// A running stack of real servers: [`stack::Stack`] (typed handles to PostgreSQL, ZooKeeper,
/// each ClickHouse replica and the 26.x server: `stack.replica(1).kill()`), and what the tests
/// ask of it often.
pub struct Stack {
    inner: stack::Stack,
    owned: bool,
}

impl std::ops::Deref for Stack {
    type Target = stack::Stack;
    fn deref(&self) -> &stack::Stack {
        &self.inner
    }
}

impl Stack {
    /// A running stack named by the `stack.env` file that environment variable `var` points
    /// to (set by `scripts/test.sh`), if it is set.
    fn from_env_file(var: &str) -> Option<Stack> {
        let path = PathBuf::from(std::env::var_os(var)?);
        let dir = path.parent().expect("a stack.env path has a folder");
        let inner = stack::Stack::open(dir).unwrap_or_else(|e| panic!("{var}: {e}"));
        Some(Stack {
            inner,
            owned: false,
        })
    }

    /// The stack shared by every test of this run.
    pub fn shared() -> &'static Stack {
        static SHARED: OnceLock<Stack> = OnceLock::new();
        SHARED.get_or_init(|| {
            if let Some(stack) = Stack::from_env_file("STACK_ENV") {
                return stack;
            }
            let dir = root().join("target/test-stack/shared");
            Stack::up(dir, 2, false)
        })
    }

    /// A private stack with `replicas` ClickHouse replicas, stopped and deleted on drop.
    pub fn own(replicas: usize) -> Stack {
        Stack::own_prepared(replicas, |_| {})
    }

    /// As [`Stack::own`], with `prepare` called on the state folder before anything starts
    /// (e.g. to put a file into `chI/config.d/`, which replica `I` merges into its config).
    pub fn own_prepared(replicas: usize, prepare: impl FnOnce(&std::path::Path)) -> Stack {
        let dir = root()
            .join("target/test-stack")
            .join(format!("own-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        prepare(&dir);
        Stack::up(dir, replicas, true)
    }

    fn up(dir: PathBuf, replicas: usize, owned: bool) -> Stack {
        let options = stack::UpOptions {
            replicas: Some(replicas),
            // The shared stack also runs the ClickHouse 26.x server, as scripts/test.sh's does.
            ch26: Some(!owned),
            ..Default::default()
        };
        let inner = match stack::Stack::up(&dir, options) {
            Ok(inner) => inner,
            Err(e) => {
                // What started before the failure must not outlive the test.
                if owned {
                    let _ = stack::Stack::down(&dir, true);
                }
                panic!("{e}");
            }
        };
        Stack { inner, owned }
    }

    /// `postgres://...` URL of database `db` on the primary.
    pub fn database_url(&self, db: &str) -> String {
        self.postgres().url(db)
    }

    /// HTTP URL of the stack's ClickHouse 26.x server; panics when the stack has none.
    pub fn ch26_url(&self) -> String {
        match self.ch26() {
            Some(c) => c.url(),
            None => panic!(
                "the stack in {} has no ClickHouse 26.x server: start it with scripts/stack.sh up DIR --ch26",
                self.dir().display()
            ),
        }
    }

    /// HTTP URLs of the ClickHouse replicas, in order.
    pub fn clickhouse_urls(&self) -> Vec<String> {
        self.replicas().iter().map(|r| r.url()).collect()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if self.owned {
            if let Err(e) = stack::Stack::down(self.dir(), true) {
                eprintln!("stopping the test's own stack: {e}");
            }
        }
    }
}

/// A free TCP port on 127.0.0.1, reserved machine-wide for 10 minutes ([`stack::ports::alloc`]).
pub fn free_port() -> u16 {
    // Below the kernel's ephemeral range and reserved machine-wide (the stack's allocator): a
    // port picked by binding port 0 is an ephemeral one, which any outgoing connection on the
    // machine may take before the test's server binds it (a collector once failed to listen
    // on 127.0.0.1:36205, "Address already in use", in a fresh-clone run).
    stack::ports::alloc(1).unwrap_or_else(|e| panic!("a free loopback port: {e}"))[0]
}

/// A client of the PostgreSQL (or PgBouncer) at `url`, without TLS, its connection driven on a
/// task of its own; panics naming `what` (e.g. "the pgbouncer admin console") and `url` when it
/// cannot connect.
pub async fn pg_connect(url: &str, what: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to {what} ({url}): {e}"));
    tokio::spawn(conn);
    client
}

/// The `collector` binary, built if needed.
pub fn collector_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(p) = std::env::var("COLLECTOR_BIN") {
            return PathBuf::from(p);
        }
        let status = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "collector", "--bin", "collector"])
            .current_dir(root())
            .status()
            .expect("cargo build");
        assert!(status.success(), "building the collector failed");
        std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| root().join("target"), PathBuf::from)
            .join("debug/collector")
    })
    .clone()
}

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
        let out = Command::new(collector_bin())
            .args(args)
            .envs(self.collector_env())
            .envs(settings.iter().copied())
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", collector_bin().display()));
        CliOutput {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
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
}

/// Columns selected by [`TestEnv::rows`]: ids as text, `received_at` as Unix seconds.
pub const ROW_COLUMNS: &str = "toString(id) AS id, site, url, toUInt32(received_at) AS received_at, ts, referrer, \
    navigation_type, ttfb_ms, fcp_ms, lcp_ms, inp_ms, dom_content_loaded_ms, load_ms, cls, viewport_width, \
    effective_connection_type, user_agent, sample_rate";

/// A JSON number or a quoted number (ClickHouse quotes 64-bit integers) as i64.
pub fn as_i64(v: &Value) -> Option<i64> {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// A JSON number or a quoted number (ClickHouse quotes 64-bit integers) as f64, `None` for
/// NULL; panics on anything else (text that is not a number, an array, an object).
pub fn as_number(v: &Value) -> Option<f64> {
    match v {
        Value::Null => None,
        Value::Number(n) => n.as_f64(),
        Value::String(s) => Some(s.parse().unwrap_or_else(|_| panic!("not a number: {v}"))),
        other => panic!("not a number: {other}"),
    }
}

/// Column `column` of a ClickHouse JSON row; panics naming the column (and showing the row)
/// when the row has no such column. Indexing (`row["lcp_ms"]`) reads a missing column as
/// `Null`, which an assertion that the value is NULL would pass: through `col`, `Null` means
/// the column holds NULL.
pub fn col<'a>(row: &'a Value, column: &str) -> &'a Value {
    row.as_object()
        .unwrap_or_else(|| {
            panic!("looking for column {column}: the row is not a JSON object: {row}")
        })
        .get(column)
        .unwrap_or_else(|| {
            panic!("no column {column} in the row (a missing column is not NULL): {row}")
        })
}

/// Field `key` of a JSON object (an answer, an API's document); panics naming the field (and
/// showing the object) when it is not there, as [`col`] does for rows.
pub fn field<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.as_object()
        .unwrap_or_else(|| panic!("looking for field {key}: not a JSON object: {v}"))
        .get(key)
        .unwrap_or_else(|| panic!("no field {key} in {v}"))
}

/// Lines of a collector log (text format: `<time>  WARN target: ...`) at WARN or ERROR level.
/// Panics when no line of `logs` carries a level at all: an empty log, or one in another
/// format, would otherwise read as "no warnings".
pub fn warning_lines(logs: &str) -> Vec<&str> {
    const LEVELS: [&str; 5] = [" TRACE ", " DEBUG ", " INFO ", " WARN ", " ERROR "];
    assert!(
        logs.lines()
            .any(|l| LEVELS.iter().any(|level| l.contains(level))),
        "no log line with a level (TRACE, DEBUG, INFO, WARN, ERROR) to look for warnings in: \
         an empty log or not the text format:\n{logs}"
    );
    logs.lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect()
}

/// The text of a log file for a failure message; names the file and the error when it cannot
/// be read (an empty string would look like an empty log).
pub fn log_text(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| format!("(the log {} cannot be read: {e})", path.display()))
}

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

/// Runs `sql` on a ClickHouse HTTP endpoint with `FORMAT JSON`; the `data` rows.
pub async fn clickhouse_query(url: &str, sql: &str) -> Result<Vec<Value>, String> {
    let text = body_of(http().post(url).body(format!("{sql} FORMAT JSON"))).await?;
    data_rows(&text)
}

/// Runs a statement on a ClickHouse HTTP endpoint.
pub async fn clickhouse_exec(url: &str, sql: &str) -> Result<(), String> {
    body_of(http().post(url).body(sql.to_owned()))
        .await
        .map(drop)
}

/// Sends `request`: the answer's body when its status is a success, else `STATUS: BODY`
/// (trimmed), or why there is no answer (the error's whole chain).
pub async fn body_of(request: reqwest::RequestBuilder) -> Result<String, String> {
    let resp = request.send().await.map_err(|e| format!("{e:?}"))?;
    let status = resp.status();
    let text = resp
        .text()
        .await
        .map_err(|e| format!("{status}, its body cannot be read: {e}"))?;
    if status.is_success() {
        Ok(text)
    } else {
        Err(format!("{status}: {}", text.trim()))
    }
}

/// The `data` rows of ClickHouse's `FORMAT JSON` answer `text`, or why there are none (the
/// text is not JSON, or has no `data` array), with the text.
pub fn data_rows(text: &str) -> Result<Vec<Value>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("{e}: {text}"))?;
    v["data"]
        .as_array()
        .cloned()
        .ok_or_else(|| format!("no data rows in ClickHouse's answer: {text}"))
}

/// GETs `url` with [`http`]; the response, whatever its status. Panics when there is no
/// answer (within [`http`]'s 30 s timeout).
pub async fn http_get(url: impl reqwest::IntoUrl) -> reqwest::Response {
    http().get(url).send().await.unwrap()
}

/// A shared HTTP client for tests, without a connection pool: each test has its own tokio
/// runtime, and a pooled connection's task dies with the runtime that opened it, so reusing
/// it from another test fails ("runtime dropped the dispatch task").
pub fn http() -> reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(0)
                .no_gzip()
                .build()
                .unwrap()
        })
        .clone()
}

/// A running `collector serve` child process.
pub struct Collector {
    child: Option<Child>,
    /// Base URL, e.g. `http://127.0.0.1:PORT`.
    pub url: String,
    /// Port it listens on.
    pub port: u16,
    /// Base URL of its operations listener (`COLLECTOR_ADMIN_LISTEN`: `/metrics`, and
    /// `/readyz` with its reason), e.g. `http://127.0.0.1:PORT`.
    pub admin_url: String,
    /// Port of its operations listener.
    pub admin_port: u16,
    env: Vec<(String, String)>,
    /// Spool folder (kept for restarts).
    pub spool: tempfile::TempDir,
    /// Log file.
    pub log: PathBuf,
    /// The test's report for a wait that gives up (this collector is registered with it).
    pub diag: Diag,
}

impl Collector {
    async fn start(
        mut env: Vec<(String, String)>,
        spool: tempfile::TempDir,
        diag: Diag,
    ) -> Collector {
        let port = free_port();
        env.push(("COLLECTOR_LISTEN".into(), format!("127.0.0.1:{port}")));
        let admin_port = match env.iter().find(|(k, _)| k == "COLLECTOR_ADMIN_LISTEN") {
            Some((_, v)) => v.rsplit(':').next().unwrap().parse().unwrap(),
            None => {
                let p = free_port();
                env.push(("COLLECTOR_ADMIN_LISTEN".into(), format!("127.0.0.1:{p}")));
                p
            }
        };
        let log = spool.path().with_extension("log");
        let url = format!("http://127.0.0.1:{port}");
        let admin_url = format!("http://127.0.0.1:{admin_port}");
        // The spool the collector uses: the test's own folder when it names one.
        let spool_dir = env
            .iter()
            .rfind(|(k, _)| k == "COLLECTOR_SPOOL_DIR")
            .map_or_else(|| spool.path().to_owned(), |(_, v)| PathBuf::from(v));
        diag.collector(&admin_url, &log, &spool_dir, &env);
        let mut c = Collector {
            child: None,
            url,
            port,
            admin_url,
            admin_port,
            env,
            spool,
            log,
            diag,
        };
        c.spawn().await;
        c
    }

    /// Starts a collector with exactly the settings `env` (none of [`TestEnv::collector_env`]'s
    /// added: e.g. `COLLECTOR_CLICKHOUSE_SHARDS`, which must not come with
    /// `COLLECTOR_CLICKHOUSE_URLS`) in a spool folder of its own (`COLLECTOR_SPOOL_DIR` set
    /// here), on free ports, registered with `diag`.
    pub async fn start_with_env(mut env: Vec<(String, String)>, diag: Diag) -> Collector {
        let spool = tempfile::tempdir().unwrap();
        env.push((
            "COLLECTOR_SPOOL_DIR".into(),
            spool.path().to_str().unwrap().into(),
        ));
        Collector::start(env, spool, diag).await
    }

    async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(collector_bin())
            .arg("serve")
            .envs(self.env.iter().cloned())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", collector_bin().display()));
        let child = self.child.insert(child);
        let healthz = format!("{}/healthz", self.url);
        process::wait_ready(
            &format!("the collector on {}", self.url),
            child,
            Duration::from_secs(30),
            Duration::from_millis(50),
            || async { body_of(http().get(&healthz)).await.map(drop) },
            || log_text(&self.log),
        )
        .await;
    }

    /// The collector's log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_else(|e| panic!("the collector's log {}: {e}", self.log.display()))
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Sends `signal` (e.g. "TERM", "KILL") to the process.
    pub fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status();
    }

    /// Waits for the process to exit (at most `limit`); its exit status.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// SIGKILL and wait.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Changes a setting for the next [`Collector::restart`].
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
    }

    /// Starts the process again with the same settings, spool and port.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.spawn().await;
    }

    /// POSTs `body` to the intake with `headers`.
    pub async fn post(
        &self,
        body: impl Into<reqwest::Body>,
        headers: &[(&str, &str)],
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let mut req = http()
            .post(format!("{}/api/v1/measurements", self.url))
            .body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let url = format!("{}/api/v1/measurements", self.url);
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {url}: no answer: {e}"));
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp
            .text()
            .await
            .unwrap_or_else(|e| panic!("POST {url}: the body of the {status} answer: {e}"));
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
            headers,
        )
    }

    /// POSTs JSON with `Content-Type: application/json`. A 503 `spool write timed out` (the
    /// spool's sync outlived its 5 s limit: a disk saturated by the machine's other work, as
    /// a CI runner building beside the tests) is resent after its `Retry-After`, at most twice,
    /// as the script resends it; every other answer is returned as it came.
    pub async fn post_json(&self, body: &Value) -> (u16, Value) {
        let mut attempt = 0;
        loop {
            let (s, v, headers) = self
                .post(body.to_string(), &[("content-type", "application/json")])
                .await;
            attempt += 1;
            if s != 503 || v["error"] != "spool write timed out" || attempt == 3 {
                return (s, v);
            }
            let wait = headers
                .get("retry-after")
                .and_then(|h| h.to_str().ok()?.parse::<u64>().ok())
                .expect("a 503 without Retry-After");
            eprintln!(
                "{}: 503 spool write timed out (a slow disk); resent after {wait} s",
                self.url
            );
            tokio::time::sleep(Duration::from_secs(wait)).await;
        }
    }

    /// The value of a metric line (exact name with labels); panics naming it when `/metrics`
    /// has no such line (a misspelt name is not 0).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.metrics_text().await;
        metric_value(&text, name).unwrap_or_else(|| {
            let family = name.split('{').next().unwrap_or(name);
            panic!(
                "no metric line {name:?} in /metrics; lines of {family}:\n{}",
                text.lines()
                    .filter(|l| l.starts_with(family))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        })
    }

    /// The value of a metric line, `None` while it is absent (a labelled series appears with
    /// its first event): for waiting on one.
    pub async fn metric_if_present(&self, name: &str) -> Option<f64> {
        metric_value(&self.metrics_text().await, name)
    }

    /// The text of `/metrics` on the admin listener; panics when it does not answer.
    pub async fn metrics_text(&self) -> String {
        http()
            .get(format!("{}/metrics", self.admin_url))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("/metrics body")
    }
}

/// The value on the line of `name` (exact name with labels) in a metrics text.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(' '))
            .map(|v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("metric {name}: {v:?}: {e}"))
            })
    })
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A measurement with a fresh id for `site`, and its id.
pub fn measurement(site: &str) -> (String, Value) {
    let id = uuid::Uuid::new_v4().to_string();
    let v = serde_json::json!({
        "id": id, "site": site, "url": "https://shop.example/product/1?color=red",
        "ttfb_ms": 120.5, "fcp_ms": 800, "lcp_ms": 1500.25, "cls": 0.05, "inp_ms": 64,
        "dom_content_loaded_ms": 900, "load_ms": 1800, "viewport_width": 1280,
        "navigation_type": "navigate", "effective_connection_type": "4g",
        "referrer": "https://search.example/?q=shoes",
    });
    (id, v)
}

/// `YYYY-MM-DD` of Unix seconds, UTC (days since the epoch, civil-from-days: H. Hinnant,
/// "chrono-Compatible Low-Level Date Algorithms").
pub fn utc_date(secs: i64) -> String {
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Milliseconds since the Unix epoch now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The turn on the failover stack ([`Stack::failover`]): every test that uses it holds this
/// for its whole run, so that one test at a time breaks and repairs it. It serialises the tests
/// of one process (`cargo test`: every real-server test is in the one `integration` binary);
/// under `cargo nextest`, where each test is a process of its own, the test group
/// `failover-stack` of `.config/nextest.toml` does (max-threads 1), and a test that takes this
/// turn must be in that group's filter.
pub static FAILOVER_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Stack {
    /// The stack with three replicas that failure tests break and repair, one test at a time
    /// (found through `FAILOVER_STACK_ENV`, or started under `target/test-stack/failover`).
    pub fn failover() -> &'static Stack {
        static STACK: OnceLock<Stack> = OnceLock::new();
        STACK.get_or_init(|| {
            if let Some(stack) = Stack::from_env_file("FAILOVER_STACK_ENV") {
                return stack;
            }
            Stack::up(root().join("target/test-stack/failover"), 3, false)
        })
    }

    /// The stack of two shards of two 18.16 replicas and two 26.x servers that
    /// `tests/tests/shards.rs` breaks and repairs, one test at a time: the `stack.env` named by
    /// `SHARD_STACK_ENV`. Panics, saying how to start one, when that is unset: these tests
    /// never pass without their servers.
    pub fn sharded() -> &'static Stack {
        static STACK: OnceLock<Stack> = OnceLock::new();
        STACK.get_or_init(|| {
            Stack::from_env_file("SHARD_STACK_ENV").unwrap_or_else(|| {
                panic!(
                    "SHARD_STACK_ENV is not set: these tests need a stack of two shards. Start one with \
                     `scripts/stack.sh up DIR --shards 2 --replicas 2 --ch26 --ch26-servers 2` and run \
                     them with SHARD_STACK_ENV=DIR/stack.env (stop it after with \
                     `scripts/stack.sh down DIR --purge`)"
                )
            })
        })
    }

    /// Makes the failover stack whole for the next test, whatever the last one left: thaws
    /// every replica, starts what is not running ([`Stack::repair`]) and waits (at most
    /// [`REACTIVATION`]) until no replicated table is read-only or has an expired ZooKeeper
    /// session. Every user of [`Stack::failover`] starts with it: a test of another file that
    /// froze a replica past the session timeout leaves it read-only for up to a minute, and a
    /// mutation or `migrate` then waits on it.
    pub async fn restore(&self) {
        for i in 1..=self.replicas().len() {
            self.replica(i).thaw().unwrap();
        }
        self.repair();
        let urls = self.clickhouse_urls();
        let diag = Diag::new();
        for r in self.replicas() {
            diag.stack_server(&r.url(), self.dir(), r.i());
        }
        wait_until(
            &diag,
            "every replica's tables writable (none read-only, no expired ZooKeeper session)",
            REACTIVATION,
            Duration::from_millis(500),
            || async {
                let mut not_yet = Vec::new();
                for url in &urls {
                    if let Some(why) = session_not_live(url).await {
                        not_yet.push(why);
                    }
                }
                if not_yet.is_empty() {
                    Ok(())
                } else {
                    Err(not_yet.join("; "))
                }
            },
        )
        .await;
    }

    /// Starts whatever part of the stack is not running (thaws nothing: call
    /// `replica(i).thaw()`).
    pub fn repair(&self) {
        // As last started (the folder remembers its shards and replicas per shard).
        let options = stack::UpOptions::default();
        stack::Stack::up(self.dir(), options).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// How long a replica may stay unable to take inserts after a freeze that outlasted the
/// stack's ZooKeeper session timeout (10 s, scripts/stack.sh; production's cluster.xml has
/// 30 s): ClickHouse 18.16 finds the session expired at the thaw, then answers nothing that
/// needs ZooKeeper for about 20 s (measured: queries hung, then failed with "Session expired"),
/// and re-initializes a table's session only when the table's restarting thread next runs, at
/// most `zookeeper_session_expiration_check_period` (60 s) later; until then the table is
/// read-only. 60 s + 20 s, and 10 s for a loaded machine.
pub const REACTIVATION: Duration = Duration::from_secs(90);

/// Why replica `url` cannot take inserts yet (a read-only table, an expired ZooKeeper
/// session, no answer within 3 s), or `None` when it can.
async fn session_not_live(url: &str) -> Option<String> {
    let sql = "SELECT database, table, is_readonly, is_session_expired FROM system.replicas \
               WHERE is_readonly OR is_session_expired";
    match tokio::time::timeout(Duration::from_secs(3), clickhouse_query(url, sql)).await {
        Ok(Ok(rows)) if rows.is_empty() => None,
        Ok(Ok(rows)) => Some(format!("{url}: {} tables, e.g. {}", rows.len(), rows[0])),
        Ok(Err(e)) => Some(format!("{url}: {e}")),
        Err(_) => Some(format!("{url}: no answer within 3 s")),
    }
}

/// What a [`Traffic`] run saw.
#[derive(Debug, Default, Clone)]
pub struct TrafficReport {
    /// Ids answered 202.
    pub acked: Vec<String>,
    /// Count of answers by status (0: no answer, e.g. connection refused).
    pub statuses: std::collections::BTreeMap<u16, usize>,
    /// 503 answers that lacked `Retry-After`.
    pub unavailable_without_retry_after: usize,
    /// Resends of a 503 `spool write timed out` (see [`send_beacon`]).
    pub resent_after_slow_disk: usize,
}

/// POSTs one beacon `body` as a browser's script does; a 503 `spool write timed out` (a disk
/// saturated by the machine's other work) is resent after its `Retry-After`, at most twice,
/// as the script resends it. The last answer's status (0: no answer) and whether it had
/// `Retry-After`, and how many such resends it took.
async fn send_beacon(client: &reqwest::Client, url: &str, body: &str) -> (u16, bool, usize) {
    let mut resent = 0;
    loop {
        let answer = client
            .post(url)
            .header("content-type", "text/plain")
            .header("origin", "https://shop.example")
            .body(body.to_owned())
            .send()
            .await;
        let Ok(r) = answer else {
            return (0, false, resent);
        };
        let status = r.status().as_u16();
        let retry_after = r
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let slow_disk = status == 503
            && resent < 2
            && r.text()
                .await
                .is_ok_and(|t| t.contains("spool write timed out"));
        match retry_after {
            Some(wait) if slow_disk => {
                resent += 1;
                tokio::time::sleep(Duration::from_secs(wait)).await;
            }
            _ => return (status, retry_after.is_some(), resent),
        }
    }
}

impl TrafficReport {
    /// Counts the answer to the beacon `id` (`status` 0: no answer), whether it had
    /// `Retry-After`, and its resends after a slow disk's 503; returns the status.
    fn record(&mut self, id: String, (status, retry_after, resent): (u16, bool, usize)) -> u16 {
        self.resent_after_slow_disk += resent;
        *self.statuses.entry(status).or_default() += 1;
        if status == 202 {
            self.acked.push(id);
        }
        if status == 503 && !retry_after {
            self.unavailable_without_retry_after += 1;
        }
        status
    }
}

/// A steady stream of single measurements with unique ids, one every `interval`.
pub struct Traffic {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<TrafficReport>,
    report: SharedReport,
    diag: Diag,
}

/// A [`TrafficReport`] its senders record in while it is read.
type SharedReport = std::sync::Arc<std::sync::Mutex<TrafficReport>>;

impl Traffic {
    /// Starts posting to collector `c` for `site`.
    pub fn start(c: &Collector, site: &str, interval: Duration) -> Traffic {
        let site = site.to_owned();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        Traffic::run(c, move |url, shared, mut stopped| async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut inflight = futures::stream::FuturesUnordered::new();
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let (id, m) = measurement(&site);
                        // With an Origin, as every browser POST has (requests without one draw on a small budget).
                        let (client, url, shared) = (client.clone(), url.clone(), shared.clone());
                        inflight.push(async move {
                            let answer = send_beacon(&client, &url, &m.to_string()).await;
                            shared.lock().unwrap().record(id, answer);
                        });
                    }
                    Some(()) = futures::StreamExt::next(&mut inflight), if !inflight.is_empty() => {}
                    _ = stopped.changed() => break,
                }
            }
            while futures::StreamExt::next(&mut inflight).await.is_some() {}
        })
    }

    /// Starts `senders` clients posting to `base_url` for `site` back to back, each its next
    /// beacon as soon as the last is answered: the collector's maximum rate for that many
    /// connections. A request without an answer (the collector killed) counts under 0.
    pub fn flood(c: &Collector, site: &str, senders: usize) -> Traffic {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(senders)
            .build()
            .unwrap();
        Traffic::run(c, |url, report, stopped| {
            let tasks: Vec<_> = (0..senders)
                .map(|_| {
                    let (client, url, site, shared) =
                        (client.clone(), url.clone(), site.to_owned(), report.clone());
                    let stopped = stopped.clone();
                    tokio::spawn(async move {
                        while !*stopped.borrow() {
                            let (id, m) = measurement(&site);
                            let answer = send_beacon(&client, &url, &m.to_string()).await;
                            let status = shared.lock().unwrap().record(id, answer);
                            if status == 0 {
                                // Refused while the collector is down: not a busy loop.
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    })
                })
                .collect();
            async move {
                for t in tasks {
                    t.await.unwrap();
                }
            }
        })
    }

    /// The traffic of `senders` to collector `c`: they are given its intake URL, the report
    /// to record each answer in and the signal to stop on, and what they return runs on a task
    /// of its own, which ends with the report once it is done.
    fn run<F, Fut>(c: &Collector, senders: F) -> Traffic
    where
        F: FnOnce(String, SharedReport, tokio::sync::watch::Receiver<bool>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let report = SharedReport::default();
        let sending = senders(
            format!("{}/api/v1/measurements", c.url),
            report.clone(),
            stopped,
        );
        let shared = report.clone();
        let task = tokio::spawn(async move {
            sending.await;
            let rep = shared.lock().unwrap().clone();
            rep
        });
        Traffic {
            stop,
            task,
            report,
            diag: c.diag.clone(),
        }
    }

    /// What was seen so far.
    pub fn snapshot(&self) -> TrafficReport {
        self.report.lock().unwrap().clone()
    }

    /// Waits until at least `n` more ids were acknowledged than now (at most `limit`).
    pub async fn wait_acked(&self, n: usize, limit: Duration) {
        let target = self.snapshot().acked.len() + n;
        wait_until(
            &self.diag,
            &format!("{n} more beacons acknowledged"),
            limit,
            Duration::from_millis(50),
            || async {
                let now = self.snapshot();
                if now.acked.len() >= target {
                    Ok(())
                } else {
                    Err(format!(
                        "{} of {n} acknowledged; answers so far {:?}",
                        n + now.acked.len() - target,
                        now.statuses
                    ))
                }
            },
        )
        .await
    }

    /// Stops and returns the report.
    pub async fn stop(self) -> TrafficReport {
        let _ = self.stop.send(true);
        self.task.await.unwrap()
    }
}

impl TestEnv<'_> {
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

impl Collector {
    /// Waits until `/metrics` shows the gauge `collector_clickhouse_{metric}` of the replica
    /// `url` at `value` (`replica_state`: 0 down, 1 catching up, 2 healthy; `active_replica`:
    /// 1 written to), or panics after `limit` ([`Collector::wait_metric`]).
    pub async fn wait_replica(&self, metric: &str, url: &str, value: u8, limit: Duration) {
        self.wait_metric(
            &format!(
                "collector_clickhouse_{metric}{{replica=\"{url}\",shard=\"default\"}} {value}"
            ),
            limit,
        )
        .await;
    }

    /// Waits until `/metrics` shows `line` (exact name with labels and value) or panics after
    /// `limit`.
    pub async fn wait_metric(&self, line: &str, limit: Duration) {
        let start = Instant::now();
        let url = format!("{}/metrics", self.admin_url);
        loop {
            // No answer (a restart under way) is waited through; the last one is shown.
            let text = match http().get(&url).send().await {
                Ok(r) => match r.text().await {
                    Ok(t) => t,
                    Err(e) => format!("(GET {url}: the body cannot be read: {e})"),
                },
                Err(e) => format!("(GET {url}: no answer: {e})"),
            };
            if text.lines().any(|l| l == line) {
                return;
            }
            if start.elapsed() >= limit {
                self.diag
                    .give_up(format!(
                        "{} never showed {line:?} in {limit:?}; its last answer:\n{}",
                        self.url,
                        text.lines()
                            .filter(|l| l.starts_with("collector_clickhouse")
                                || l.starts_with("collector_spool")
                                || l.starts_with("(GET"))
                            .collect::<Vec<_>>()
                            .join("\n")
                    ))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Status code of `GET path`; panics naming the URL when the collector does not answer
    /// (no answer is not a status).
    pub async fn status_of(&self, path: &str) -> u16 {
        let url = format!("{}{path}", self.url);
        http()
            .get(&url)
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or_else(|e| panic!("GET {url}: no answer: {e}"))
    }
}

/// A real nginx in front of a collector, configured with the guide of docs/edge.md ("Behind a
/// proxy": `docs/proxy/nginx.conf`), mounting the collector under `/perf/`.
pub struct Nginx {
    child: Child,
    /// Base URL of the shop site, e.g. `http://127.0.0.1:PORT`; the collector is at `/perf/`.
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Nginx {
    /// Starts nginx on a free port proxying `/perf/` to `collector_port`; `extra` is added to
    /// its `server` block (e.g. more locations).
    pub async fn start(collector_port: u16, extra: &str) -> Nginx {
        Nginx::start_with(collector_port, extra, "").await
    }

    /// As [`Nginx::start`], with `http_extra` added to the `http` block (upstreams, servers).
    pub async fn start_with(collector_port: u16, extra: &str, http_extra: &str) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let guide = std::fs::read_to_string(root().join("docs/proxy/nginx.conf")).unwrap();
        let location = guide.replace(
            "http://127.0.0.1:8080/",
            &format!("http://127.0.0.1:{collector_port}/"),
        );
        let p = dir.path().display();
        let conf = format!(
            "daemon off;\nworker_processes 1;\npid {p}/nginx.pid;\nerror_log {p}/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {p}/body;\n  proxy_temp_path {p}/proxy;\n\
             fastcgi_temp_path {p}/fastcgi;\n  uwsgi_temp_path {p}/uwsgi;\n  scgi_temp_path {p}/scgi;\n\
             large_client_header_buffers 4 32k;\n{http_extra}\n\
             server {{\n    listen 127.0.0.1:{port};\n{location}\n{extra}\n  }}\n}}\n"
        );
        std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
        let child = Command::new("nginx")
            .args([
                "-p",
                dir.path().to_str().unwrap(),
                "-c",
                dir.path().join("nginx.conf").to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("stderr.log")).unwrap())
            .spawn()
            .expect("start nginx (scripts/stack.sh install installs it)");
        let url = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "nginx did not start: {}{}",
                log_text(&dir.path().join("stderr.log")),
                log_text(&dir.path().join("error.log"))
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Nginx {
            child,
            url,
            _dir: dir,
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM, not SIGKILL: a killed master leaves its worker processes behind.
        terminate(&mut self.child, Duration::from_secs(5));
    }
}

/// A real Caddy in front of a collector, configured with the guide of docs/edge.md ("Behind a
/// proxy": `docs/proxy/Caddyfile`), mounting the collector under `/perf/`.
pub struct Caddy {
    child: Child,
    /// Base URL of the shop site.
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Caddy {
    /// Starts Caddy on a free port proxying `/perf/*` to `collector_port`.
    pub async fn start(collector_port: u16) -> Caddy {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let guide = std::fs::read_to_string(root().join("docs/proxy/Caddyfile")).unwrap();
        let site = guide.replace("127.0.0.1:8080", &format!("127.0.0.1:{collector_port}"));
        let conf = format!(
            "{{\n\tadmin off\n\tauto_https off\n}}\nhttp://127.0.0.1:{port} {{\n{site}\n}}\n"
        );
        std::fs::write(dir.path().join("Caddyfile"), conf).unwrap();
        let child = Command::new("caddy")
            .args([
                "run",
                "--adapter",
                "caddyfile",
                "--config",
                dir.path().join("Caddyfile").to_str().unwrap(),
            ])
            .env("HOME", dir.path())
            .env("XDG_DATA_HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("stderr.log")).unwrap())
            .spawn()
            .expect("start caddy (scripts/stack.sh install installs it)");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "caddy did not start: {}",
                log_text(&dir.path().join("stderr.log"))
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Caddy {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        }
    }
}

impl Drop for Caddy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP client whose connections come from `source` (a loopback address such as
/// 127.0.0.5), so that tests can play several clients.
pub fn client_from(source: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(source.parse::<std::net::IpAddr>().unwrap())
        .timeout(Duration::from_secs(30))
        .no_gzip()
        .build()
        .unwrap()
}

/// Resident set size of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

/// Stops `child` with SIGTERM, waiting up to `grace` for it to exit, then SIGKILL.
pub fn terminate(child: &mut Child, grace: Duration) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let start = Instant::now();
    while start.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A TCP listener on a free loopback port that accepts connections and never answers: a
/// frozen server or a half-dead host, as a client sees it. Stops when dropped.
pub struct Hang {
    /// Its port.
    pub port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Hang {
    /// Starts listening.
    pub async fn start() -> Hang {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(stream);
            }
        });
        Hang {
            port,
            accepted,
            task,
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Hang {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A real PgBouncer (Debian's `pgbouncer`, installed by `scripts/stack.sh install`) in
/// `pool_mode = transaction` in front of a PostgreSQL on 127.0.0.1: consecutive transactions
/// of one client may run on different server connections, so anything that outlives one
/// round trip (a named prepared statement) breaks through it. Killed on drop.
pub struct PgBouncer {
    child: Child,
    /// Port it listens on (127.0.0.1).
    pub port: u16,
    dir: tempfile::TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer on a free loopback port, serving database `db` of the PostgreSQL on
    /// `pg_port` (user `postgres`, trust), at most 3 server connections for the pool (fewer
    /// than a collector's 4 client connections, so that clients share server connections).
    /// PgBouncer refuses to run as root: as root it is started with `-u postgres` (it reads
    /// its files first, then drops to that user).
    pub async fn start(pg_port: u16, db: &str) -> PgBouncer {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let p = dir.path().display();
        std::fs::write(dir.path().join("userlist.txt"), "\"postgres\" \"\"\n").unwrap();
        let ini = format!(
            "[databases]\n{db} = host=127.0.0.1 port={pg_port} dbname={db} user=postgres\n\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {p}/userlist.txt\npool_mode = transaction\n\
             default_pool_size = 3\nmin_pool_size = 0\nreserve_pool_size = 0\nmax_client_conn = 100\n\
             server_lifetime = 3600\nserver_idle_timeout = 600\nadmin_users = postgres\n"
        );
        std::fs::write(dir.path().join("pgbouncer.ini"), ini).unwrap();
        let mut cmd = Command::new("pgbouncer");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            cmd.args(["-u", "postgres"]);
        }
        let child = cmd
            .arg(dir.path().join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("pgbouncer.log")).unwrap())
            .spawn()
            .expect("start pgbouncer (scripts/stack.sh install installs it)");
        let mut bouncer = PgBouncer { child, port, dir };
        let log = bouncer.dir.path().join("pgbouncer.log");
        process::wait_ready(
            &format!("pgbouncer on 127.0.0.1:{port}"),
            &mut bouncer.child,
            Duration::from_secs(10),
            Duration::from_millis(20),
            || async {
                std::net::TcpStream::connect(("127.0.0.1", port))
                    .map(drop)
                    .map_err(|e| format!("not listening: {e}"))
            },
            || log_text(&log),
        )
        .await;
        bouncer
    }

    /// `postgres://postgres@127.0.0.1:PORT/db` through the pooler.
    pub fn database_url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// PgBouncer's own log so far (for failure messages).
    pub fn log(&self) -> String {
        log_text(&self.dir.path().join("pgbouncer.log"))
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A ClickHouse 26.x server of one test's own, made as the stack makes its own
/// ([`stack::ch26::write_config`], [`stack::ch26::command`]), with `settings` added to its
/// default profile: for a test that needs server settings the shared 26.x server must not
/// have. Stopped when dropped.
pub struct Ch26Server {
    /// Its HTTP URL.
    pub url: String,
    child: Child,
    dir: tempfile::TempDir,
}

impl Ch26Server {
    /// Starts it with `settings` (`NAME=VALUE`) in its default profile and waits until `/ping`
    /// answers (panics with its log after 30 s).
    pub async fn start(settings: &[&str]) -> Ch26Server {
        Ch26Server::start_with(settings, &[], &[stack::users::User::DEFAULT]).await
    }

    /// As [`Ch26Server::start`], with the profiles `extra` after the default one and `users`
    /// (among them a password-less `default`, which clickhouse-local needs for its own query),
    /// in users.xml from the stack's template.
    pub async fn start_with(
        settings: &[&str],
        extra: &[stack::users::Profile<'_>],
        users: &[stack::users::User<'_>],
    ) -> Ch26Server {
        assert!(
            stack::ch26::installed(),
            "no chdb-core virtual environment at {}: run scripts/stack.sh install",
            stack::ch26::venv().display()
        );
        let dir = tempfile::tempdir().unwrap();
        let http = free_port();
        let tcp = loop {
            let p = free_port();
            if p != http {
                break p;
            }
        };
        let profile: Vec<(String, String)> = settings
            .iter()
            .map(|s| s.split_once('=').expect("a setting is NAME=VALUE"))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let users_xml =
            stack::users::users_xml(stack::users::Root::ClickHouse, &profile, extra, users);
        stack::ch26::write_config(dir.path(), http, tcp, &users_xml).unwrap();
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let mut cmd = stack::ch26::command(dir.path());
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        let child = cmd.spawn().expect("start scripts/ch26/server.py");
        let mut server = Ch26Server {
            url: format!("http://127.0.0.1:{http}"),
            child,
            dir,
        };
        let ping = format!("{}/ping", server.url);
        let log = server.dir.path().join("server.log");
        process::wait_ready(
            &format!("the 26.x server on {} (/ping)", server.url),
            &mut server.child,
            Duration::from_secs(30),
            Duration::from_millis(100),
            || async {
                match body_of(self::http().get(&ping)).await? {
                    ok if ok == "Ok.\n" => Ok(()),
                    other => Err(format!("/ping answered {other:?}")),
                }
            },
            || format!("its log:\n{}", log_text(&log)),
        )
        .await;
        server
    }
}

impl Drop for Ch26Server {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(20));
    }
}

//! The running stacks of real servers the tests share or own: the shared stack, the failover
//! stack, the sharded stack and a test's own, and the turn that keeps the failover stack's users
//! apart.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use super::{clickhouse_query, root, wait_until, Diag};

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
    /// `tests/tests/shards/` breaks and repairs, one test at a time: the `stack.env` named by
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

impl Drop for Stack {
    fn drop(&mut self) {
        if self.owned {
            if let Err(e) = stack::Stack::down(self.dir(), true) {
                eprintln!("stopping the test's own stack: {e}");
            }
        }
    }
}

/// The turn on the failover stack ([`Stack::failover`]): every test that uses it holds this
/// for its whole run, so that one test at a time breaks and repairs it. It serialises the tests
/// of one process (`cargo test`: every real-server test is in the one `integration` binary);
/// under `cargo nextest`, where each test is a process of its own, the test group
/// `failover-stack` of `.config/nextest.toml` does (max-threads 1), and a test that takes this
/// turn must be in that group's filter.
pub static FAILOVER_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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

//! Throw-away PostgreSQL 15 servers run as the `postgres` user with `deploy/postgres`'s
//! `postgresql.conf` and `pg_hba.conf`, on loopback ports in a temporary folder: what the
//! compose stack's `postgres-primary` and `postgres-standby` run, without a container engine.
//! Every server is stopped (immediately) when the [`ScratchPg`] is dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{output, run_ok};
use crate::common::root;

/// Debian's PostgreSQL 15 programs.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A folder of scratch servers: `DIR/NAME/pgdata`, the deploy configs and scripts in `DIR`.
pub struct ScratchPg {
    dir: tempfile::TempDir,
}

/// `program` of PostgreSQL 15 run as the `postgres` user.
fn as_postgres(program: &str) -> Command {
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "postgres", "--"])
        .arg(Path::new(PG_BIN).join(program));
    cmd
}

impl ScratchPg {
    /// A new folder with `deploy/postgres`'s files in it, owned by `postgres`.
    pub fn new() -> ScratchPg {
        let dir = tempfile::Builder::new()
            .prefix("check-containers-pg.")
            .tempdir()
            .unwrap();
        for f in [
            "postgresql.conf",
            "pg_hba.conf",
            "init-primary.sh",
            "standby-entrypoint.sh",
        ] {
            std::fs::copy(root().join("deploy/postgres").join(f), dir.path().join(f))
                .unwrap_or_else(|e| panic!("deploy/postgres/{f}: {e}"));
        }
        // The postgres user must reach the folder (tempdir makes it 0700, owned by root).
        run_ok(Command::new("chmod").arg("755").arg(dir.path()));
        run_ok(
            Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(dir.path()),
        );
        ScratchPg { dir }
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The data folder of server `name`.
    pub fn data(&self, name: &str) -> PathBuf {
        self.path().join(name).join("pgdata")
    }

    /// `initdb` of server `name` (UTF8, locale C, superuser postgres).
    pub fn initdb(&self, name: &str) {
        run_ok(Command::new("mkdir").arg("-p").arg(self.path().join(name)));
        run_ok(
            Command::new("chown")
                .arg("postgres:")
                .arg(self.path().join(name)),
        );
        run_ok(as_postgres("initdb").arg("-D").arg(self.data(name)).args([
            "-U",
            "postgres",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        ]));
    }

    /// Starts server `name` with the deploy configs on 127.0.0.1:`port` (pg_ctl waits 30 s at
    /// most); panics with its log when it does not start.
    pub fn start(&self, name: &str, port: u16) {
        let d = self.path().display();
        let opts = format!(
            "-c config_file={d}/postgresql.conf -c hba_file={d}/pg_hba.conf -c port={port} \
             -c listen_addresses=127.0.0.1 -c unix_socket_directories={d}"
        );
        let log = self.path().join(format!("{name}.log"));
        let out = output(
            as_postgres("pg_ctl")
                .arg("-D")
                .arg(self.data(name))
                .arg("-l")
                .arg(&log)
                .args(["-w", "-t", "30", "start", "-o", &opts]),
        );
        assert!(
            out.status.success(),
            "PostgreSQL {name} did not start on port {port}:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// `sql` in database `db` of the server on `port`, as the superuser over the unix socket;
    /// its unaligned output, or psql's error.
    pub fn sql(&self, port: u16, db: &str, sql: &str) -> Result<String, String> {
        let out = output(
            as_postgres("psql")
                .args(["-X", "-qtA", "-v", "ON_ERROR_STOP=1", "-h"])
                .arg(self.path())
                .args(["-p", &port.to_string(), "-d", db, "-c", sql]),
        );
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }

    /// Polls `sql` every 200 ms until it answers `want`; panics after `limit` naming what was
    /// waited for and what it answered last.
    pub fn wait_for(&self, port: u16, db: &str, sql: &str, want: &str, limit: Duration) {
        let start = Instant::now();
        loop {
            let got = self.sql(port, db, sql);
            if got.as_deref() == Ok(want) {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "gave up after {limit:?} waiting for port {port}: '{sql}' to answer '{want}'; it answers {got:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops every server of the folder with `mode` (`fast` or `immediate`), 30 s at most
    /// each; the names of those that did not stop cleanly.
    pub fn stop_all(&self, mode: &str) -> Vec<String> {
        let mut failed = vec![];
        for e in std::fs::read_dir(self.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let data = e.path().join("pgdata");
            if !data.join("postmaster.pid").exists() {
                continue;
            }
            let out = output(
                as_postgres("pg_ctl")
                    .arg("-D")
                    .arg(&data)
                    .args(["stop", "-m", mode, "-w", "-t", "30"]),
            );
            if !out.status.success() {
                failed.push(format!(
                    "{}: {}",
                    data.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        failed
    }
}

impl Default for ScratchPg {
    fn default() -> Self {
        ScratchPg::new()
    }
}

impl Drop for ScratchPg {
    fn drop(&mut self) {
        self.stop_all("immediate");
    }
}

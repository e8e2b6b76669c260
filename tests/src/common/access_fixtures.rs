//! The real servers of `tests/tests/access/` (issue 37), each of the test's own on loopback:
//! a certificate authority made with `openssl`, a standalone ClickHouse 18.16 with a password-only
//! user and an `https_port`, a PostgreSQL 15 with `ssl = on` and password authentication, and
//! HAProxy run by the shipped `deploy/edge/haproxy-run.sh` with the shipped `haproxy.cfg`.
//! Used by `tests/tests/access/` alone.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common::process::{output_of, wait_ready};
use crate::common::{body_of, data_rows, free_port, log_text, root, terminate};

/// Runs `program args` in `cwd`, panicking with its output when it fails.
fn run(program: &str, args: &[&str], cwd: &Path) -> String {
    output_of(
        &format!("{program} {args:?}"),
        Command::new(program).args(args).current_dir(cwd),
    )
}

/// A certificate authority of the test's own and one server certificate it signed, for
/// `127.0.0.1` and `localhost` (subjectAltName), made with `openssl`.
pub struct Pki {
    /// The CA's certificate (PEM): what a client is told to trust.
    pub ca: PathBuf,
    /// The server's certificate (PEM).
    pub cert: PathBuf,
    /// The server's private key (PEM, unencrypted).
    pub key: PathBuf,
    /// Certificate and key in one file (HAProxy's `crt`).
    pub bundle: PathBuf,
}

impl Pki {
    /// Makes the CA `name` and its server certificate under `dir/name/`.
    pub fn new(dir: &Path, name: &str) -> Pki {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        let subject = format!("/CN=access test CA {name}");
        run(
            "openssl",
            &[
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
                "ca.pem", "-days", "2", "-subj", &subject,
            ],
            &d,
        );
        run(
            "openssl",
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
            &d,
        );
        std::fs::write(
            d.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        run(
            "openssl",
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "ext.cnf",
            ],
            &d,
        );
        let mut bundle = std::fs::read(d.join("server.pem")).unwrap();
        bundle.extend(std::fs::read(d.join("server.key")).unwrap());
        std::fs::write(d.join("bundle.pem"), bundle).unwrap();
        Pki {
            ca: d.join("ca.pem"),
            cert: d.join("server.pem"),
            key: d.join("server.key"),
            bundle: d.join("bundle.pem"),
        }
    }

    /// An HTTP client trusting only this CA (no pool: see `common::http`).
    pub fn client(&self) -> reqwest::Client {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&self.ca).unwrap()).unwrap();
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(0)
            .no_gzip()
            .build()
            .unwrap()
    }
}

/// A password file (no line ending) and the SHA-256 of the password in hex, as ClickHouse's
/// `password_sha256_hex` wants it (`sha256sum` of the file, so the password is in no argument).
pub fn password_file(dir: &Path, name: &str, password: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    std::fs::write(&path, password).unwrap();
    let out = run("sha256sum", &[path.to_str().unwrap()], dir);
    let hex = out.split_whitespace().next().unwrap().to_owned();
    assert_eq!(hex.len(), 64, "sha256sum: {out}");
    (path, hex)
}

/// Runs `sql` as it is as `user` with `password` on the ClickHouse HTTP(S) endpoint `url`
/// through `client`: the answer's body, or the status and body of a refusal.
pub async fn ch_exec(
    client: &reqwest::Client,
    url: &str,
    user: &str,
    password: &str,
    sql: &str,
) -> Result<String, String> {
    let request = client
        .post(url)
        .header("X-ClickHouse-User", user)
        .header("X-ClickHouse-Key", password)
        .body(sql.to_owned());
    body_of(request).await
}

/// Runs `sql` as `user` with `password` on the ClickHouse HTTP(S) endpoint `url` through
/// `client`, `FORMAT JSON`: its `data` rows, or ClickHouse's answer.
pub async fn ch_query(
    client: &reqwest::Client,
    url: &str,
    user: &str,
    password: &str,
    sql: &str,
) -> Result<Vec<Value>, String> {
    let text = ch_exec(client, url, user, password, &format!("{sql} FORMAT JSON")).await?;
    data_rows(&text)
}

/// A standalone ClickHouse 18.16 (Debian's `clickhouse-server`, no ZooKeeper) of one test's
/// own: an `http_port` and an `https_port` (the `<openSSL><server>` section with the test's
/// certificate), and one user, `collector`, with a password and nothing else: no password-less
/// `default` (a request without credentials is refused). Its config.xml and users.xml are the
/// stack's templates ([`stack::server_config`], [`stack::users`]). Stopped on drop.
pub struct Ch18Tls {
    /// `https://127.0.0.1:PORT`.
    pub https_url: String,
    /// `http://127.0.0.1:PORT` (the same server, plain).
    pub http_url: String,
    child: Child,
    dir: tempfile::TempDir,
}

impl Ch18Tls {
    /// Starts it with the certificate of `pki` and the `collector` user's password given as
    /// its SHA-256 in hex; waits (30 s at most) until `SELECT 1` answers over https as that user.
    pub async fn start(pki: &Pki, password: &str, password_sha256: &str) -> Ch18Tls {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        let (http, https, tcp) = loop {
            let p = (free_port(), free_port(), free_port());
            if p.0 != p.1 && p.1 != p.2 && p.0 != p.2 {
                break p;
            }
        };
        std::fs::create_dir_all(dir.path().join("data")).unwrap();
        std::fs::create_dir_all(dir.path().join("log")).unwrap();
        let config = stack::server_config::ServerConfig {
            dir: dir.path(),
            http_port: http,
            tcp_port: tcp,
            tls: Some(stack::server_config::Tls {
                https_port: https,
                cert: &pki.cert,
                key: &pki.key,
            }),
            replication: None,
            local: None,
        }
        .render();
        // The stack's users template: `collector` alone, by the SHA-256 of its password.
        let collector = stack::users::User {
            name: "collector",
            password: stack::users::Password::Sha256Hex(password_sha256),
            ..stack::users::User::DEFAULT
        };
        let users = stack::users::users_xml(stack::users::Root::Yandex, &[], &[], &[collector]);
        std::fs::write(dir.path().join("config.xml"), config).unwrap();
        std::fs::write(dir.path().join("users.xml"), users).unwrap();
        let child = Command::new("clickhouse-server")
            .arg(format!("--config-file={d}/config.xml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log/stderr.log")).unwrap())
            .spawn()
            .expect("start clickhouse-server (scripts/stack.sh install installs it)");
        let mut server = Ch18Tls {
            https_url: format!("https://127.0.0.1:{https}"),
            http_url: format!("http://127.0.0.1:{http}"),
            child,
            dir,
        };
        let client = pki.client();
        let (url, log) = (&server.https_url, server.dir.path().join("log"));
        wait_ready(
            &format!("ClickHouse 18.16 over https on {url} (SELECT 1 as collector)"),
            &mut server.child,
            Duration::from_secs(30),
            Duration::from_millis(100),
            || async {
                ch_query(&client, url, "collector", password, "SELECT 1 AS one")
                    .await
                    .map(drop)
            },
            || {
                format!(
                    "its logs:\n{}\n{}",
                    log_text(&log.join("stderr.log")),
                    crate::common::diag::tail(&log.join("clickhouse-server.err.log"), 30)
                )
            },
        )
        .await;
        server
    }

    /// The server's error log so far (for failure messages).
    pub fn err_log(&self) -> String {
        crate::common::diag::tail(&self.dir.path().join("log/clickhouse-server.err.log"), 30)
    }
}

impl Drop for Ch18Tls {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(15));
    }
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A PostgreSQL 15 of one test's own (its own `initdb` in a temporary folder, run as the
/// `postgres` user as `scripts/stack.sh` does), listening on 127.0.0.1 with password
/// authentication (`scram-sha-256`; the superuser `postgres` has `password`) and, with a
/// [`Pki`], `ssl = on` with its server certificate and plain TCP connections refused
/// (`hostnossl ... reject`): whoever reads from it over TCP did so encrypted. The test itself
/// connects over the Unix socket (trust). Stopped on drop.
pub struct OwnPg {
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// The folder of its Unix socket.
    pub socket_dir: PathBuf,
    data: PathBuf,
    dir: tempfile::TempDir,
}

/// Runs PostgreSQL's `tool` (`initdb`, `pg_ctl`) on the data folder `data` (`-D`) with `args`,
/// as the `postgres` user (PostgreSQL refuses root); its output. Panics when it cannot be run.
fn pg_tool(tool: &str, data: &Path, args: &[&str]) -> std::process::Output {
    let program = format!("{PG_BIN}/{tool}");
    // SAFETY: geteuid has no preconditions.
    let mut cmd = if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", &program]);
        c
    } else {
        Command::new(&program)
    };
    cmd.arg("-D")
        .arg(data)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"))
}

/// Stops the PostgreSQL on `data` at once (`pg_ctl stop -m immediate`), whatever its state.
fn stop_now(data: &Path) {
    let _ = pg_tool("pg_ctl", data, &["-m", "immediate", "stop"]);
}

/// Appends to the `postgresql.conf` of the fresh data folder `data` what [`OwnPg`] listens
/// with (127.0.0.1:`port`, its socket in `socket_dir`; with `pki`, TLS on with its server
/// certificate) and writes its `pg_hba.conf`: trust over the socket, `scram-sha-256` over TCP,
/// and with `pki` plain TCP refused.
fn configure(data: &Path, socket_dir: &Path, port: u16, pki: Option<&Pki>) {
    let mut conf = format!(
        "\n# written by tests/src/common/access_fixtures.rs\nlisten_addresses = '127.0.0.1'\n\
         port = {port}\nunix_socket_directories = '{}'\nmax_connections = 50\n\
         shared_buffers = 16MB\nfsync = off\nlog_connections = on\n",
        socket_dir.display()
    );
    let mut hba = String::from("local all all trust\n");
    match pki {
        Some(pki) => {
            std::fs::copy(&pki.cert, data.join("server.pem")).unwrap();
            std::fs::copy(&pki.key, data.join("server.key")).unwrap();
            conf.push_str("ssl = on\nssl_cert_file = 'server.pem'\nssl_key_file = 'server.key'\n");
            hba.push_str("hostssl all all 127.0.0.1/32 scram-sha-256\n");
            hba.push_str("hostnossl all all 127.0.0.1/32 reject\n");
        }
        None => {
            conf.push_str("ssl = off\n");
            hba.push_str("host all all 127.0.0.1/32 scram-sha-256\n");
        }
    }
    let mut pgconf = std::fs::read_to_string(data.join("postgresql.conf")).unwrap();
    pgconf.push_str(&conf);
    std::fs::write(data.join("postgresql.conf"), pgconf).unwrap();
    std::fs::write(data.join("pg_hba.conf"), hba).unwrap();
}

impl OwnPg {
    /// Initialises and starts it; `pki`: TLS on with that server certificate.
    pub async fn start(pki: Option<&Pki>, password: &str) -> OwnPg {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let chown = |path: &Path| {
            let _ = Command::new("chown")
                .args(["-R", "postgres:", path.to_str().unwrap()])
                .status();
        };
        // The temporary folder is 0700 root: the postgres user must reach it.
        Command::new("chmod")
            .args(["755", p.to_str().unwrap()])
            .status()
            .unwrap();
        let socket_dir = p.join("run");
        std::fs::create_dir_all(&socket_dir).unwrap();
        std::fs::write(p.join("pwfile"), password).unwrap();
        chown(p);
        let data = p.join("data");
        let init = pg_tool(
            "initdb",
            &data,
            &[
                "-U",
                "postgres",
                &format!("--pwfile={}", p.join("pwfile").display()),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
        );
        assert!(
            init.status.success(),
            "initdb: {}{}",
            String::from_utf8_lossy(&init.stdout),
            String::from_utf8_lossy(&init.stderr)
        );
        std::fs::remove_file(p.join("pwfile")).unwrap();
        let port = free_port();
        configure(&data, &socket_dir, port, pki);
        chown(&data);
        if pki.is_some() {
            Command::new("chmod")
                .args(["600", data.join("server.key").to_str().unwrap()])
                .status()
                .unwrap();
        }
        let log = p.join("postgres.log");
        let start = pg_tool(
            "pg_ctl",
            &data,
            &["-l", log.to_str().unwrap(), "-w", "-t", "60", "start"],
        );
        if !start.status.success() {
            // A start that timed out may still come up: never leave it running.
            stop_now(&data);
        }
        assert!(
            start.status.success(),
            "pg_ctl start: {}{}\n{}",
            String::from_utf8_lossy(&start.stdout),
            String::from_utf8_lossy(&start.stderr),
            log_text(&log)
        );
        OwnPg {
            port,
            socket_dir,
            data,
            dir,
        }
    }

    /// A connection of the test's own over the Unix socket (trust), to `db`.
    pub async fn admin(&self, db: &str) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(
            &format!(
                "host={} port={} user=postgres dbname={db}",
                self.socket_dir.display(),
                self.port
            ),
            tokio_postgres::NoTls,
        )
        .await
        .unwrap_or_else(|e| panic!("connect to the test's PostgreSQL over its socket: {e}"));
        tokio::spawn(conn);
        client
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        log_text(&self.dir.path().join("postgres.log"))
    }
}

impl Drop for OwnPg {
    fn drop(&mut self) {
        stop_now(&self.data);
    }
}

/// HAProxy with the shipped `deploy/edge/haproxy.cfg`, started the shipped way
/// (`deploy/edge/haproxy-run.sh`: the single-instance lock, a config check, master-worker mode)
/// on a free loopback port with the test's certificate, both ingress paths pointing at one
/// collector. Everything else as shipped: as root it drops to user and group `haproxy` in the
/// chroot `/var/lib/haproxy`. `EDGE_MAXCONN` is 4000 as in `scripts/edge.sh` (the shipped 20000
/// needs 40000 descriptors, more than this machine's hard limit of the test run). Stopped on
/// drop.
pub struct EdgeHaproxy {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    child: Child,
    dir: tempfile::TempDir,
}

impl EdgeHaproxy {
    /// Starts it in front of the collector on `collector_port` and waits (30 s at most) until
    /// `/readyz` answers 200 through it (its health checks found the path up).
    pub async fn start(pki: &Pki, collector_port: u16) -> EdgeHaproxy {
        EdgeHaproxy::start_paths(pki, collector_port, collector_port).await
    }

    /// As [`EdgeHaproxy::start`], with the collector on `preferred` as the preferred path and
    /// the one on `fallback` as the fallback.
    pub async fn start_paths(pki: &Pki, preferred: u16, fallback: u16) -> EdgeHaproxy {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let run_dir = dir.path().join("run");
        let child = Command::new(root().join("deploy/edge/haproxy-run.sh"))
            .env("EDGE_BIND", format!("127.0.0.1:{port}"))
            .env("EDGE_CERT", &pki.bundle)
            .env("EDGE_PREFERRED", format!("127.0.0.1:{preferred}"))
            .env("EDGE_FALLBACK", format!("127.0.0.1:{fallback}"))
            .env("EDGE_RUN_DIR", &run_dir)
            .env("EDGE_MAXCONN", "4000")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.path().join("haproxy.log")).unwrap())
            .stderr(std::fs::File::create(dir.path().join("stderr.log")).unwrap())
            .spawn()
            .expect("start deploy/edge/haproxy-run.sh (scripts/stack.sh install installs haproxy)");
        let mut edge = EdgeHaproxy {
            url: format!("https://127.0.0.1:{port}"),
            child,
            dir,
        };
        let client = pki.client();
        let readyz = format!("{}/readyz", edge.url);
        let dir = edge.dir.path();
        wait_ready(
            &format!("HAProxy on {} (/readyz)", edge.url),
            &mut edge.child,
            Duration::from_secs(30),
            Duration::from_millis(100),
            || async { body_of(client.get(&readyz)).await.map(drop) },
            || haproxy_logs(dir),
        )
        .await;
        edge
    }

    /// The master's process id (`haproxy-run.sh` execs HAProxy: the child is the master).
    pub fn master_pid(&self) -> u32 {
        self.child.id()
    }

    /// The worker processes: the master's children.
    pub fn worker_pids(&self) -> Vec<u32> {
        let master = self.master_pid();
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| {
                        // pid (comm) state ppid ...: comm may hold spaces; split after ')'.
                        let rest = s.rsplit_once(')')?.1;
                        rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                    })
                    == Some(master)
            })
            .collect()
    }

    /// Its output so far.
    pub fn logs(&self) -> String {
        haproxy_logs(self.dir.path())
    }
}

/// The logs of the HAProxy run in `dir` (its standard error, then its log), for a failure
/// message.
fn haproxy_logs(dir: &Path) -> String {
    format!(
        "{}\n{}",
        log_text(&dir.join("stderr.log")),
        log_text(&dir.join("haproxy.log"))
    )
}

impl Drop for EdgeHaproxy {
    fn drop(&mut self) {
        // SIGTERM to the master: it stops its workers (a killed master would leave them).
        terminate(&mut self.child, Duration::from_secs(10));
    }
}

/// The `Uid:` line of `/proc/PID/status`: real, effective, saved and file-system uid.
pub fn uids(pid: u32) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .unwrap_or_else(|| panic!("no Uid line in /proc/{pid}/status"))
        .split_whitespace()
        .map(|u| u.parse().unwrap())
        .collect()
}

/// The uid of user `name` (`id -u`).
pub fn uid_of(name: &str) -> u32 {
    let out = Command::new("id")
        .args(["-u", name])
        .output()
        .expect("run id");
    assert!(out.status.success(), "no user {name}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

//! Real servers a test starts of its own beside the stack: nginx and Caddy in front of a
//! collector, PgBouncer, a ClickHouse 26.x server with settings of its own, and a listener
//! that never answers.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{body_of, free_port, http, log_text, process, root, terminate};

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

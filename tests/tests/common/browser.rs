//! Real browsers under WebDriver, and a shop that serves the demo page behind nginx.
//!
//! [`Engine`] names the three engines the tracking script is proven in, each from Debian's
//! packages and installed by `scripts/stack.sh install` (`../shared/BROWSER-ENGINES-NOTES.md`
//! has what was found to work here):
//! - Chromium, headless, through `chromedriver`;
//! - Firefox ESR, headless, through geckodriver (crates.io, `cargo install geckodriver`);
//! - WebKitGTK's MiniBrowser through `WebKitWebDriver`, on an Xvfb display of its own
//!   (MiniBrowser has no headless mode).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use serde_json::{json, Value};

use super::{free_port, root, terminate, Collector, Nginx};

/// Makes the page hidden as a tab switch does, while it stays alive to read answers and run
/// timers (navigating away would end it); also for an engine that fires no `visibilitychange`
/// when WebDriver opens a tab (WebKitGTK's MiniBrowser).
pub const HIDE: &str = "Object.defineProperty(document, 'visibilityState', {configurable: true, get: function () { return 'hidden'; }});\
                        document.dispatchEvent(new Event('visibilitychange'));";

/// How long a page or a row may take to appear before a wait fails.
pub const SETTLE: Duration = Duration::from_secs(30);

/// A browser engine the script is tested in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Debian's Chromium, headless.
    Chromium,
    /// Debian's Firefox ESR, headless.
    Firefox,
    /// WebKitGTK's MiniBrowser under Xvfb.
    WebKit,
}

impl Engine {
    /// Every engine, in the order the tests run them.
    pub const ALL: [Engine; 3] = [Engine::Chromium, Engine::Firefox, Engine::WebKit];

    /// What `PerformanceObserver.supportedEntryTypes` lets this engine measure, as
    /// `(lcp, cls, inp)`: Chromium all three, Firefox LCP and INP (no `layout-shift`),
    /// WebKitGTK 2.50 none of them (docs/script.md: "What each engine measures").
    pub fn measures(self) -> (bool, bool, bool) {
        match self {
            Engine::Chromium => (true, true, true),
            Engine::Firefox => (true, false, true),
            Engine::WebKit => (false, false, false),
        }
    }

    /// The `browser` family the collector derives from this engine's user agent.
    pub fn browser_family(self) -> &'static str {
        match self {
            Engine::Chromium => "HeadlessChrome",
            Engine::Firefox => "Firefox",
            Engine::WebKit => "Safari",
        }
    }
}

/// A WebDriver session in a fresh profile, with its driver (and, for WebKit, its display).
pub struct Browser {
    /// The session.
    pub client: Client,
    /// Which engine.
    pub engine: Engine,
    driver: Child,
    display: Option<Child>,
    _profile: tempfile::TempDir,
}

/// Starts `program args` and waits until it listens on `port` (fails after 30 s).
async fn start_driver(mut command: Command, port: u16, what: &str) -> Child {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{what} (scripts/stack.sh install installs it): {e}"));
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited at start: {status}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what} did not listen on {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child
}

/// An X display of its own for MiniBrowser: Xvfb on the first free display number from 90.
async fn start_display() -> (Child, String) {
    for n in 90..190 {
        if PathBuf::from(format!("/tmp/.X{n}-lock")).exists()
            || PathBuf::from(format!("/tmp/.X11-unix/X{n}")).exists()
        {
            continue;
        }
        let mut child = Command::new("Xvfb")
            .args([
                &format!(":{n}"),
                "-screen",
                "0",
                "1280x900x24",
                "-nolisten",
                "tcp",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("Xvfb (scripts/stack.sh install installs xvfb)");
        let start = Instant::now();
        while !PathBuf::from(format!("/tmp/.X11-unix/X{n}")).exists() {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "Xvfb :{n} did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if child.try_wait().ok().flatten().is_none() {
            return (child, format!(":{n}"));
        }
    }
    panic!("no free X display between :90 and :189");
}

impl Browser {
    /// Starts `engine`'s driver on a free port and opens a session (fails loudly when the
    /// engine or its driver is missing).
    pub async fn start(engine: Engine) -> Browser {
        let port = free_port();
        let profile = tempfile::tempdir().unwrap();
        let mut caps = serde_json::Map::new();
        let mut display = None;
        let driver = match engine {
            Engine::Chromium => {
                let mut c = Command::new("chromedriver");
                c.arg(format!("--port={port}"));
                let args = vec![
                    "--headless".to_string(),
                    "--no-sandbox".into(),
                    "--disable-gpu".into(),
                    "--disable-background-networking".into(),
                    "--disable-component-update".into(),
                    "--disable-sync".into(),
                    "--no-first-run".into(),
                    "--disable-quic".into(),
                    "--window-size=1280,900".into(),
                    format!("--user-data-dir={}", profile.path().display()),
                ];
                caps.insert(
                    "goog:chromeOptions".into(),
                    json!({ "binary": "/usr/bin/chromium", "args": args }),
                );
                start_driver(c, port, "chromedriver").await
            }
            Engine::Firefox => {
                let mut c = Command::new("geckodriver");
                c.args(["--port", &port.to_string(), "--log", "fatal"]);
                caps.insert(
                    "moz:firefoxOptions".into(),
                    json!({
                        "binary": "/usr/bin/firefox-esr",
                        "args": ["-headless", "-profile", profile.path()],
                        // No update checks, telemetry or other calls out of this machine.
                        "prefs": {
                            "app.update.enabled": false,
                            "datareporting.policy.dataSubmissionEnabled": false,
                            "toolkit.telemetry.enabled": false,
                            "network.captive-portal-service.enabled": false,
                            "browser.safebrowsing.malware.enabled": false,
                            "browser.safebrowsing.phishing.enabled": false,
                        },
                    }),
                );
                start_driver(c, port, "geckodriver").await
            }
            Engine::WebKit => {
                let (x, name) = start_display().await;
                display = Some(x);
                let mut c = Command::new("WebKitWebDriver");
                c.arg(format!("--port={port}")).env("DISPLAY", &name);
                caps.insert(
                    "webkitgtk:browserOptions".into(),
                    json!({
                        "binary": "/usr/lib/x86_64-linux-gnu/webkit2gtk-4.1/MiniBrowser",
                        "args": ["--automation"],
                    }),
                );
                start_driver(c, port, "WebKitWebDriver").await
            }
        };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap_or_else(|e| panic!("WebDriver session in {engine:?}: {e}"));
        if engine != Engine::Chromium {
            client.set_window_size(1280, 900).await.unwrap();
        }
        Browser {
            client,
            engine,
            driver,
            display,
            _profile: profile,
        }
    }

    /// Runs `script` (a function body) in the page and returns its value.
    pub async fn eval(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    /// Waits until `condition` (a JS expression) is true in the page.
    pub async fn wait_for(&self, condition: &str) {
        let start = Instant::now();
        loop {
            // A page in the middle of a navigation may refuse a script: try again (the last
            // refusal is shown if the page never gets there).
            let last = match self
                .client
                .execute(&format!("return !!({condition});"), vec![])
                .await
            {
                Ok(Value::Bool(true)) => return,
                Ok(v) => format!("it was {v}"),
                Err(e) => format!("the script was refused: {e}"),
            };
            assert!(
                start.elapsed() < SETTLE,
                "{:?}: the page never reached: {condition} ({last})",
                self.engine
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Ends the WebDriver session: the driver closes the browser.
    pub async fn quit(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        terminate(&mut self.driver, Duration::from_secs(5));
        if let Some(x) = &mut self.display {
            terminate(x, Duration::from_secs(5));
        }
    }
}

/// The demo shop page for `site`, as the shop serves it: script from `/perf/`, plus a
/// recorder of uncaught errors so that the test sees whether the page broke.
pub fn shop_html(site: &str) -> String {
    let page = std::fs::read_to_string(root().join("demo/index.html")).unwrap();
    let recorder = "<script>window.__errors=[];addEventListener('error',function(e){__errors.push(String(e.message))});\
                    addEventListener('unhandledrejection',function(e){__errors.push(String(e.reason))});</script>";
    page.replace("__COLLECTOR__", "/perf")
        .replace("data-site=\"demo\"", &format!("data-site=\"{site}\""))
        .replace(
            "<meta charset=\"utf-8\">",
            &format!("<meta charset=\"utf-8\">\n  {recorder}"),
        )
}

/// A folder holding `pages` (file name, HTML) and the demo page's image, readable by nginx.
pub fn page_dir(pages: &[(&str, String)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, html) in pages {
        std::fs::write(dir.path().join(name), html).unwrap();
    }
    std::fs::copy(root().join("demo/hero.svg"), dir.path().join("hero.svg")).unwrap();
    // chmod so that nginx workers (nobody) can read the pages.
    let _ = Command::new("chmod")
        .args(["-R", "a+rX", dir.path().to_str().unwrap()])
        .status();
    dir
}

/// One beacon as nginx saw it.
#[derive(Debug, Clone)]
pub struct Beacon {
    /// Seconds since the epoch when nginx answered it.
    pub at: f64,
    /// The status nginx answered with.
    pub status: u16,
    /// The measurement ids in its body (one for a page view's beacon).
    pub ids: Vec<String>,
}

/// A shop behind nginx whose intake location logs every beacon (time, status, body) and can
/// send the first beacon to a stand-in server that answers with `fail` (nginx directives,
/// e.g. `return 503;`), round robin with the collector.
pub struct Shop {
    /// The nginx in front of the pages and the collector.
    pub proxy: Nginx,
    log: PathBuf,
    _pages: tempfile::TempDir,
    _logs: tempfile::TempDir,
}

impl Shop {
    /// Serves `pages` under `/shop/` and the collector `c` under `/perf/`.
    pub async fn start(c: &Collector, pages: &[(&str, String)], fail: Option<&str>) -> Shop {
        let pages = page_dir(pages);
        let logs = tempfile::tempdir().unwrap();
        let log = logs.path().join("beacons.log");
        let upstream = match fail {
            Some(_) => "http://flaky",
            None => "http://collector",
        };
        let fail_port = free_port();
        let server_extra = format!(
            "location /shop/ {{ alias {}/; }}\n\
             location = /perf/api/v1/measurements {{ access_log {} beacons; \
             proxy_ignore_client_abort on; \
             proxy_pass {upstream}/api/v1/measurements; proxy_next_upstream off; }}",
            pages.path().display(),
            log.display()
        );
        let http_extra = format!(
            "log_format beacons escape=json '$msec $status $request_body';\n\
             upstream collector {{ server 127.0.0.1:{port}; }}\n\
             upstream flaky {{ server 127.0.0.1:{fail_port}; server 127.0.0.1:{port}; }}\n\
             server {{ listen 127.0.0.1:{fail_port}; location / {{ {fail} }} }}",
            port = c.port,
            fail = fail.unwrap_or("return 503;"),
        );
        let proxy = Nginx::start_with(c.port, &server_extra, &http_extra).await;
        Shop {
            proxy,
            log,
            _pages: pages,
            _logs: logs,
        }
    }

    /// The folder nginx serves under `/shop/`.
    pub fn pages(&self) -> &std::path::Path {
        self._pages.path()
    }

    /// Every beacon nginx answered so far, in order; panics naming the log when it cannot be
    /// read (nginx creates it at its start: no log is not "no beacons").
    pub fn beacons(&self) -> Vec<Beacon> {
        let ids = regex::Regex::new(r#"\\"id\\":\\"([0-9a-f-]{36})\\""#).unwrap();
        std::fs::read_to_string(&self.log)
            .unwrap_or_else(|e| panic!("nginx's beacon log {}: {e}", self.log.display()))
            .lines()
            .map(|l| {
                let mut parts = l.splitn(3, ' ');
                let at = parts.next().unwrap().parse().expect("$msec");
                let status = parts.next().expect("$status").parse().expect("$status");
                let body = parts.next().unwrap_or("");
                Beacon {
                    at,
                    status,
                    ids: ids.captures_iter(body).map(|c| c[1].to_owned()).collect(),
                }
            })
            .collect()
    }
}

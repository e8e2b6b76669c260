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

use super::{free_port, root, terminate, Collector, Diag, Nginx};

/// Makes the page hidden as a tab switch does, while it stays alive to read answers and run
/// timers (navigating away would end it); also for an engine that fires no `visibilitychange`
/// when WebDriver opens a tab (WebKitGTK's MiniBrowser).
pub const HIDE: &str = "Object.defineProperty(document, 'visibilityState', {configurable: true, get: function () { return 'hidden'; }});\
                        document.dispatchEvent(new Event('visibilitychange'));";

/// What the demo shop page ([`shop_html`]) shows once loaded and shifted: complete, with its
/// late banner (the layout shift) in place. A JS expression for [`Browser::wait_for`].
pub const SETTLED: &str = "document.readyState === 'complete' && document.body.firstChild.textContent === 'Free shipping this week!'";

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

/// One test per engine of `async fn NAME(engine: Engine)`: a module `NAME` with a
/// `#[tokio::test]` `chromium`, `firefox` and `webkit` (or the ones listed, `chromium =>
/// Chromium, ...`), so that `cargo test NAME` runs it in every engine and `NAME::firefox` in
/// one. Written where `NAME` is, beside it.
#[macro_export]
macro_rules! per_engine {
    ($test:ident) => {
        $crate::per_engine!($test: chromium => Chromium, firefox => Firefox, webkit => WebKit);
    };
    ($test:ident: $($name:ident => $engine:ident),+) => {
        mod $test {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$test($crate::common::browser::Engine::$engine).await;
                }
            )+
        }
    };
}

/// A WebDriver session in a fresh profile, with its driver (and, for WebKit, its display).
pub struct Browser {
    /// The session.
    pub client: Client,
    /// Which engine.
    pub engine: Engine,
    // Dropped in this order: the driver's group, then the display it may need to exit.
    _driver: Driver,
    _display: Option<Display>,
    diag: Diag,
    _profile: tempfile::TempDir,
}

/// A WebDriver server and everything it starts, in a process group of its own: dropping it
/// ends the whole group (SIGTERM, then SIGKILL after 5 s), so that a browser whose session
/// was never closed (a test that failed, a session that could not be opened) does not outlive
/// the test and load the rest of the suite.
struct Driver {
    child: Child,
    what: &'static str,
    /// Where its output (and, for Chromium, the engine's log) goes.
    logs: Vec<PathBuf>,
}

impl Driver {
    /// Its output so far, for a failure message.
    fn logs(&self) -> String {
        driver_logs(self.what, &self.logs)
    }
}

/// The output so far of the driver `what` in the files `logs`, for a failure message.
fn driver_logs(what: &str, logs: &[PathBuf]) -> String {
    logs.iter()
        .map(|p| format!("{what} ({}):\n{}", p.display(), super::diag::tail(p, 40)))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        terminate(&mut self.child, Duration::from_secs(5));
        // Whatever of the group is left (a browser that ignored SIGTERM).
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
    }
}

/// Starts `command` (a WebDriver server listening on `port`) with its output in `log`, in a
/// process group of its own, and waits until it is ready for a session: `GET /status` answers
/// `ready: true` (W3C WebDriver, "Status"). A TCP connect is not enough: once in 20 runs of
/// engines/ (issue 38) the session asked for as soon as chromedriver's port accepted got
/// no answer and never reached it (nothing in its log, which says it started 170 ms after it
/// said it was starting). Fails after 30 s, with its output.
async fn start_driver(
    mut command: Command,
    port: u16,
    what: &'static str,
    log: &std::path::Path,
    logs: Vec<PathBuf>,
) -> Driver {
    use std::os::unix::process::CommandExt;
    let out = std::fs::File::create(log).unwrap();
    let child = command
        .process_group(0)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("{what} (scripts/stack.sh install installs it): {e}"));
    let mut driver = Driver { child, what, logs };
    let status = format!("http://127.0.0.1:{port}/status");
    super::process::wait_ready(
        &format!("{what} on {port}"),
        &mut driver.child,
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            let text = super::body_of(super::http().get(&status)).await?;
            match serde_json::from_str::<Value>(&text) {
                Ok(v) if v["value"]["ready"] == json!(true) => Ok(()),
                Ok(v) => Err(format!("not ready: {v}")),
                Err(e) => Err(format!("not a WebDriver status: {e}: {text}")),
            }
        },
        || driver_logs(what, &driver.logs),
    )
    .await;
    driver
}

/// An Xvfb server, stopped when dropped.
struct Display(Child);

impl Drop for Display {
    fn drop(&mut self) {
        terminate(&mut self.0, Duration::from_secs(5));
    }
}

/// An X display of its own for MiniBrowser: Xvfb on the first free display number from 90.
/// Two tests may pick the same number at once: the display is ours only when its lock file
/// (`/tmp/.X{n}-lock`, the owner's pid) names our Xvfb; the other one exits and we try the
/// next number.
async fn start_display() -> (Display, String) {
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
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            if display_owner(n) == Some(child.id())
                && PathBuf::from(format!("/tmp/.X11-unix/X{n}")).exists()
            {
                return (Display(child), format!(":{n}"));
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "Xvfb :{n} did not start (or another server holds its lock and ours did not exit)"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    panic!("no free X display between :90 and :189");
}

/// The pid in display `n`'s lock file (X servers write it as ten right-aligned digits), if
/// the file holds one.
fn display_owner(n: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/tmp/.X{n}-lock"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl Browser {
    /// Starts `engine`'s driver on a free port and opens a session (fails loudly when the
    /// engine or its driver is missing), registered with the test's `diag`: a wait that
    /// gives up shows the engine's console (Firefox and Chromium: every page's, from the
    /// driver's log; WebKitGTK: the open page's own record, [`RECORDER`]).
    ///
    /// A session the engine could not open (Chromium's "DevToolsActivePort file doesn't
    /// exist", Firefox's "Failed to read marionette port": seen once each in a fresh-clone CI
    /// run, the browser dying at its start) is tried once more with a new driver, profile and
    /// port, as a person would start the browser again; a second failure fails the test with
    /// both drivers' logs.
    pub async fn start(engine: Engine, diag: &Diag) -> Browser {
        let first = match Browser::try_start(engine, diag).await {
            Ok(b) => return b,
            Err(e) => e,
        };
        eprintln!("{engine:?} did not start; starting it once more. The first attempt:\n{first}");
        Browser::try_start(engine, diag)
            .await
            .unwrap_or_else(|e| panic!("{e}\n(first attempt:)\n{first}"))
    }

    /// One attempt of [`Browser::start`]: the failure to open a session as its message.
    async fn try_start(engine: Engine, diag: &Diag) -> Result<Browser, String> {
        let port = free_port();
        let profile = tempfile::tempdir().unwrap();
        // Beside the profile, not in it: the engine's console outlives the session.
        let console = profile.path().with_extension("console.log");
        let mut caps = serde_json::Map::new();
        let mut display = None;
        let driver = match engine {
            Engine::Chromium => {
                let mut c = Command::new("chromedriver");
                // Chromium's own log (with every page's console: `--enable-logging`) goes to
                // the driver's log.
                c.arg(format!("--port={port}")).args([
                    "--enable-chrome-logs".to_string(),
                    format!("--log-path={}", console.display()),
                ]);
                let args = chromium_args(profile.path());
                caps.insert(
                    "goog:chromeOptions".into(),
                    json!({ "binary": "/usr/bin/chromium", "args": args }),
                );
                let out = profile.path().with_extension("driver.log");
                start_driver(
                    c,
                    port,
                    "chromedriver",
                    &out,
                    vec![out.clone(), console.clone()],
                )
                .await
            }
            Engine::Firefox => {
                let mut c = Command::new("geckodriver");
                c.args(["--port", &port.to_string(), "--log", "fatal"]);
                caps.insert("moz:firefoxOptions".into(), firefox_options(profile.path()));
                start_driver(c, port, "geckodriver", &console, vec![console.clone()]).await
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
                start_driver(c, port, "WebKitWebDriver", &console, vec![console.clone()]).await
            }
        };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            // `driver` (and `display`) are dropped on return: nothing is left.
            .map_err(|e| format!("WebDriver session in {engine:?}: {e}\n{}", driver.logs()))?;
        if engine != Engine::Chromium {
            client.set_window_size(1280, 900).await.unwrap();
        }
        // WebKitWebDriver's log holds no page console (measured: nothing of the page reaches
        // it); the page's own record is read instead.
        let engine_console = (engine != Engine::WebKit).then_some(console.as_path());
        diag.browser(&format!("{engine:?}"), &client, engine_console);
        Ok(Browser {
            client,
            engine,
            _driver: driver,
            _display: display,
            diag: diag.clone(),
            _profile: profile,
        })
    }

    /// Runs `script` (a function body) in the page and returns its value.
    pub async fn eval(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    /// Waits until `condition` (a JS expression) is true in the page; gives up after
    /// [`SETTLE`] through the test's report.
    pub async fn wait_for(&self, condition: &str) {
        let what = format!("{:?}: the page to reach {condition}", self.engine);
        super::wait_until(
            &self.diag,
            &what,
            SETTLE,
            Duration::from_millis(50),
            || async {
                // A page in the middle of a navigation may refuse a script: try again (the
                // last refusal is shown if the page never gets there).
                match self
                    .client
                    .execute(&format!("return !!({condition});"), vec![])
                    .await
                {
                    Ok(Value::Bool(true)) => Ok(()),
                    Ok(v) => Err(format!("it was {v}")),
                    Err(e) => Err(format!("the script was refused: {e}")),
                }
            },
        )
        .await
    }

    /// Navigates to `url` and waits until it has loaded (WebDriver's page load strategy);
    /// panics when the driver refuses.
    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    /// Clicks the page's element with the id `id`; panics when there is none or the driver
    /// refuses.
    pub async fn click(&self, id: &str) {
        self.client
            .find(fantoccini::Locator::Id(id))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }

    /// The test's report (see [`Diag`]).
    pub fn diag(&self) -> &Diag {
        &self.diag
    }

    /// Ends the WebDriver session: the driver closes the browser.
    pub async fn quit(self) {
        let _ = self.client.clone().close().await;
    }
}

/// Opens the report page `html` (a file the `report` command wrote) in headless Chromium, at
/// 1000 × `height` pixels; asserts that it loaded nothing and ran no script (the page is
/// self-contained: inline SVG and CSS only); saves its screenshot as `target/<name>`; returns
/// what `probe` (a function body returning an object) saw in the page, for the caller's own
/// checks. The probe's object gains `resources` and `scripts`, the counts checked here.
pub async fn static_report_page(
    diag: &Diag,
    html: &std::path::Path,
    height: u32,
    probe: &str,
    name: &str,
) -> Value {
    let browser = Browser::start(Engine::Chromium, diag).await;
    browser.client.set_window_size(1000, height).await.unwrap();
    browser.goto(&format!("file://{}", html.display())).await;
    browser.wait_for("document.readyState == 'complete'").await;
    let seen = browser
        .eval(&format!(
            "var seen = (function () {{ {probe} }})(); \
             seen.resources = performance.getEntriesByType('resource').length; \
             seen.scripts = document.scripts.length; return seen;"
        ))
        .await;
    assert_eq!(super::field(&seen, "resources"), 0, "{seen}");
    assert_eq!(super::field(&seen, "scripts"), 0, "{seen}");
    let png = browser.client.screenshot().await.unwrap();
    let path = root().join("target").join(name);
    std::fs::write(&path, &png).unwrap();
    println!("screenshot: {} ({} bytes)", path.display(), png.len());
    browser.quit().await;
    seen
}

/// Chromium's arguments for a session in the profile folder `profile`: headless, its log
/// (with every page's console) on stderr, nothing called out of this machine.
fn chromium_args(profile: &std::path::Path) -> Vec<String> {
    vec![
        "--enable-logging=stderr".to_string(),
        "--v=0".into(),
        "--headless".into(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-sync".into(),
        "--no-first-run".into(),
        "--disable-quic".into(),
        "--window-size=1280,900".into(),
        format!("--user-data-dir={}", profile.display()),
    ]
}

/// `moz:firefoxOptions` for a session of Firefox ESR in the profile folder `profile`.
fn firefox_options(profile: &std::path::Path) -> Value {
    json!({
        "binary": "/usr/bin/firefox-esr",
        "args": ["-headless", "-profile", profile],
        // No update checks, telemetry or other calls out of this machine.
        "prefs": {
            "app.update.enabled": false,
            "datareporting.policy.dataSubmissionEnabled": false,
            "toolkit.telemetry.enabled": false,
            "network.captive-portal-service.enabled": false,
            "browser.safebrowsing.malware.enabled": false,
            "browser.safebrowsing.phishing.enabled": false,
            // Every page's console to Firefox's stdout, which geckodriver
            // passes on to its own.
            "devtools.console.stdout.content": true,
        },
    })
}

/// The page's own record, first in the head of every shop page the tests serve: uncaught
/// errors in `window.__errors` (the tests require it empty), and in `window.__console` (the
/// last 200) and on the console (which Firefox and Chromium write to the driver's log, so
/// that a page already left is still seen): the page's console calls, its lifecycle events
/// (`beforeunload`, `pagehide`, `pageshow`, `visibilitychange`, `freeze`, `resume`, with
/// `performance.now()`), and every beacon the page sends (`sendBeacon` with what it returned,
/// a `POST` by `fetch` with its answer), each with the page view's id. It only watches: the
/// script's calls reach the browser unchanged.
pub const RECORDER: &str = r#"<script>(function(){
window.__errors=[];window.__console=[];
var keep=function(s){__console.push(s);if(__console.length>200)__console.shift();};
var show=function(a){try{return typeof a=='string'?a:JSON.stringify(a);}catch(e){return String(a);}};
['log','info','warn','error','debug'].forEach(function(k){var o=console[k];console[k]=function(){
keep(k+': '+[].map.call(arguments,show).join(' '));return o.apply(console,arguments);};});
var mark=function(s){console.info('[page '+performance.now().toFixed(1)+' '+location.pathname+location.search+'] '+s);};
var id=function(b){var m=/"id":"([0-9a-f-]+)"/.exec(typeof b=='string'?b:'');return m?m[1]:'(no id)';};
addEventListener('error',function(e){__errors.push(String(e.message));mark('error: '+e.message);});
addEventListener('unhandledrejection',function(e){__errors.push(String(e.reason));mark('unhandled rejection: '+e.reason);});
['beforeunload','pagehide','pageshow','visibilitychange','freeze','resume'].forEach(function(t){
addEventListener(t,function(e){mark(t+(t=='visibilitychange'?' '+document.visibilityState:'')+
(typeof e.persisted=='boolean'?' persisted='+e.persisted:''));},true);});
if(navigator.sendBeacon){var sb=navigator.sendBeacon;navigator.sendBeacon=function(u,d){
var r=sb.apply(navigator,arguments);mark('sendBeacon '+id(d)+' returned '+r);return r;};}
if(window.fetch){var f=window.fetch;window.fetch=function(u,o){var p=f.apply(window,arguments);
if(o&&o.method=='POST'){var i=id(o.body);mark('fetch POST '+i+(o.keepalive?' keepalive':''));
p.then(function(r){mark('fetch POST '+i+' answered '+r.status);},function(e){mark('fetch POST '+i+' failed: '+e);});}
return p;};}
})();</script>"#;

/// The demo shop page for `site`, as the shop serves it: script from `/perf/`, plus the
/// page's own [`RECORDER`] so that the test sees whether the page broke and what it sent.
pub fn shop_html(site: &str) -> String {
    let page = std::fs::read_to_string(root().join("demo/index.html")).unwrap();
    page.replace("__COLLECTOR__", "/perf")
        .replace("data-site=\"demo\"", &format!("data-site=\"{site}\""))
        .replace(
            "<meta charset=\"utf-8\">",
            &format!("<meta charset=\"utf-8\">\n  {RECORDER}"),
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
    /// Its body as JSON: what the script sent (`Null` when the body was not JSON).
    pub body: Value,
}

/// The `Server-Timing` of every page a [`Shop`] serves: a CDN's cache hit, the edge's and the
/// origin's time (a description with a space, quoted), a description of 70 bytes (the script
/// cuts it to 64), and entries beyond the 10 the script sends (`m4` to `m12`).
pub const SERVER_TIMING: &str = "cdn-cache;desc=HIT, edge;dur=12.5, origin;dur=80;desc=\"db and render\", \
     long;desc=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, \
     m4;dur=4, m5;dur=5, m6;dur=6, m7;dur=7, m8;dur=8, m9;dur=9, m10;dur=10, m11;dur=11, m12;dur=12";

/// A shop behind nginx whose intake location logs every beacon (time, status, body) and can
/// send the first beacon to a stand-in server that answers with `fail` (nginx directives,
/// e.g. `return 503;`), round robin with the collector. Its pages come with [`SERVER_TIMING`].
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
        Shop::start_with(c, pages, fail, "").await
    }

    /// As [`Shop::start`], with `extra` added to nginx's `server` block (more locations).
    pub async fn start_with(
        c: &Collector,
        pages: &[(&str, String)],
        fail: Option<&str>,
        extra: &str,
    ) -> Shop {
        let pages = page_dir(pages);
        let logs = tempfile::tempdir().unwrap();
        let log = logs.path().join("beacons.log");
        let upstream = match fail {
            Some(_) => "http://flaky",
            None => "http://collector",
        };
        let fail_port = free_port();
        let server_extra = format!(
            "location /shop/ {{ alias {}/; add_header Server-Timing '{SERVER_TIMING}'; }}\n\
             location = /perf/api/v1/measurements {{ access_log {} beacons; \
             proxy_ignore_client_abort on; \
             proxy_pass {upstream}/api/v1/measurements; proxy_next_upstream off; }}\n{extra}",
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
        c.diag.beacon_log(&log);
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
                // nginx wrote the body as the inside of a JSON string (`escape=json`).
                let text: String = serde_json::from_str(&format!("\"{body}\"")).unwrap_or_default();
                Beacon {
                    at,
                    status,
                    ids: ids.captures_iter(body).map(|c| c[1].to_owned()).collect(),
                    body: serde_json::from_str(&text).unwrap_or(Value::Null),
                }
            })
            .collect()
    }
}

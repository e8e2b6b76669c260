//! The tracking script in a real browser (Debian's headless Chromium through chromedriver),
//! loaded through a real nginx that mounts the collector under `/perf/` as a shop would.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

const SETTLE: Duration = Duration::from_secs(30);

/// chromedriver on a free port, and a WebDriver session with a fresh profile.
struct Browser {
    client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (scripts/stack.sh install installs chromium-driver)");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "chromedriver did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir().unwrap();
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
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({ "binary": "/usr/bin/chromium", "args": args }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("WebDriver session");
        Browser {
            client,
            driver,
            _profile: profile,
        }
    }

    async fn eval(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    /// Waits until `condition` (a JS expression) is true in the page.
    async fn wait_for(&self, condition: &str) {
        let start = Instant::now();
        while self.eval(&format!("return !!({condition});")).await != json!(true) {
            assert!(start.elapsed() < SETTLE, "page never reached: {condition}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Browser {
    /// Ends the WebDriver session (chromedriver then stops Chromium).
    async fn quit(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// The demo shop page for `site`, as the shop serves it: script from `/perf/`, plus a
/// recorder of uncaught errors so that the test sees whether the page broke.
fn shop_page(site: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let page = std::fs::read_to_string(root().join("demo/index.html")).unwrap();
    let recorder = "<script>window.__errors=[];addEventListener('error',function(e){__errors.push(String(e.message))});\
                    addEventListener('unhandledrejection',function(e){__errors.push(String(e.reason))});</script>";
    let page = page
        .replace("__COLLECTOR__", "/perf")
        .replace("data-site=\"demo\"", &format!("data-site=\"{site}\""))
        .replace(
            "<meta charset=\"utf-8\">",
            &format!("<meta charset=\"utf-8\">\n  {recorder}"),
        );
    std::fs::write(dir.path().join("index.html"), page).unwrap();
    std::fs::copy(root().join("demo/hero.svg"), dir.path().join("hero.svg")).unwrap();
    // chmod so that nginx workers (nobody) can read the page.
    let _ = Command::new("chmod")
        .args(["-R", "a+rX", dir.path().to_str().unwrap()])
        .status();
    dir
}

/// Loads the shop page, waits for the late layout shift, clicks "Add to cart", and leaves.
/// Returns the layout shift the page made, as the browser itself measured it.
async fn visit(browser: &Browser, page_url: &str) -> f64 {
    browser.client.goto(page_url).await.unwrap();
    browser.wait_for("document.readyState === 'complete' && document.body.firstChild.textContent === 'Free shipping this week!'").await;
    // Let the layout shift be reported, then read it back from the browser.
    let shift = browser
        .client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             new PerformanceObserver(() => {}).observe({type: 'layout-shift', buffered: true});
             setTimeout(() => { let s = 0; new PerformanceObserver(l => { l.getEntries().forEach(e => { if (!e.hadRecentInput) s += e.value; }); done(s); })
                 .observe({type: 'layout-shift', buffered: true}); }, 300);",
            vec![],
        )
        .await
        .unwrap()
        .as_f64()
        .unwrap();
    browser
        .client
        .find(Locator::Id("add"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .wait_for("document.getElementById('cart').textContent === 'Cart: 1 item'")
        .await;
    assert_eq!(
        browser.eval("return window.__errors;").await,
        json!([]),
        "the page has no errors"
    );
    browser.client.goto("about:blank").await.unwrap();
    shift
}

async fn rows_for_site(env: &TestEnv<'_>, site: &str, want: usize) -> Vec<Value> {
    let sql = format!(
        "SELECT {ROW_COLUMNS} FROM {}.measurements FINAL WHERE site = '{site}'",
        env.db
    );
    let start = Instant::now();
    loop {
        let rows = env.query(0, &sql).await;
        if rows.len() >= want || start.elapsed() > SETTLE {
            return rows;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn page_view_lands_once(flaky: bool) {
    let test_start = Instant::now();
    let env = TestEnv::new(Stack::shared()).await;
    let c = env
        .collector(&[("COLLECTOR_TRUSTED_PROXIES", "127.0.0.1/32")])
        .await;
    let page = shop_page("shop-demo");
    let fail_port = free_port();
    let (server_extra, http_extra) = if flaky {
        // Round robin over a server that answers 503 and the collector: the first beacon
        // fails, the next one goes through.
        (
            "location = /perf/api/v1/measurements { proxy_pass http://flaky/api/v1/measurements; proxy_next_upstream off; }".to_string(),
            format!(
                "upstream flaky {{ server 127.0.0.1:{fail_port}; server 127.0.0.1:{}; }}\n\
                 server {{ listen 127.0.0.1:{fail_port}; location / {{ return 503; }} }}",
                c.port
            ),
        )
    } else {
        (String::new(), String::new())
    };
    let shop = format!(
        "location /shop/ {{ alias {}/; }}\n{server_extra}",
        page.path().display()
    );
    let proxy = Nginx::start_with(c.port, &shop, &http_extra).await;
    env.cli(&["sites", "add", "--key", "shop-demo", "--origin", &proxy.url])
        .success();

    let browser = Browser::start().await;
    let page_url = format!("{}/shop/", proxy.url);
    let shift = visit(&browser, &page_url).await;
    assert!(shift > 0.0, "the page makes a layout shift");

    let rows = rows_for_site(&env, "shop-demo", 1).await;
    assert_eq!(rows.len(), 1, "exactly one row for the page view: {rows:?}");
    let r = &rows[0];
    let took_ms = test_start.elapsed().as_millis() as f64;
    assert_eq!(r["url"], page_url.as_str());
    for metric in ["ttfb_ms", "fcp_ms", "lcp_ms"] {
        let v = r[metric]
            .as_f64()
            .unwrap_or_else(|| panic!("{metric} missing: {r}"));
        assert!(
            v > 0.0 && v < took_ms,
            "{metric} = {v}, test took {took_ms} ms"
        );
    }
    assert!(
        r["cls"].as_f64().unwrap() >= shift * 0.999,
        "cls {} vs shift {shift}",
        r["cls"]
    );
    assert!(
        r["inp_ms"].as_f64().unwrap() > 0.0,
        "INP after the click: {r}"
    );
    assert_eq!(r["navigation_type"], "navigate");
    assert!(r["viewport_width"].as_u64().unwrap() > 0);
    assert!(r["dom_content_loaded_ms"].as_f64().unwrap() > 0.0);
    assert!(r["load_ms"].as_f64().unwrap() > 0.0);
    assert!(r["user_agent"].as_str().unwrap().contains("Chrome"));
    // Over the test: one id stored, whatever the number of sends.
    assert_eq!(c.metric("collector_measurements_accepted_total").await, 1.0);
    browser.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_view_lands_once_with_its_vitals() {
    page_view_lands_once(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_view_lands_once_when_the_intake_fails_once() {
    page_view_lands_once(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_site_stores_nothing_and_breaks_nothing() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let page = shop_page("no-such-site");
    let shop = format!("location /shop/ {{ alias {}/; }}", page.path().display());
    let proxy = Nginx::start_with(c.port, &shop, "").await;
    let browser = Browser::start().await;
    visit(&browser, &format!("{}/shop/", proxy.url)).await;
    // The beacon was answered 403; wait for it to have been answered, then check.
    let start = Instant::now();
    while c
        .metric("collector_http_requests_total{route=\"/api/v1/measurements\",status=\"403\"}")
        .await
        < 1.0
    {
        assert!(start.elapsed() < SETTLE, "the beacon never arrived");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (marker, m) = measurement(&env.site);
    assert_eq!(c.post_json(&m).await.0, 202);
    env.wait_rows(&[marker], SETTLE).await;
    assert!(rows_for_site(&env, "no-such-site", 0).await.is_empty());
    browser.quit().await;
}

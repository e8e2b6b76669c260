//! The tracking script in a real browser (Debian's headless Chromium through chromedriver),
//! loaded through a real nginx that mounts the collector under `/perf/` as a shop would.

use collector_tests::common;

use std::time::{Duration, Instant};

use common::browser::{page_dir, shop_html, Browser, Engine, Shop, HIDE, SETTLE, SETTLED};
use common::*;
use serde_json::{json, Value};

fn shop_page(site: &str) -> tempfile::TempDir {
    page_dir(&[("index.html", shop_html(site))])
}

/// Loads the shop page, waits for the late layout shift, clicks "Add to cart", and leaves.
/// Returns the layout shift the page made, as the browser itself measured it.
async fn visit(browser: &Browser, page_url: &str) -> f64 {
    let shift = view(browser, page_url).await;
    browser.goto("about:blank").await;
    shift
}

/// [`visit`] without leaving.
async fn view(browser: &Browser, page_url: &str) -> f64 {
    browser.goto(page_url).await;
    browser.wait_for(SETTLED).await;
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
    browser.click("add").await;
    browser
        .wait_for("document.getElementById('cart').textContent === 'Cart: 1 item'")
        .await;
    assert_eq!(
        browser.eval("return window.__errors;").await,
        json!([]),
        "the page has no errors"
    );
    shift
}

/// Rows of `site`; waits until there are at least `want` (panics after [`SETTLE`]).
async fn rows_for_site(env: &TestEnv<'_>, site: &str, want: usize) -> Vec<Value> {
    let sql = format!(
        "SELECT {ROW_COLUMNS} FROM {}.measurements FINAL WHERE site = '{site}'",
        env.db
    );
    poll_until(&env.diag, SETTLE, Duration::from_millis(200), || async {
        let rows = env.query(0, &sql).await;
        if rows.len() >= want {
            return Ok(rows);
        }
        Err(format!(
            "{} of {want} rows of {site} after {SETTLE:?}",
            rows.len()
        ))
    })
    .await
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
    env.add_site("shop-demo", &["--origin", &proxy.url]);

    let browser = Browser::start(Engine::Chromium, &env.diag).await;
    let page_url = format!("{}/shop/", proxy.url);
    let shift = if flaky {
        // A page that can still read the answer (hidden by a tab switch) retries the 503;
        // one that is leaving cannot (docs/script.md: "Sending").
        let shift = view(&browser, &page_url).await;
        browser.eval(HIDE).await;
        rows_for_site(&env, "shop-demo", 1).await;
        browser.goto("about:blank").await;
        shift
    } else {
        visit(&browser, &page_url).await
    };
    assert!(shift > 0.0, "the page makes a layout shift");

    let rows = rows_for_site(&env, "shop-demo", 1).await;
    assert_eq!(rows.len(), 1, "exactly one row for the page view: {rows:?}");
    check_page_view_row(&rows[0], &page_url, test_start.elapsed(), shift);
    // Over the test: one id stored, whatever the number of sends.
    assert_eq!(c.metric("collector_measurements_accepted_total").await, 1.0);
    browser.quit().await;
}

/// The row of the demo page's view at `page_url`: its timings positive and within the test's
/// time so far (`took`), its CLS at least the page's own `shift` less 0.1 %, INP after the
/// click, a UUIDv7 id made at `ts`, and the other fields filled.
fn check_page_view_row(r: &Value, page_url: &str, took: Duration, shift: f64) {
    let took_ms = took.as_millis() as f64;
    assert_eq!(col(r, "url"), page_url);
    for metric in ["ttfb_ms", "fcp_ms", "lcp_ms"] {
        let v = col(r, metric)
            .as_f64()
            .unwrap_or_else(|| panic!("{metric} missing: {r}"));
        assert!(
            v > 0.0 && v < took_ms,
            "{metric} = {v}, test took {took_ms} ms"
        );
    }
    assert!(
        col(r, "cls").as_f64().unwrap() >= shift * 0.999,
        "cls {} vs shift {shift}",
        col(r, "cls")
    );
    assert!(
        col(r, "inp_ms").as_f64().unwrap() > 0.0,
        "INP after the click: {r}"
    );
    assert_eq!(col(r, "navigation_type"), "navigate");
    // The script's ids are UUIDv7 (contract v4 §3), made at the page view's start: its `ts`.
    let id = uuid::Uuid::parse_str(col(r, "id").as_str().unwrap()).unwrap();
    assert_eq!(id.get_version_num(), 7, "a UUIDv7 id: {id}");
    let id_ms = id.as_bytes()[..6]
        .iter()
        .fold(0i64, |ms, b| (ms << 8) | i64::from(*b));
    assert_eq!(
        Some(id_ms),
        as_i64(col(r, "ts")),
        "the id's time is ts: {r}"
    );
    assert!(col(r, "viewport_width").as_u64().unwrap() > 0);
    assert!(col(r, "dom_content_loaded_ms").as_f64().unwrap() > 0.0);
    assert!(col(r, "load_ms").as_f64().unwrap() > 0.0);
    assert!(col(r, "user_agent").as_str().unwrap().contains("Chrome"));
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
    let browser = Browser::start(Engine::Chromium, &env.diag).await;
    visit(&browser, &format!("{}/shop/", proxy.url)).await;
    // The script asked for its site's settings, got 404, and so sent nothing at all.
    let start = Instant::now();
    while c
        .metric_if_present("collector_http_requests_total{route=\"/api/v1/sites\",status=\"404\"}")
        .await
        .is_none()
    {
        if start.elapsed() >= SETTLE {
            env.diag
                .give_up("the script never asked for its settings")
                .await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (marker, m) = measurement(&env.site);
    assert_eq!(c.post_json(&m).await.0, 202);
    env.wait_rows(&[marker], SETTLE).await;
    assert!(rows_for_site(&env, "no-such-site", 0).await.is_empty());
    let text = http_get(format!("{}/metrics", c.admin_url))
        .await
        .text()
        .await
        .unwrap();
    // Every status of the intake has a series from the start; those that counted something:
    let posts: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("collector_http_requests_total{route=\"/api/v1/measurements\""))
        .filter(|l| !l.ends_with("} 0"))
        .collect();
    assert_eq!(
        posts,
        ["collector_http_requests_total{route=\"/api/v1/measurements\",status=\"202\"} 1"],
        "only the marker was posted"
    );
    browser.quit().await;
}

/// Loads `url`, waits for the page to settle, and checks that it has no errors.
async fn load(browser: &Browser, url: &str) {
    browser.goto(url).await;
    browser.wait_for(SETTLED).await;
    assert_eq!(browser.eval("return window.__errors;").await, json!([]));
}

/// Issue 13, kind 8: behind a script loader (Rocket Loader rewrites the tag's type; a
/// fetch-and-eval loader runs the code with `document.currentScript` null), the script finds
/// its own tag and sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_finds_its_tag_without_current_script() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let loader = "<script type=\"text/rocketscript\" data-site=\"shop-loaded\" src=\"/perf/script.js\"></script>\n  \
                  <script>fetch('/perf/script.js').then(function (r) { return r.text(); }).then(function (code) {\
                  window.__currentScript = document.currentScript; (0, eval)(code); });</script>";
    let html = shop_html("shop-loaded").replace(
        "<script defer src=\"/perf/script.js\" data-site=\"shop-loaded\"></script>",
        loader,
    );
    assert!(
        html.contains("text/rocketscript"),
        "the demo page's tag was replaced"
    );
    let shop = Shop::start(&c, &[("index.html", html)], None).await;
    env.add_site("shop-loaded", &["--origin", &shop.proxy.url]);
    let browser = Browser::start(Engine::Chromium, &env.diag).await;
    let page_url = format!("{}/shop/", shop.proxy.url);
    visit(&browser, &page_url).await;
    let rows = rows_for_site(&env, "shop-loaded", 1).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(col(&rows[0], "url"), page_url.as_str());
    assert!(
        col(&rows[0], "lcp_ms").as_f64().unwrap() > 0.0,
        "{}",
        rows[0]
    );
    assert!(
        col(&rows[0], "inp_ms").as_f64().unwrap() > 0.0,
        "{}",
        rows[0]
    );
    // The condition under test held: the code ran without a current script.
    browser.goto(&page_url).await;
    browser.wait_for("'__currentScript' in window").await;
    assert_eq!(
        browser.eval("return window.__currentScript;").await,
        Value::Null
    );
    browser.quit().await;
}

/// Issue 13, kind 8: the site's `sample_rate` is applied once per page view: a page view not
/// drawn sends nothing, one drawn sends, and its retry follows the same draw even when later
/// draws would say no; the rate is stored with the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_rate_is_decided_once_per_page_view_and_stored() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let site = "shop-sampled";
    // Math.random is the script's draw; it is stubbed before the script runs.
    let with_draws = |draws: &str| {
        shop_html(site).replace(
            "<meta charset=\"utf-8\">",
            &format!("<meta charset=\"utf-8\">\n  <script>{draws}</script>"),
        )
    };
    let pages = [
        // Every draw 0.99: not sampled at a rate of 0.5.
        ("out.html", with_draws("Math.random = function () { return 0.99; };")),
        // The first draw 0.3 (sampled), every later one 0.99.
        (
            "in.html",
            with_draws("(function () { var n = 0; Math.random = function () { return n++ ? 0.99 : 0.3; }; })();"),
        ),
    ];
    let shop = Shop::start(&c, &pages, Some("return 503;")).await;
    env.add_site(site, &["--origin", &shop.proxy.url, "--sample-rate", "0.5"]);
    let browser = Browser::start(Engine::Chromium, &env.diag).await;

    // Not drawn: hidden, then left; nothing is sent.
    load(&browser, &format!("{}/shop/out.html", shop.proxy.url)).await;
    browser.eval(HIDE).await;
    browser.goto("about:blank").await;

    // Drawn: hidden while alive, so that the first send's 503 is read and retried by timer.
    let page_url = format!("{}/shop/in.html", shop.proxy.url);
    load(&browser, &page_url).await;
    browser.eval(HIDE).await;
    let rows = rows_for_site(&env, site, 1).await;
    browser.goto("about:blank").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(col(&rows[0], "url"), page_url.as_str());
    assert_eq!(col(&rows[0], "sample_rate"), 0.5);
    let statuses: Vec<u16> = shop.beacons().iter().map(|b| b.status).collect();
    assert_eq!(
        statuses,
        [503, 202],
        "the page view not drawn sent nothing; the drawn one sent twice"
    );
    browser.quit().await;
}

/// Issue 13, kind 9: a 429 is retried once, after `Retry-After`, with the same id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_retried_once_after_retry_after() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let site = "shop-limited";
    let shop = Shop::start(
        &c,
        &[("index.html", shop_html(site))],
        Some("add_header Retry-After 2 always; return 429;"),
    )
    .await;
    env.add_site(site, &["--origin", &shop.proxy.url]);
    let browser = Browser::start(Engine::Chromium, &env.diag).await;
    load(&browser, &format!("{}/shop/", shop.proxy.url)).await;
    browser.eval(HIDE).await;
    let rows = rows_for_site(&env, site, 1).await;
    browser.goto("about:blank").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let beacons = shop.beacons();
    let statuses: Vec<u16> = beacons.iter().map(|b| b.status).collect();
    assert_eq!(statuses, [429, 202], "{beacons:?}");
    // The page's timer starts when it has read the 429, which nginx stamps (`$msec`, whole
    // milliseconds) when it logs the request, just after writing the answer the page may
    // already be reading: the retry is logged no earlier than 2 s less that, within 50 ms.
    let waited = beacons[1].at - beacons[0].at;
    assert!(
        waited >= 1.95,
        "retried {waited:.3} s after a Retry-After of 2 s (tolerance 50 ms: nginx stamps each \
         beacon in whole ms as it logs it, after the page may have read the answer)"
    );
    assert_eq!(c.metric("collector_measurements_accepted_total").await, 1.0);
    assert_eq!(
        c.metric("collector_measurements_duplicate_total").await,
        0.0
    );
    browser.quit().await;
}

/// Found by review (issue 27): the page's own synthetic `keydown` does not end LCP (it is
/// stored, not NULL), and a settings answer of `null` neither throws into the page nor stops
/// the send (a rate that cannot be read counts as 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synthetic_input_and_a_null_settings_answer_change_nothing() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let site = "shop-odd";
    let html = shop_html(site).replace(
        "<meta charset=\"utf-8\">",
        "<meta charset=\"utf-8\">\n  <script>addEventListener('DOMContentLoaded', function () {\
         document.dispatchEvent(new KeyboardEvent('keydown', {key: 'a'})); });</script>",
    );
    let pages = page_dir(&[("index.html", html)]);
    let extra = format!(
        "location /shop/ {{ alias {}/; }}\n\
         location /perf/api/v1/sites/ {{ default_type application/json; return 200 'null'; }}",
        pages.path().display()
    );
    let proxy = Nginx::start_with(c.port, &extra, "").await;
    env.add_site(site, &["--origin", &proxy.url]);
    let browser = Browser::start(Engine::Chromium, &env.diag).await;
    let page_url = format!("{}/shop/", proxy.url);
    load(&browser, &page_url).await;
    // Hidden while alive: the send waits for the settings answer, which is `null`.
    browser.eval(HIDE).await;
    let rows = rows_for_site(&env, site, 1).await;
    assert_eq!(
        browser.eval("return window.__errors;").await,
        json!([]),
        "the page has no errors"
    );
    browser.goto("about:blank").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(
        col(&rows[0], "lcp_ms").as_f64().is_some_and(|v| v > 0.0),
        "LCP measured despite a synthetic keydown: {}",
        rows[0]
    );
    assert_eq!(col(&rows[0], "sample_rate"), 1.0);
    browser.quit().await;
}

/// A single-page app's page: two links that change its route (`history.pushState` and a new
/// `main`), for [`route_changes_of_a_single_page_app`].
fn spa_html(site: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\">\
         <script>window.__errors=[];addEventListener('error',function(e){{__errors.push(String(e.message))}});</script>\
         <script defer src=\"/perf/script.js\" data-site=\"{site}\"></script></head><body>\
         <nav><a id=\"p2\" href=\"/shop/spa/page2\">Page 2</a> <a id=\"p3\" href=\"/shop/spa/page3\">Page 3</a></nav>\
         <main id=\"main\"><h1>Home</h1><p>Welcome</p></main>\
         <script>function go(ev) {{ ev.preventDefault(); var u = ev.currentTarget.getAttribute('href');\
         history.pushState({{}}, '', u); document.getElementById('main').innerHTML =\
         '<h1>' + u + '</h1><p>' + 'Route content. '.repeat(80) + '</p>'; }}\
         document.getElementById('p2').addEventListener('click', go);\
         document.getElementById('p3').addEventListener('click', go);</script></body></html>"
    )
}

/// Issue 26, item 2, and issue 54, item 1: a single-page app's route changes, which Chromium
/// reports as `soft-navigation` entries, are page views of their own: each with its own id,
/// URL and `navigation_type` `soft_navigation`, TTFB 0, FCP and LCP from the route change to
/// its paint, CLS from then on; the view before it is sent when it ends. One request per page
/// view. Firefox and WebKit report no route change: one page view (the load's URL) with the
/// route changes inside it. The values against web-vitals: `parity.rs`.
async fn route_changes_of_a_single_page_app(engine: Engine) {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let site = format!("shop-spa-{engine:?}").to_lowercase();
    let shop = Shop::start(&c, &[("spa.html", spa_html(&site))], None).await;
    env.add_site(&site, &["--origin", &shop.proxy.url]);
    let browser = Browser::start(engine, &env.diag).await;
    let start_url = format!("{}/shop/spa.html", shop.proxy.url);
    browser.goto(&start_url).await;
    browser
        .wait_for("document.readyState === 'complete' && performance.getEntriesByType('paint').length > 0")
        .await;
    let soft = engine == Engine::Chromium;
    for (n, link) in [(1, "p2"), (2, "p3")] {
        browser.click(link).await;
        let done = if soft {
            format!("performance.getEntriesByType('soft-navigation').length === {n}")
        } else {
            format!("location.pathname === '/shop/spa/page{}'", n + 1)
        };
        browser.wait_for(&done).await;
    }
    assert_eq!(browser.eval("return window.__errors;").await, json!([]));
    browser.goto("about:blank").await;
    let views = if soft { 3 } else { 1 };
    let rows = rows_for_site(&env, &site, views).await;
    browser.quit().await;
    assert_eq!(rows.len(), views, "{rows:?}");
    let by_url = |u: &str| -> &Value {
        rows.iter()
            .find(|r| col(r, "url") == u)
            .unwrap_or_else(|| panic!("no page view of {u}: {rows:?}"))
    };
    assert_eq!(col(by_url(&start_url), "navigation_type"), "navigate");
    if soft {
        let page2 = format!("{}/shop/spa/page2", shop.proxy.url);
        let page3 = format!("{}/shop/spa/page3", shop.proxy.url);
        for (url, referrer) in [(&page2, &start_url), (&page3, &page2)] {
            assert_route_change(by_url(url), referrer);
        }
    }
    let beacons = shop.beacons();
    assert_eq!(
        beacons.len(),
        views,
        "one request per page view: {beacons:?}"
    );
    assert!(beacons.iter().all(|b| b.status == 202), "{beacons:?}");
    assert_eq!(
        c.metric("collector_measurements_accepted_total").await,
        views as f64
    );
}

collector_tests::per_engine!(route_changes_of_a_single_page_app);

/// The row of a route change that followed `referrer`, with no layout shift: its own
/// metrics, none of the load's.
fn assert_route_change(r: &Value, referrer: &str) {
    assert_eq!(col(r, "navigation_type"), "soft_navigation", "{r}");
    assert_eq!(col(r, "referrer"), referrer, "{r}");
    assert_eq!(col(r, "ttfb_ms"), 0.0, "{r}");
    let fcp = col(r, "fcp_ms")
        .as_f64()
        .unwrap_or_else(|| panic!("no FCP: {r}"));
    assert!(fcp > 0.0 && fcp < 5000.0, "{r}");
    // The route's text is painted with its first paint or later: LCP at least FCP (1 ms for
    // rounding; the comparison with web-vitals: parity.rs).
    let lcp = col(r, "lcp_ms")
        .as_f64()
        .unwrap_or_else(|| panic!("no LCP: {r}"));
    assert!(lcp >= fcp - 1.0 && lcp < 5000.0, "{r}");
    assert_eq!(col(r, "cls"), 0.0, "{r}");
    assert!(
        col(r, "dom_content_loaded_ms").is_null() && col(r, "load_ms").is_null(),
        "{r}"
    );
}

/// Issue 39, item 4: a page prerendered by speculation rules and activated by a click 4 s
/// later is one page view, `navigation_type` `prerender`, its times counted from
/// `activationStart` as web-vitals counts them (TTFB, FCP and LCP less `activationStart`, at
/// least 0) and its start (`ts`, the id's time) at the activation; a prerendered page never
/// activated sends nothing. Headless Chromium prerenders under WebDriver without any flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prerendered_page_is_one_page_view_from_its_activation() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let site = "shop-prerender";
    let seen_dir = tempfile::tempdir().unwrap();
    let seen = seen_dir.path().join("seen.log");
    let shop = Shop::start_with(
        &c,
        &prerender_pages(site),
        None,
        &format!(
            "location = /shop/seen {{ access_log {}; return 204; }}",
            seen.display()
        ),
    )
    .await;
    env.add_site(site, &["--origin", &shop.proxy.url]);
    let browser = Browser::start(Engine::Chromium, &env.diag).await;
    let base = format!("{}/shop", shop.proxy.url);

    let (page, clicked_ms) = activated_after_4_s(&env, &browser, &base, &seen).await;
    // Prerendered, never activated: the visitor goes elsewhere.
    browser.goto(&format!("{base}/start2.html")).await;
    wait_until(
        &env.diag,
        "never.html to be prerendered",
        SETTLE,
        Duration::from_millis(100),
        || was_prerendered(&seen, "never"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    browser.goto(&format!("{base}/plain.html")).await;
    rows_for_site(&env, site, 1).await;
    // Time for a beacon of the discarded prerender, had it sent one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    browser.quit().await;
    let rows = rows_for_site(&env, site, 1).await;
    let beacons = shop.beacons();
    assert_eq!(
        rows.len(),
        1,
        "one page view: {rows:?}; beacons {beacons:?}"
    );
    assert_eq!(beacons.len(), 1, "one request: {beacons:?}");
    check_prerendered_row(&rows[0], &base, &page, clicked_ms);
}

/// The shop's pages for the prerender test: `start.html` prerendering `next.html`,
/// `start2.html` prerendering `never.html`, and `plain.html`.
fn prerender_pages(site: &str) -> Vec<(&'static str, String)> {
    // The pages that prerender another have no script of ours: only the prerendered ones count.
    let rules = |target: &str| {
        format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>start</title>\
             <script type=\"speculationrules\">{{\"prerender\":[{{\"source\":\"list\",\"urls\":[\"/shop/{target}\"]}}]}}</script>\
             </head><body><p><a id=\"go\" href=\"/shop/{target}\">{target}</a></p></body></html>"
        )
    };
    // A prerendered page tells the shop's server so (`/shop/seen`, logged).
    let prerendered = |name: &str| {
        shop_html(site).replace(
            "<meta charset=\"utf-8\">",
            &format!(
                "<meta charset=\"utf-8\">\n  <script>window.__prerendered = document.prerendering;\
                 if (document.prerendering) fetch('/shop/seen?{name}');</script>"
            ),
        )
    };
    vec![
        ("start.html", rules("next.html")),
        ("next.html", prerendered("next")),
        ("start2.html", rules("never.html")),
        ("never.html", prerendered("never")),
        (
            "plain.html",
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>plain</title></head><body><p>plain</p></body></html>".into(),
        ),
    ]
}

/// Whether the page `name` told the shop's server it was prerendered (`/shop/seen?NAME` in the
/// log `seen`); what the log holds when not.
async fn was_prerendered(seen: &std::path::Path, name: &str) -> Result<(), String> {
    let log = std::fs::read_to_string(seen).unwrap_or_default();
    log.contains(&format!("/shop/seen?{name} "))
        .then_some(())
        .ok_or_else(|| format!("not prerendered yet; the log: {log:?}"))
}

/// Opens `start.html`, waits until `next.html` is prerendered and activates it by a click 4 s
/// after the start page was shown; what web-vitals would report, from the page's own entries
/// (asserted prerendered, without errors, activated after at least 3.5 s), and the click's
/// time (ms since the epoch).
async fn activated_after_4_s(
    env: &TestEnv<'_>,
    browser: &Browser,
    base: &str,
    seen: &std::path::Path,
) -> (Value, i64) {
    browser.goto(&format!("{base}/start.html")).await;
    let shown = Instant::now();
    wait_until(
        &env.diag,
        "next.html to be prerendered",
        SETTLE,
        Duration::from_millis(100),
        || was_prerendered(seen, "next"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(4).saturating_sub(shown.elapsed())).await;
    let clicked_ms = now_ms();
    browser.click("go").await;
    browser
        .wait_for("location.pathname.endsWith('/next.html') && performance.getEntriesByType('navigation')[0].activationStart > 0 && document.readyState === 'complete'")
        .await;
    // What web-vitals would report, from the page's own entries.
    let page = browser
        .client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             const nav = performance.getEntriesByType('navigation')[0], a = nav.activationStart;
             setTimeout(() => new PerformanceObserver((l) => {
               const e = l.getEntries();
               const fcp = performance.getEntriesByName('first-contentful-paint')[0];
               done({prerendered: window.__prerendered, a, errors: window.__errors,
                     ts: Math.round(performance.timeOrigin + a), type: nav.type,
                     ttfb: Math.max(0, nav.responseStart - a),
                     fcp: fcp ? Math.max(0, fcp.startTime - a) : null,
                     lcp: Math.max(0, e[e.length - 1].startTime - a)});
             }).observe({type: 'largest-contentful-paint', buffered: true}), 500);",
            vec![],
        )
        .await
        .unwrap();
    println!("the activated page: {page}");
    assert_eq!(page["prerendered"], true, "{page}");
    assert_eq!(page["errors"], json!([]), "{page}");
    let activation = page["a"].as_f64().unwrap();
    assert!(
        activation >= 3500.0,
        "activated 4 s after the prerender: {page}"
    );
    browser.goto(&format!("{base}/plain.html")).await;

    (page, clicked_ms)
}

/// The one row of the prerendered page: its URL, `navigation_type` `prerender`, its times
/// within 0.5 ms of web-vitals' (`page`), its start and its id's time at the activation
/// (within 2 s of the click at `clicked_ms`).
fn check_prerendered_row(r: &Value, base: &str, page: &Value, clicked_ms: i64) {
    assert_eq!(col(r, "url"), format!("{base}/next.html").as_str(), "{r}");
    assert_eq!(col(r, "navigation_type"), "prerender", "{r}");
    let near = |column: &str, want: &Value| {
        let got = col(r, column)
            .as_f64()
            .unwrap_or_else(|| panic!("{column}: {r}"));
        let want = want
            .as_f64()
            .unwrap_or_else(|| panic!("{column} in the page: {page}"));
        assert!(
            (got - want).abs() < 0.5,
            "{column}: {got}, web-vitals' {want}: {r}"
        );
    };
    near("ttfb_ms", &page["ttfb"]);
    near("fcp_ms", &page["fcp"]);
    near("lcp_ms", &page["lcp"]);
    // The page view starts at the activation, not at the prerender.
    assert_eq!(as_i64(col(r, "ts")), page["ts"].as_i64(), "{r}");
    let ts = as_i64(col(r, "ts")).unwrap();
    assert!(
        (ts - clicked_ms).abs() < 2000,
        "ts {ts}, clicked at {clicked_ms}: {r}"
    );
    let id = uuid::Uuid::parse_str(col(r, "id").as_str().unwrap()).unwrap();
    let id_ms = id.as_bytes()[..6]
        .iter()
        .fold(0i64, |ms, b| (ms << 8) | i64::from(*b));
    assert_eq!(id_ms, ts, "the id's time is the activation: {r}");
}

/// Issue 40: the row of a page served with [`common::browser::SERVER_TIMING`] that sets the
/// declared dimension `variant` and an undeclared one carries `cdn_cache` `hit`, the page
/// group of the site's rule, the declared dimension only, and the Server-Timing names: in
/// each of the three engines (each exposes `serverTiming` on loopback; Firefox only on a
/// secure context or loopback, docs/script.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_rows_carry_cdn_cache_page_group_dimensions_and_server_timing() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    for (engine, name) in [
        (Engine::Chromium, "chromium"),
        (Engine::Firefox, "firefox"),
        (Engine::WebKit, "webkit"),
    ] {
        stored_row_in(&env, &c, engine, name).await;
    }
}

/// The row of one engine's page view (see the test above).
async fn stored_row_in(env: &TestEnv<'_>, c: &Collector, engine: Engine, name: &str) {
    let site = format!("shop-fields-{name}");
    let site = site.as_str();
    let html = shop_html(site).replace(
        "collectorq.push(['dimension', 'variant', 'b']);",
        "collectorq.push(['dimension', 'variant', 'b'], ['dimension', 'undeclared', 'x']);",
    );
    assert!(
        html.contains("'undeclared'"),
        "the demo page sets `variant`"
    );
    let shop = Shop::start(c, &[("p.html", html)], None).await;
    env.add_site(
        site,
        &[
            "--origin",
            &shop.proxy.url,
            "--dimension",
            "variant",
            "--page-group",
            "product=/shop/*",
        ],
    );
    let browser = Browser::start(engine, &env.diag).await;
    load(&browser, &format!("{}/shop/p.html", shop.proxy.url)).await;
    browser.goto("about:blank").await;
    rows_for_site(env, site, 1).await;
    browser.quit().await;
    let columns = "cdn_cache, page_group, dimension_names, dimension_values, server_timing_name";
    let rows = env.final_rows(columns, &format!("site = '{site}'")).await;
    assert_eq!(rows.len(), 1, "{name}: {rows:?}");
    let r = &rows[0];
    assert_eq!(col(r, "cdn_cache"), "hit", "{name}: {r}");
    assert_eq!(col(r, "page_group"), "product", "{name}: {r}");
    assert_eq!(
        col(r, "dimension_names"),
        &json!(["variant"]),
        "{name}: {r}"
    );
    assert_eq!(col(r, "dimension_values"), &json!(["b"]), "{name}: {r}");
    assert_eq!(
        col(r, "server_timing_name"),
        &json!([
            "cdn-cache",
            "edge",
            "origin",
            "long",
            "m4",
            "m5",
            "m6",
            "m7",
            "m8",
            "m9"
        ]),
        "{name}: {r}"
    );
}

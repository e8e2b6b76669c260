//! Every visitor's page view, exactly once, in every engine (issue 27): the tracking script in
//! real Chromium, Firefox ESR and WebKitGTK, each driven through WebDriver, on the demo shop
//! page behind a real nginx that mounts the collector under `/perf/` and logs every beacon.
//!
//! Per engine, one session walks through the ways a visitor leaves a page (navigate away,
//! follow a link, switch tabs and come back, return with Back ten times, close the window,
//! quit the browser); each page view is told apart by the scenario in its URL (`?s=`). Then,
//! per page view: rows stored (exactly one under `FINAL`), requests that carried its id (one,
//! nothing failing), and which metrics are filled, against what the engine measures
//! ([`Engine::measures`]). The table printed (`--nocapture`) is the one in docs/script.md.

use collector_tests::common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use common::browser::{shop_html, Beacon, Browser, Engine, Shop, HIDE, SETTLE, SETTLED};
use common::*;
use serde_json::json;

mod page_views;
mod sends;

/// Back-button returns per engine.
const RETURNS: usize = 10;

/// The shop's pages: `a.html` (the demo page, with links to `b.html` and `plain.html` that
/// keep its query, and a record of `pageshow`), `b.html` (the demo page again) and
/// `plain.html` (no script: where a visitor goes when leaving).
fn pages(site: &str) -> Vec<(&'static str, String)> {
    // `__events`: Event Timing entries seen (an interaction is reported after its next paint).
    // `__fcp`: the engine reported the first contentful paint (this observer is registered
    // before the tracking script's, so both are told in the same task).
    let shows = "<script>window.__shows=0;addEventListener('pageshow',function(e){__shows++;window.__persisted=e.persisted;});\
                 window.__events=0;try{new PerformanceObserver(function(l){__events+=l.getEntries().length;})\
                 .observe({type:'event',durationThreshold:16,buffered:true});}catch(e){}\
                 window.__fcp=false;new PerformanceObserver(function(l){l.getEntries().forEach(function(e){\
                 if(e.name==='first-contentful-paint')__fcp=true;});}).observe({type:'paint',buffered:true});</script>";
    let links = "<p><a id=\"next\" href=\"b.html\">next</a> <a id=\"plain\" href=\"plain.html\">plain</a></p>\n  \
                 <script>document.getElementById('next').href='b.html'+location.search;\
                 document.getElementById('plain').href='plain.html'+location.search;</script>\n</body>";
    let a = shop_html(site)
        .replace(
            "<meta charset=\"utf-8\">",
            &format!("<meta charset=\"utf-8\">\n  {shows}"),
        )
        .replace("</body>", links);
    vec![
        ("a.html", a),
        ("b.html", shop_html(site)),
        (
            "plain.html",
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>plain</title></head><body><p id=\"plain\">plain</p></body></html>".into(),
        ),
    ]
}

/// Loads `url` (a page of [`pages`]) and waits until it settled and its first contentful
/// paint was reported, without errors. A page left before its first paint has no FCP (as
/// web-vitals reports none): WebKitGTK on a loaded machine once painted a.html only after the
/// test had followed its link, and the page view came without `fcp_ms`.
async fn open(b: &Browser, url: &str) {
    b.goto(url).await;
    b.wait_for(&format!("{SETTLED} && window.__fcp === true"))
        .await;
    no_errors(b).await;
}

async fn no_errors(b: &Browser) {
    assert_eq!(
        b.eval("return window.__errors;").await,
        json!([]),
        "{:?}: the page has no errors",
        b.engine
    );
}

/// Clicks "Add to cart" (a 60 ms handler: an interaction for INP) and waits for its effect.
async fn interact(b: &Browser) {
    b.click("add").await;
    b.wait_for("document.getElementById('cart').textContent === 'Cart: 1 item'")
        .await;
    // The engine reports an interaction after the frame that presents it: wait for that, so
    // that the page view's INP is there to send (where the engine measures INP).
    if b.engine.measures().2 {
        b.wait_for("window.__events > 0").await;
    }
}

/// Opens a new tab and switches to it, as a visitor switches tabs: the page's tab is hidden
/// and stays alive. The page's window, for [`close_tab`]. Panics when the driver refuses.
async fn switch_tab(b: &Browser) -> fantoccini::wd::WindowHandle {
    let page = b.client.window().await.unwrap();
    let tab = b.client.new_window(true).await.unwrap();
    b.client.switch_to_window(tab.handle).await.unwrap();
    page
}

/// Closes the current tab and switches back to `page`; panics when the driver refuses.
async fn close_tab(b: &Browser, page: fantoccini::wd::WindowHandle) {
    b.client.close_window().await.unwrap();
    b.client.switch_to_window(page).await.unwrap();
}

/// Hides the page as a tab switch does: by [`switch_tab`], or in WebKitGTK (whose MiniBrowser
/// fires no `visibilitychange` when WebDriver opens a tab) by [`HIDE`]. The page's window
/// when a tab was opened, for [`close_tab`].
async fn hide(b: &Browser) -> Option<fantoccini::wd::WindowHandle> {
    if b.engine == Engine::WebKit {
        b.eval(HIDE).await;
        None
    } else {
        Some(switch_tab(b).await)
    }
}

//! What a dashboard groups by, derived once at intake from the `User-Agent` header: the device
//! type, the browser family and major version, and the OS family (contract §2, v3).
//!
//! Parsing is the ua-parser project's: its Rust implementation (crate `ua-parser`) with its
//! maintained patterns, uap-core's `regexes.yaml`, vendored as JSON in
//! `collector/assets/uap-core/` (version and how to update it in the README there). Nothing here
//! matches a browser or OS by our own regex; only the device *type*, which uap-core does not
//! give, is read off uap-core's answer and the UA tokens the platforms document:
//!
//! - `bot`: uap-core's device family `Spider` (its crawler patterns), a headless browser
//!   (`HeadlessChrome`, `PhantomJS`: automated page loads, not visitors), or a lab tool that
//!   loads pages on a throttled emulated device to measure them (Lighthouse and PageSpeed
//!   Insights, GTmetrix: [`LAB_TOOLS`]; WebPageTest uap-core knows), whose numbers are not
//!   visitors' experience.
//!   Stored, not dropped.
//! - `tablet`: an iPad, a device family naming a tablet or Kindle, an Android UA without the
//!   `Mobile` token (Chrome for Android sends `Mobile` on phones only: "User-Agent strings",
//!   Chrome for Developers), or a `Tablet` token. iPadOS 13 and later send a Macintosh UA by
//!   default and are counted as `desktop`, as Chrome's field data (CrUX) counts them.
//! - `mobile`: the `Mobi` token (MDN, "Browser detection using the user agent": "we recommend
//!   looking for the string Mobi anywhere in the User Agent"), or iOS, or a phone OS.
//! - `desktop`: any other UA whose OS uap-core recognises.
//! - `unknown`: the rest (an empty UA, `curl`, a library).
//!
//! Parsing one UA costs tens of microseconds (thousands of patterns), so each distinct UA
//! string is parsed once and cached, up to [`CACHE_ENTRIES`] strings (moka, TinyLFU admission,
//! so that a flood of one-off UAs does not push out the common ones). The cost per beacon with
//! and without the cache is in `docs/benchmarks.md` (`cargo test --release -p collector
//! user_agent_cost -- --ignored --nocapture`).

use std::sync::{Arc, LazyLock};

/// The most distinct user-agent strings kept parsed. Each entry holds the UA (at most
/// 512 bytes) and four short strings: at most about 6 MiB.
pub const CACHE_ENTRIES: u64 = 10_000;

/// What one user agent says, as stored in the `device_type`, `browser`, `browser_version` and
/// `os` columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    /// `mobile`, `tablet`, `desktop`, `bot` or `unknown` (module doc).
    pub device_type: &'static str,
    /// Browser family as uap-core names it (`Chrome`, `Mobile Safari`, `Firefox`, ...);
    /// `Other` when unknown.
    pub browser: String,
    /// The browser's major version, digits only; empty when unknown.
    pub browser_version: String,
    /// OS family as uap-core names it (`Windows`, `Mac OS X`, `iOS`, `Android`, ...); `Other`
    /// when unknown.
    pub os: String,
}

/// uap-core's patterns, parsed and compiled once per process (about a second in a debug
/// build, a fraction of that in release).
static EXTRACTOR: LazyLock<ua_parser::Extractor<'static>> = LazyLock::new(|| {
    let regexes: ua_parser::Regexes<'static> =
        serde_json::from_str(include_str!("../assets/uap-core/regexes.json"))
            .expect("the vendored uap-core patterns are valid JSON (checked by a unit test)");
    ua_parser::Extractor::try_from(regexes)
        .expect("the vendored uap-core patterns compile (checked by a unit test)")
});

/// Parses `user_agent` with uap-core's patterns, without the cache.
pub fn parse(user_agent: &str) -> Agent {
    if user_agent.is_empty() {
        return Agent {
            device_type: "unknown",
            browser: "Other".into(),
            browser_version: String::new(),
            os: "Other".into(),
        };
    }
    let (browser, os, device) = EXTRACTOR.extract(user_agent);
    let (family, major) = match &browser {
        Some(b) => (b.family.as_ref(), b.major.unwrap_or("")),
        None => ("Other", ""),
    };
    let os_family = os.as_ref().map_or("Other", |o| o.os.as_ref());
    let device_family = device.as_ref().map_or("Other", |d| d.device.as_ref());
    Agent {
        device_type: device_type(user_agent, family, os_family, device_family),
        browser: family.to_owned(),
        browser_version: Some(
            major
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>(),
        )
        .filter(|v| v.len() <= MAX_VERSION_DIGITS)
        .unwrap_or_default(),
        os: os_family.to_owned(),
    }
}

/// Tokens of lab tools' user agents that uap-core 0.18 does not mark as spiders:
/// `Chrome-Lighthouse` (Lighthouse and PageSpeed Insights, developer.chrome.com/docs/lighthouse)
/// and `GTmetrix` (gtmetrix.com). WebPageTest's `PTST` it marks already.
pub const LAB_TOOLS: [&str; 2] = ["Chrome-Lighthouse", "GTmetrix"];

/// Longest `browser_version` kept (digits); a longer major version is no real browser's and
/// is stored empty, so a made-up one cannot grow the column's dictionary without bound.
pub const MAX_VERSION_DIGITS: usize = 5;

/// The device type from uap-core's families and the UA's documented tokens (module doc).
fn device_type(user_agent: &str, browser: &str, os: &str, device: &str) -> &'static str {
    let has = |token: &str| user_agent.contains(token);
    if device == "Spider"
        || matches!(browser, "HeadlessChrome" | "PhantomJS")
        || LAB_TOOLS.iter().any(|t| has(t))
    {
        "bot"
    } else if device == "iPad"
        || device.contains("Tablet")
        || device.starts_with("Kindle")
        || has("Tablet")
        || (os == "Android" && !has("Mobile"))
    {
        "tablet"
    } else if has("Mobi") || matches!(os, "iOS" | "Windows Phone" | "KaiOS" | "BlackBerry OS") {
        "mobile"
    } else if os != "Other" {
        "desktop"
    } else {
        "unknown"
    }
}

/// The parsed agents of the distinct user-agent strings seen, bounded by [`CACHE_ENTRIES`].
#[derive(Clone)]
pub struct UserAgents {
    cache: moka::sync::Cache<Box<str>, Arc<Agent>>,
}

impl Default for UserAgents {
    fn default() -> Self {
        Self::with_capacity(CACHE_ENTRIES)
    }
}

impl UserAgents {
    /// A cache of at most `entries` parsed user agents (0: parse every time).
    pub fn with_capacity(entries: u64) -> Self {
        UserAgents {
            cache: moka::sync::Cache::new(entries),
        }
    }

    /// What `user_agent` (the stored form, [`crate::beacon::user_agent`]) says; parsed on the
    /// first sight of the string, from the cache after.
    pub fn get(&self, user_agent: &str) -> Arc<Agent> {
        if let Some(agent) = self.cache.get(user_agent) {
            return agent;
        }
        let agent = Arc::new(parse(user_agent));
        self.cache.insert(user_agent.into(), agent.clone());
        agent
    }

    /// The process's cache for the paths outside intake (spool records and rows of earlier
    /// releases), of [`CACHE_ENTRIES`].
    pub fn shared() -> &'static UserAgents {
        static SHARED: LazyLock<UserAgents> = LazyLock::new(UserAgents::default);
        &SHARED
    }

    /// Compiles uap-core's patterns now, so that the first beacon does not wait for them.
    pub fn warm_up() {
        LazyLock::force(&EXTRACTOR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(ua: &str) -> (&'static str, String, String, String) {
        let a = parse(ua);
        (a.device_type, a.browser, a.browser_version, a.os)
    }

    fn s(x: &str) -> String {
        x.to_owned()
    }

    /// Real user agents of the engines and devices a shop sees, and what each is stored as.
    #[test]
    fn the_engines_and_devices_a_shop_sees() {
        let cases = [
            (
                "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
                ("desktop", s("Chrome"), s("131"), s("Windows")),
            ),
            (
                "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
                ("mobile", s("Mobile Safari"), s("17"), s("iOS")),
            ),
            (
                "Mozilla/5.0 (iPad; CPU OS 16_6 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/16.6 Mobile/15E148 Safari/604.1",
                ("tablet", s("Mobile Safari"), s("16"), s("iOS")),
            ),
            (
                "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36",
                ("mobile", s("Chrome Mobile"), s("131"), s("Android")),
            ),
            (
                "Mozilla/5.0 (Linux; Android 13; SM-X200) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
                ("tablet", s("Chrome"), s("131"), s("Android")),
            ),
            (
                "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
                ("desktop", s("Firefox"), s("128"), s("Linux")),
            ),
            (
                "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Safari/605.1.15",
                ("desktop", s("Safari"), s("17"), s("Mac OS X")),
            ),
            (
                "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/131.0.0.0 Safari/537.36",
                ("bot", s("HeadlessChrome"), s("131"), s("Linux")),
            ),
            (
                "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
                ("bot", s("Googlebot"), s("2"), s("Other")),
            ),
            (
                // PageSpeed Insights' mobile run (Lighthouse on an emulated Moto G Power).
                "Mozilla/5.0 (Linux; Android 11; moto g power (2022)) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/119.0.0.0 Mobile Safari/537.36 Chrome-Lighthouse",
                ("bot", s("Chrome Mobile"), s("119"), s("Android")),
            ),
            (
                "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 PTST/241210.151218",
                // uap-core knows WebPageTest's agent already.
                ("bot", s("WebPageTest.org bot"), s(""), s("Linux")),
            ),
            (
                "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/99999999999999999999.0 Safari/537.36",
                ("desktop", s("Chrome"), s(""), s("Windows")),
            ),
            ("curl/8.5.0", ("unknown", s("curl"), s("8"), s("Other"))),
            ("", ("unknown", s("Other"), s(""), s("Other"))),
        ];
        for (ua, want) in cases {
            assert_eq!(kind(ua), want, "{ua}");
        }
    }

    #[test]
    fn the_cache_answers_what_parsing_answers_and_stays_bounded() {
        let agents = UserAgents::with_capacity(100);
        let ua = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0";
        assert_eq!(*agents.get(ua), parse(ua));
        assert!(
            Arc::ptr_eq(&agents.get(ua), &agents.get(ua)),
            "second sight cached"
        );
        for i in 0..1_000 {
            agents.get(&format!("Bot{i}/1.0"));
        }
        agents.cache.run_pending_tasks();
        assert!(
            agents.cache.entry_count() <= 100,
            "{}",
            agents.cache.entry_count()
        );
    }

    /// The cost per beacon of deriving the agent, parsed each time and from the cache, at the
    /// benchmark's mix (`scripts/bench/beacon.lua` sends one UA; a shop's traffic has a few
    /// hundred distinct ones). Run by hand; a speed figure is not a test.
    #[test]
    #[ignore]
    fn user_agent_cost() {
        UserAgents::warm_up();
        let uas: Vec<String> = (0..200)
            .map(|i| format!("Mozilla/5.0 (Linux; Android 14; Pixel {i}) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36"))
            .collect();
        let n = 20_000;
        let t = std::time::Instant::now();
        for i in 0..n {
            std::hint::black_box(parse(&uas[i % uas.len()]));
        }
        let uncached = t.elapsed() / n as u32;
        let agents = UserAgents::default();
        let t = std::time::Instant::now();
        for i in 0..n * 10 {
            std::hint::black_box(agents.get(&uas[i % uas.len()]));
        }
        let cached = t.elapsed() / (n * 10) as u32;
        println!("user agent per beacon: parsed {uncached:?}, cached {cached:?}");
    }
}

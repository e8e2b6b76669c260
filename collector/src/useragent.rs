//! What a dashboard groups by, derived once at intake from the `User-Agent` header: the device
//! type, the browser family and major version, and the OS family (contract §2, v3).
//!
//! Parsing is the ua-parser project's: its Rust implementation (crate `ua-parser`) with its
//! maintained patterns, uap-core's `regexes.yaml`, vendored as JSON in
//! `collector/assets/uap-core/` (version and how to update it in the README there). Nothing here
//! matches a browser or OS by our own regex; only the device *type*, which uap-core does not
//! give, is read off uap-core's answer and the UA tokens the platforms document:
//!
//! - `bot`: whatever device its string imitates, a crawler, a synthetic monitor, a headless
//!   renderer or a lab tool, never a visitor. Known by crawler-user-agents' maintained
//!   patterns (npm's `crawler-user-agents`, vendored in `collector/assets/crawler-user-agents/`
//!   and compiled in; 1,500 patterns: search, shopping and AI crawlers such as
//!   `Google-InspectionTool`, `GoogleOther` and `Storebot-Google`, monitors such as
//!   `DatadogSynthetics`, `HeadlessChrome`, Lighthouse and GTmetrix, HTTP libraries such as
//!   `curl` and `python-requests`); by uap-core's device family `Spider` (its own crawler
//!   patterns) or its browser families `HeadlessChrome` and `PhantomJS`; or by a browser
//!   family that is a crawler's name (one the patterns match, or a word ending in `bot`, or
//!   naming a spider or crawler: uap-core names Storebot-Google's phone UA `Storebot`).
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

/// crawler-user-agents' patterns, one a line (see the README beside them).
const CRAWLER_PATTERNS: &str = include_str!("../assets/crawler-user-agents/patterns.txt");

/// The crawler patterns as one regex (each an alternative), compiled once per process.
static CRAWLERS: LazyLock<regex::Regex> = LazyLock::new(|| {
    crawler_regex(CRAWLER_PATTERNS)
        .expect("the vendored crawler patterns compile (checked by a unit test)")
});

/// One regex matching wherever any line of `patterns` matches. Errors: a pattern outside the
/// `regex` crate's syntax, or a set too large to compile.
fn crawler_regex(patterns: &str) -> Result<regex::Regex, regex::Error> {
    let alternatives: Vec<String> = patterns
        .lines()
        .filter(|p| !p.is_empty())
        .map(|p| format!("(?:{p})"))
        .collect();
    regex::Regex::new(&alternatives.join("|"))
}

/// Whether `text` (a user agent, or a browser family uap-core read off one) is a crawler's,
/// by crawler-user-agents' patterns.
pub fn is_crawler(text: &str) -> bool {
    CRAWLERS.is_match(text)
}

/// Whether a browser family is a crawler's name: one the crawler patterns match, or one with a
/// word ending in `bot` or naming a spider or crawler (`Storebot`, `PingdomBot`,
/// `MSIECrawler`); no browser of uap-core's is named so.
fn names_a_crawler(family: &str) -> bool {
    is_crawler(family)
        || family
            .split(|c: char| !c.is_ascii_alphanumeric())
            .map(str::to_ascii_lowercase)
            .any(|w| w.ends_with("bot") || w.contains("spider") || w.contains("crawler"))
}

/// Longest `browser_version` kept (digits); a longer major version is no real browser's and
/// is stored empty, so a made-up one cannot grow the column's dictionary without bound.
pub const MAX_VERSION_DIGITS: usize = 5;

/// The device type from uap-core's families and the UA's documented tokens (module doc).
fn device_type(user_agent: &str, browser: &str, os: &str, device: &str) -> &'static str {
    let has = |token: &str| user_agent.contains(token);
    if device == "Spider"
        || matches!(browser, "HeadlessChrome" | "PhantomJS")
        || names_a_crawler(browser)
        || is_crawler(user_agent)
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

    /// Compiles uap-core's and the crawler patterns now, so that the first beacon does not
    /// wait for them.
    pub fn warm_up() {
        LazyLock::force(&EXTRACTOR);
        LazyLock::force(&CRAWLERS);
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
            // An HTTP library is no visitor: crawler-user-agents lists it.
            ("curl/8.5.0", ("bot", s("curl"), s("8"), s("Other"))),
            ("ShopApp/3.2 (build 77)", ("unknown", s("Other"), s(""), s("Other"))),
            ("", ("unknown", s("Other"), s(""), s("Other"))),
        ];
        for (ua, want) in cases {
            assert_eq!(kind(ua), want, "{ua}");
        }
    }

    /// Issue 39: crawlers, monitors and renderers dressed as phones and desktops, as Google,
    /// Datadog and others document them, are `bot` whatever device they imitate.
    #[test]
    fn crawlers_and_monitors_are_bots_whatever_device_they_imitate() {
        let cases = [
            (
                // URL Inspection and the Rich Results Test, smartphone.
                "Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.6099.71 Mobile Safari/537.36 (compatible; Google-InspectionTool/1.0;)",
                ("bot", s("Chrome Mobile"), s("120"), s("Android")),
            ),
            (
                "Mozilla/5.0 (compatible; Google-InspectionTool/1.0;)",
                ("bot", s("Other"), s(""), s("Other")),
            ),
            (
                "Mozilla/5.0 (compatible; GoogleOther)",
                ("bot", s("Other"), s(""), s("Other")),
            ),
            (
                "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GoogleOther) Chrome/120.0.6099.71 Safari/537.36",
                ("bot", s("Chrome"), s("120"), s("Other")),
            ),
            (
                "Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.6099.71 Mobile Safari/537.36 (compatible; GoogleOther)",
                ("bot", s("Chrome Mobile"), s("120"), s("Android")),
            ),
            (
                // Google's shopping crawler on a phone: uap-core names the browser Storebot.
                "Mozilla/5.0 (Linux; Android 8.0; Pixel 2 Build/OPD3.170816.012; Storebot-Google/1.0) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/81.0.4044.138 Mobile Safari/537.36",
                ("bot", s("Storebot"), s(""), s("Android")),
            ),
            (
                "Mozilla/5.0 (X11; Linux x86_64; Storebot-Google/1.0) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/79.0.3945.88 Safari/537.36",
                ("bot", s("Storebot"), s(""), s("Linux")),
            ),
            (
                // Datadog's browser tests.
                "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36 DatadogSynthetics",
                ("bot", s("Chrome"), s("120"), s("Linux")),
            ),
            (
                "Mozilla/5.0 (iPhone; CPU iPhone OS 7_0 like Mac OS X) AppleWebKit/537.51.1 (KHTML, like Gecko) Version/7.0 Mobile/11A465 Safari/9537.53 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
                ("bot", s("bingbot"), s("2"), s("iOS")),
            ),
            (
                "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)",
                ("bot", s("GPTBot"), s("1"), s("Other")),
            ),
            (
                "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36 NewRelicSynthetics/1.0",
                ("bot", s("Chrome"), s("120"), s("Linux")),
            ),
            (
                "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 GTmetrix",
                ("bot", s("Chrome"), s("131"), s("Windows")),
            ),
        ];
        for (ua, want) in cases {
            assert_eq!(kind(ua), want, "{ua}");
        }
    }

    /// A browser family that is a crawler's name makes the row a bot, also where the crawler
    /// patterns miss its user agent; no browser's family is taken for one.
    #[test]
    fn a_family_named_after_a_crawler_is_a_bot() {
        for family in [
            "Storebot",
            "PingdomBot",
            "StatusCakeBot",
            "MSIECrawler",
            "Spider",
            "AdsBot-Google",
        ] {
            assert!(names_a_crawler(family), "{family}");
        }
        for family in [
            "Chrome",
            "Chrome Mobile",
            "Chrome Mobile WebView",
            "Mobile Safari",
            "Samsung Internet",
            "Firefox",
            "Edge",
            "Opera",
            "Yandex Browser",
            "Facebook",
            "Instagram",
            "Google",
            "Other",
        ] {
            assert!(!names_a_crawler(family), "{family}");
        }
        // A phone's UA the patterns miss, whose family uap-core names after a crawler.
        let ua = "Mozilla/5.0 (Linux; Android 8.0; Pixel 2; ShopCrawl/1.0) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/81.0.4044.138 Mobile Safari/537.36";
        assert!(
            !is_crawler(ua),
            "the patterns miss it, so the family decides"
        );
        assert_eq!(
            device_type(ua, "Storebot", "Android", "Generic Smartphone"),
            "bot"
        );
        assert_eq!(
            device_type(ua, "Chrome Mobile", "Android", "Generic Smartphone"),
            "mobile"
        );
    }

    /// What `patterns.txt` must hold: the vendored JSON's patterns, in order (README).
    #[test]
    fn the_compiled_crawler_patterns_are_the_vendored_lists() {
        let list: Vec<serde_json::Value> = serde_json::from_str(include_str!(
            "../assets/crawler-user-agents/crawler-user-agents.json"
        ))
        .unwrap();
        let from_json: Vec<&str> = list
            .iter()
            .map(|e| e["pattern"].as_str().expect("each entry has a pattern"))
            .collect();
        let compiled: Vec<&str> = CRAWLER_PATTERNS.lines().collect();
        assert_eq!(compiled.len(), 1_500);
        assert_eq!(
            compiled, from_json,
            "patterns.txt is not crawler-user-agents.json's patterns: regenerate it (README)"
        );
        assert!(crawler_regex(CRAWLER_PATTERNS).is_ok());
        assert!(
            crawler_regex("Googlebot\\/\n(?<!x)bot").is_err(),
            "a pattern the regex crate cannot read is an error, not a silent miss"
        );
    }

    /// Every real crawler string the list was made from (its `instances`) is a `bot`.
    #[test]
    fn every_listed_crawler_instance_is_a_bot() {
        let list: Vec<serde_json::Value> = serde_json::from_str(include_str!(
            "../assets/crawler-user-agents/crawler-user-agents.json"
        ))
        .unwrap();
        let mut checked = 0;
        let mut not_bots = Vec::new();
        for entry in &list {
            for ua in entry["instances"].as_array().expect("instances") {
                let ua = ua.as_str().expect("an instance is a string");
                checked += 1;
                let agent = parse(ua);
                if agent.device_type != "bot" {
                    not_bots.push((ua, agent.device_type, entry["pattern"].clone()));
                }
            }
        }
        assert!(checked > 2_000, "{checked} instances");
        assert!(
            not_bots.is_empty(),
            "{} not bots: {not_bots:#?}",
            not_bots.len()
        );
    }

    /// Browsers, webviews and in-app browsers of real visitors: none is taken for a crawler.
    #[test]
    fn no_visitors_browser_is_taken_for_a_crawler() {
        let visitors = [
            "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
            "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0",
            "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Safari/605.1.15",
            "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
            "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.0 Safari/605.1.15",
            "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
            "Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36",
            "Mozilla/5.0 (Linux; Android 13; SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/24.0 Chrome/117.0.0.0 Mobile Safari/537.36",
            "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 YaBrowser/24.10.0.0 Safari/537.36",
            "Mozilla/5.0 (Linux; Android 13; M2101K6G) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Mobile Safari/537.36 OPR/79.0.0.0",
            "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 [FBAN/FBIOS;FBAV/470.0.0.38.109;FBBV/617024452;FBDV/iPhone14,5;FBMD/iPhone;FBSN/iOS;FBSV/17.5;FBSS/3;FBID/phone;FBLC/en_US;FBOP/5;FBRV/620064826]",
            "Mozilla/5.0 (Linux; Android 14; SM-A546B Build/UP1A.231005.007; wv) AppleWebKit/537.36 (KHTML, like Gecko) Version/4.0 Chrome/125.0.6422.165 Mobile Safari/537.36 [FB_IAB/FB4A;FBAV/468.1.0.56.78;]",
            "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 Instagram 337.0.3.23.54 (iPhone14,5; iOS 17_5; en_US; en; scale=3.00; 1170x2532; 614066233)",
            "Mozilla/5.0 (Linux; Android 14; Pixel 8 Build/UQ1A.240205.004; wv) AppleWebKit/537.36 (KHTML, like Gecko) Version/4.0 Chrome/121.0.6167.178 Mobile Safari/537.36 GSA/15.5.38.28.arm64",
            "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) GSA/309.0.617781843 Mobile/15E148 Safari/604.1",
            "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 Line/14.9.1",
            "Mozilla/5.0 (iPhone; CPU iPhone OS 16_6 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 Twitter for iPhone/10.12",
            "Mozilla/5.0 (Linux; Android 12; Pinterest) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Mobile Safari/537.36 [Pinterest/Android]",
            "Mozilla/5.0 (Linux; Android 12) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Mobile Safari/537.36 Snapchat/12.50.0.40 (like Safari/8617.2.4.10.4, panda)",
            "Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36 TikTok",
        ];
        for ua in visitors {
            let agent = parse(ua);
            assert!(
                matches!(agent.device_type, "mobile" | "tablet" | "desktop"),
                "{ua}: {agent:?}"
            );
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
        let t = std::time::Instant::now();
        UserAgents::warm_up();
        let warm_up = t.elapsed();
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
        let t = std::time::Instant::now();
        for i in 0..n {
            std::hint::black_box(is_crawler(&uas[i % uas.len()]));
        }
        let crawlers = t.elapsed() / n as u32;
        println!(
            "user agent per beacon: parsed {uncached:?} (of it the crawler patterns {crawlers:?}), \
             cached {cached:?}; patterns compiled in {warm_up:?}"
        );
    }
}

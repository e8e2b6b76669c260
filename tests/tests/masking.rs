//! Contract v5 §2 masking end to end, on real servers (issue 52, "a corpus test"): every
//! masking case the issue names and the contract's examples, each in every stored string field
//! (page URL path and kept query values, referrer, both resource URLs, the three selectors, a
//! dimension value, a Server-Timing name and description, and for addresses and tokens the user
//! agent), sent as JSON and as gzip, through the spool, the kept-aside files and ClickHouse 26.x:
//! no piece of any secret anywhere, on any decoding of the bytes. And the reverse: the slugs,
//! dates, SKUs and version numbers a shop needs survive in every field.

use collector_tests::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const VISIBLE: Duration = Duration::from_secs(30);

/// A secret as a shop's page could carry it, and the pieces of it that must be found nowhere.
struct Case {
    /// What it is, for the failure message.
    what: &'static str,
    /// The text as the page holds it (before the browser percent-encodes it for a URL).
    secret: &'static str,
    /// Pieces of `secret` of which none may be stored: long enough that only a leak holds them.
    pieces: &'static [&'static str],
    /// Whether the user agent carries it too: contract v5 masks addresses and tokens there,
    /// not numbers (a user agent is full of build numbers).
    in_agent: bool,
}

/// The cases, then the contract's examples.
const CASES: &[Case] = &[
    Case {
        what: "a magic-link token written with - and _",
        secret: "Qz7_Wm4-Hp2kR9sT6vB3nL",
        pieces: &["qz7_wm4", "hp2kr9st6vb3nl"],
        in_agent: true,
    },
    Case {
        what: "a card number in groups",
        secret: "4929-8173-4402-9951",
        pieces: &["4929-8173", "4402-9951", "8173-4402", "4929817344029951"],
        in_agent: false,
    },
    Case {
        what: "a phone number with + and spaces",
        secret: "+49 171 9638527",
        pieces: &["171 9638527", "171-9638527", "1719638527"],
        in_agent: false,
    },
    Case {
        what: "an e-mail address encoded twice",
        secret: "mara.quell%2540example.org",
        pieces: &["mara.quell"],
        in_agent: true,
    },
    Case {
        what: "a plus-addressed e-mail address",
        secret: "tovi.brenn+orders@example.net",
        pieces: &["tovi.brenn", "brenn+orders", "brenn orders"],
        in_agent: true,
    },
    Case {
        what: "an e-mail address in an in-app browser's user agent",
        secret: "nilo.varg@example.com",
        pieces: &["nilo.varg"],
        in_agent: true,
    },
    Case {
        what: "a JWT",
        secret: "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI5ODc2NTQzMjEwIn0.Zq8xW2vN4kP7mR1tY5uB3cD6fG9hJ0L",
        pieces: &[
            "eyjzdwiioii5odc2ntqzmjewin0",
            "zq8xw2vn4kp7mr1ty5ub3cd6fg9hj0l",
        ],
        in_agent: true,
    },
    Case {
        what: "a UUID",
        secret: "7d3f2a9c-1b4e-4f6a-9c8d-2e5b7a1c9f30",
        pieces: &["7d3f2a9c-1b4e", "9c8d-2e5b7a1c9f30"],
        in_agent: true,
    },
    Case {
        what: "a run of 13 or more digits",
        secret: "5105105105105100",
        pieces: &["5105105105"],
        in_agent: false,
    },
    Case {
        what: "a run of 20 or more letters and digits mixed",
        secret: "a8f3k2m9x7q1w5e6r4t0y",
        pieces: &["a8f3k2m9x7q1", "w5e6r4t0y"],
        in_agent: true,
    },
    Case {
        what: "an IBAN in groups",
        secret: "DE44 5001 0517 5407 3249 31",
        pieces: &["5001 0517", "5407 3249", "50010517540732"],
        in_agent: false,
    },
    Case {
        what: "a number with parentheses and a dash",
        secret: "(030) 7788-4411",
        pieces: &["7788-4411", "77884411"],
        in_agent: false,
    },
];

/// What must survive (contract v5 §2: lower-case slugs, dates, SKUs, version numbers).
const SURVIVORS: &[&str] = &[
    "summer-sale-2026-collection",
    "Nike-Air-Max-90-Black",
    "2026-12-06",
    "SKU-12345-XL",
    "v2.14.3",
];

/// `text` as a page's script would put it in a query value (`encodeURIComponent`).
fn encode_component(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `text` percent-decoded once (a malformed escape kept as it is).
fn decode_once(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Every reading of `text` a leak could hide in: as it is and percent-decoded up to four
/// times, each also with `+` read as a space, lower-cased.
fn readings(text: &str) -> Vec<String> {
    let mut out = vec![text.to_lowercase()];
    for _ in 0..4 {
        let next = decode_once(out.last().unwrap());
        out.push(next);
    }
    let spaced: Vec<String> = out.iter().map(|t| t.replace('+', " ")).collect();
    out.extend(spaced);
    out
}

/// One expression matching every piece of every case (lower case, as [`readings`] gives).
fn any_piece() -> &'static regex::Regex {
    static ANY: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    ANY.get_or_init(|| {
        let pieces: Vec<String> = CASES
            .iter()
            .flat_map(|case| case.pieces.iter().map(|p| regex::escape(p)))
            .collect();
        regex::Regex::new(&pieces.join("|")).unwrap()
    })
}

/// The pieces of the cases found in `text` on any reading, named by their case.
fn leaks(text: &str) -> Vec<String> {
    let mut found: Vec<String> = readings(text)
        .iter()
        .flat_map(|r| any_piece().find_iter(r).map(|m| m.as_str().to_owned()))
        .collect();
    found.sort();
    found.dedup();
    found
        .into_iter()
        .map(|piece| {
            let case = CASES.iter().find(|c| c.pieces.contains(&piece.as_str()));
            format!("{} ({piece})", case.map_or("?", |c| c.what))
        })
        .collect()
}

/// A selector whose last 8 bytes before the 256-byte cut start `text`: cut before it is
/// masked, a prefix of the secret would stay.
fn straddling_selector(text: &str) -> String {
    format!("div.{}#{text}", "a".repeat(256 - 8 - 5))
}

/// A beacon carrying `text` in every stored string field (`path`: as a URL path holds it,
/// `query`: as a query value holds it, `selector`: without spaces).
fn beacon(site: &str, id: &str, text: &str) -> Value {
    let path = text.replace(' ', "%20");
    let query = encode_component(text);
    let selector = text.replace(' ', "-");
    let short = |s: &str| (s.len() <= 64).then(|| s.to_owned());
    let mut timing =
        vec![json!({"name": "cdn-cache", "dur": 1, "desc": short(text).unwrap_or_default()})];
    if let Some(name) = short(text) {
        timing.push(json!({"name": name, "dur": 2}));
    }
    json!({
        "id": id,
        "site": site,
        "url": format!("https://shop.example/c/{path}/end?utm_content={query}&q={query}"),
        "referrer": format!("https://shop.example/r/{path}?utm_source={query}"),
        "lcp_url": format!("https://cdn.shop.example/i/{path}.jpg?v={query}"),
        "inp_script_url": format!("https://cdn.shop.example/js/{path}/app.js"),
        "lcp_ms": 900,
        "inp_ms": 80,
        "cls": 0.05,
        "lcp_target": format!("#o-{selector}"),
        "inp_target": straddling_selector(&selector),
        "cls_target": format!("main>div.{selector}"),
        "dimensions": {"variant": short(text)},
        "server_timing": timing,
    })
}

/// The user agent an in-app browser might send with `text` in it.
fn agent(text: &str) -> String {
    format!("Mozilla/5.0 (Linux; Android 14) AppleWebKit/537.36 Chrome/131.0.0.0 Mobile Safari/537.36 AppEmbed/3.2 (user {text})")
}

/// POSTs `body` as JSON, or gzip-compressed, with `user_agent`; asserts the 202.
async fn send(c: &Collector, body: &Value, user_agent: &str, gzip: bool) {
    let text = body.to_string();
    let mut headers = vec![
        ("content-type", "application/json"),
        ("user-agent", user_agent),
    ];
    let (status, answer, _) = if gzip {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(text.as_bytes()).unwrap();
        headers.push(("content-encoding", "gzip"));
        c.post(gz.finish().unwrap(), &headers).await
    } else {
        c.post(text, &headers).await
    };
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["accepted"], 1, "{answer}");
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Sends every case to `site` as JSON and as gzip; returns the ids (`first` and on: the ids
/// hold no digit of a secret by chance).
async fn send_corpus(c: &Collector, site: &str, first: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for case in CASES {
        let user_agent = agent(if case.in_agent { case.secret } else { "" });
        for gzip in [false, true] {
            let id = format!("00000000-0000-4000-8000-{:012x}", first + ids.len());
            send(c, &beacon(site, &id, case.secret), &user_agent, gzip).await;
            ids.push(id);
        }
    }
    ids
}

/// Contract v5 §2 and issue 52's corpus: no piece of a secret in any file of the spool folder
/// (segments and kept-aside files), any column of any row, the debug log or `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_piece_of_a_masked_secret_is_stored_anywhere_and_what_a_shop_needs_stays() {
    let env = TestEnv::on_ch26(Stack::shared()).await;
    for site in ["corpus", "refused"] {
        env.add_site(site, &["--keep-query", "*", "--dimension", "variant"]);
    }
    env.exec(
        0,
        &format!(
            "ALTER TABLE {}.measurements ADD CONSTRAINT refuse CHECK site != 'refused'",
            env.db
        ),
    )
    .await;
    let c = env.collector(&[("RUST_LOG", "debug")]).await;
    let mut ids = send_corpus(&c, "corpus", 1).await;
    let survivors = send_survivors(&c, "corpus").await;
    ids.extend(survivors.iter().map(|(id, _)| id.clone()));
    env.wait_rows(&ids, VISIBLE).await;
    // The refused site's rows after the others, in batches of their own: a batch mixing
    // refused and good rows is bisected within a budget of inserts, and this many would spend it.
    let refused = send_corpus(&c, "refused", 0x80).await.len();
    c.wait_metric(
        &format!("collector_spool_kept_aside_rows_total {refused}"),
        VISIBLE,
    )
    .await;

    let mut files = Vec::new();
    files_under(c.spool.path(), &mut files);
    let kept = files
        .iter()
        .filter(|p| p.to_string_lossy().contains("kept-aside/"));
    assert!(
        kept.count() > 0,
        "the refused rows are kept aside: {files:?}"
    );
    for path in &files {
        let bytes = std::fs::read(path).unwrap();
        let found = leaks(&String::from_utf8_lossy(&bytes));
        assert!(found.is_empty(), "{}: {found:?}", path.display());
    }
    let rows = env
        .query(0, &format!("SELECT * FROM {}.measurements", env.db))
        .await;
    assert_eq!(
        rows.len(),
        ids.len(),
        "every beacon of the site stored once"
    );
    let found = leaks(&serde_json::to_string(&rows).unwrap());
    assert!(found.is_empty(), "rows: {found:?}");
    let found = leaks(&c.metrics_text().await);
    assert!(found.is_empty(), "/metrics: {found:?}");
    let log = c.logs();
    assert!(log.contains("DEBUG"), "the log is at debug level");
    assert!(leaks(&log).is_empty(), "the log: {:?}", leaks(&log));
    let kept = survivors_stay(&env, &survivors).await;
    eprintln!(
        "{} secrets x 12 fields x JSON and gzip x stored and kept aside: no piece found; \
         survivors kept: {kept} of {}",
        CASES.len(),
        SURVIVORS.len() * SURVIVOR_FIELDS.len()
    );
}

/// The fields a survivor is checked in: every stored string field but the straddling
/// selector (cut before the survivor) and the page group (no text of the page).
const SURVIVOR_FIELDS: &[&str] = &[
    "url",
    "referrer",
    "lcp_url",
    "inp_script_url",
    "lcp_target",
    "cls_target",
    "dimension_values",
    "server_timing_name",
    "server_timing_desc",
    "user_agent",
];

/// Sends a beacon per survivor, the survivor in every field and in the user agent; returns
/// each beacon's id with its survivor.
async fn send_survivors(c: &Collector, site: &str) -> Vec<(String, &'static str)> {
    let mut sent = Vec::new();
    for (n, survivor) in SURVIVORS.iter().enumerate() {
        let id = format!("00000000-0000-4000-8000-0000000001{n:02x}");
        send(
            c,
            &beacon(site, &id, survivor),
            &agent(survivor),
            n % 2 == 1,
        )
        .await;
        sent.push((id, *survivor));
    }
    sent
}

/// Asserts that each survivor is stored in each of [`SURVIVOR_FIELDS`] of its row; returns
/// how many (survivor, field) pairs were checked.
async fn survivors_stay(env: &TestEnv<'_>, sent: &[(String, &str)]) -> usize {
    let mut missing = Vec::new();
    let mut kept = 0;
    for (id, survivor) in sent {
        let sql = format!(
            "SELECT {} FROM {}.measurements FINAL WHERE id = '{id}'",
            SURVIVOR_FIELDS.join(", "),
            env.db
        );
        let rows = env.query(0, &sql).await;
        assert_eq!(rows.len(), 1, "{id}: {rows:?}");
        for field in SURVIVOR_FIELDS {
            if rows[0][field].to_string().contains(survivor) {
                kept += 1;
            } else {
                missing.push(format!("{field}: {survivor} in {}", rows[0][field]));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "masked though nothing is secret: {missing:#?}"
    );
    kept
}

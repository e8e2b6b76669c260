//! What the image checks send to and read from the containers, synchronously (`ureq`):
//! beacons in arrays, the rows they became in ClickHouse, a collector's spool metric.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::metric_value;

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build()
}

/// The status of GET `url` (5 s at most), or the transport error.
pub fn status(url: &str) -> Result<u16, String> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(5))
        .build();
    match agent.get(url).call() {
        Ok(r) => Ok(r.status()),
        Err(ureq::Error::Status(code, _)) => Ok(code),
        Err(e) => Err(e.to_string()),
    }
}

/// Ok when GET `url` answers 200, else what it answered.
pub fn answers_200(url: &str) -> Result<(), String> {
    match status(url)? {
        200 => Ok(()),
        code => Err(format!("{url} answered {code}")),
    }
}

/// `count` measurements of `site` POSTed to the collector on 127.0.0.1:`port` in arrays of at
/// most 50; every request must be answered 202 with all of its measurements accepted. The ids.
pub fn send_beacons(port: u16, site: &str, count: usize) -> Vec<String> {
    let mut ids = vec![];
    while ids.len() < count {
        let batch: Vec<Value> = (ids.len()..count.min(ids.len() + 50))
            .map(|n| {
                let id = uuid::Uuid::new_v4().to_string();
                json!({"id": id, "site": site, "url": format!("https://shop.example/p/{n}"), "lcp_ms": 1000 + n})
            })
            .collect();
        let url = format!("http://127.0.0.1:{port}/api/v1/measurements");
        let body = serde_json::to_string(&batch).unwrap();
        let answer = agent()
            .post(&url)
            .set("content-type", "application/json")
            .send_string(&body);
        let (code, body) = match answer {
            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
            Err(e) => (0, e.to_string()),
        };
        let accepted = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v["accepted"].as_u64());
        assert!(
            code == 202 && accepted == Some(batch.len() as u64),
            "POST of {} measurements to 127.0.0.1:{port} answered {code}: {body}",
            batch.len()
        );
        ids.extend(batch.iter().map(|b| b["id"].as_str().unwrap().to_owned()));
    }
    ids
}

/// `sql FORMAT JSON` on the ClickHouse server at `url`: its rows.
pub fn clickhouse_rows(url: &str, sql: &str) -> Result<Vec<Value>, String> {
    let text = clickhouse(url, &format!("{sql} FORMAT JSON"))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
    v["data"]
        .as_array()
        .cloned()
        .ok_or_else(|| format!("no data in {text}"))
}

/// `sql` on the ClickHouse server at `url` (as `default`): its answer, trimmed.
pub fn clickhouse(url: &str, sql: &str) -> Result<String, String> {
    trimmed(agent().post(&format!("{url}/")).send_string(sql))
}

/// A ClickHouse answer's body, trimmed; a refusal as its status and body.
fn trimmed(answer: Result<ureq::Response, ureq::Error>) -> Result<String, String> {
    match answer {
        Ok(r) => Ok(r
            .into_string()
            .map_err(|e| e.to_string())?
            .trim()
            .to_owned()),
        Err(ureq::Error::Status(c, r)) => {
            Err(format!("{c}: {}", r.into_string().unwrap_or_default()))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Ok when every id of `ids` is stored exactly once under FINAL for `site` and the site has
/// no other id; else how many are missing, unexpected or stored more than once.
pub fn stored_once(url: &str, site: &str, ids: &[String]) -> Result<(), String> {
    let sql = format!(
        "SELECT toString(id) AS id, count() AS n FROM collector.measurements FINAL WHERE site = '{site}' GROUP BY id"
    );
    let rows = clickhouse_rows(url, &sql)?;
    let got: BTreeMap<String, i64> = rows
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap_or("").to_owned(),
                crate::common::as_i64(&r["n"]).unwrap_or(0),
            )
        })
        .collect();
    let missing = ids.iter().filter(|i| !got.contains_key(*i)).count();
    let unexpected = got.keys().filter(|k| !ids.contains(k)).count();
    let twice = got.values().filter(|n| **n != 1).count();
    if missing + unexpected + twice == 0 {
        return Ok(());
    }
    Err(format!(
        "{} distinct ids stored, {missing} missing, {unexpected} unexpected, {twice} more than once",
        got.len()
    ))
}

/// `collector_spool_records` of the collector whose operations listener is on `admin_port`.
pub fn spool_records(admin_port: u16) -> Result<f64, String> {
    let url = format!("http://127.0.0.1:{admin_port}/metrics");
    let text = agent()
        .get(&url)
        .call()
        .map_err(|e| e.to_string())?
        .into_string()
        .map_err(|e| e.to_string())?;
    metric_value(&text, "collector_spool_records")
        .ok_or_else(|| format!("no collector_spool_records in {url}"))
}

/// SELECT 1 as ClickHouse user `user` with `password` (headers, as the collector sends).
pub fn select1_as(url: &str, user: &str, password: &str) -> Result<(), String> {
    let answer = agent()
        .get(&format!("{url}/?query=SELECT%201"))
        .set("X-ClickHouse-User", user)
        .set("X-ClickHouse-Key", password)
        .call();
    let text = answer
        .map_err(|e| e.to_string())?
        .into_string()
        .map_err(|e| e.to_string())?;
    match text.trim() {
        "1" => Ok(()),
        other => Err(format!("answered {other:?}, not 1")),
    }
}

/// `sql` as ClickHouse user `user` with `password` (headers, as the collector sends): the
/// answer, trimmed, or the status and the server's message.
pub fn clickhouse_as(url: &str, user: &str, password: &str, sql: &str) -> Result<String, String> {
    let answer = agent()
        .post(&format!("{url}/"))
        .set("X-ClickHouse-User", user)
        .set("X-ClickHouse-Key", password)
        .send_string(sql);
    trimmed(answer)
}

/// The status of a part fetch on ClickHouse's interserver port 127.0.0.1:`port` (a part of
/// no table: past the credentials, 18.16 answers 200 with an empty body), with HTTP Basic
/// `credentials` (user, password) or none, and the first line of the answer.
pub fn interserver_fetch(
    port: u16,
    credentials: Option<(&str, &str)>,
) -> Result<(u16, String), String> {
    let url = format!(
        "http://127.0.0.1:{port}/?endpoint=DataPartsExchange%3A%2Fcheck&part=all_0_0_0&compress=false"
    );
    let mut req = agent().get(&url);
    if let Some((user, password)) = credentials {
        let token = base64(format!("{user}:{password}").as_bytes());
        req = req.set("Authorization", &format!("Basic {token}"));
    }
    let (code, r) = match req.call() {
        Ok(r) => (r.status(), r),
        Err(ureq::Error::Status(code, r)) => (code, r),
        Err(e) => return Err(e.to_string()),
    };
    let text = r.into_string().unwrap_or_default();
    Ok((code, text.lines().next().unwrap_or("").to_owned()))
}

/// `bytes` in standard base64 with padding (RFC 4648 §4), for HTTP Basic authentication.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_as_rfc_4648_says() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("interserver:check", "aW50ZXJzZXJ2ZXI6Y2hlY2s="),
        ] {
            assert_eq!(super::base64(plain.as_bytes()), coded);
        }
    }
}

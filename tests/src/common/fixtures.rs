//! What the tests send and read back: a measurement with a fresh id, dates and times, and
//! the values of ClickHouse's JSON rows and of the API's answers.

use serde_json::Value;

/// A measurement with a fresh id for `site`, and its id.
pub fn measurement(site: &str) -> (String, Value) {
    let id = uuid::Uuid::new_v4().to_string();
    let v = serde_json::json!({
        "id": id, "site": site, "url": "https://shop.example/product/1?color=red",
        "ttfb_ms": 120.5, "fcp_ms": 800, "lcp_ms": 1500.25, "cls": 0.05, "inp_ms": 64,
        "dom_content_loaded_ms": 900, "load_ms": 1800, "viewport_width": 1280,
        "navigation_type": "navigate", "effective_connection_type": "4g",
        "referrer": "https://search.example/?q=shoes",
    });
    (id, v)
}

/// `YYYY-MM-DD` of Unix seconds, UTC (days since the epoch, civil-from-days: H. Hinnant,
/// "chrono-Compatible Low-Level Date Algorithms").
pub fn utc_date(secs: i64) -> String {
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Milliseconds since the Unix epoch now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A JSON number or a quoted number (ClickHouse quotes 64-bit integers) as i64.
pub fn as_i64(v: &Value) -> Option<i64> {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// A JSON number or a quoted number (ClickHouse quotes 64-bit integers) as f64, `None` for
/// NULL; panics on anything else (text that is not a number, an array, an object).
pub fn as_number(v: &Value) -> Option<f64> {
    match v {
        Value::Null => None,
        Value::Number(n) => n.as_f64(),
        Value::String(s) => Some(s.parse().unwrap_or_else(|_| panic!("not a number: {v}"))),
        other => panic!("not a number: {other}"),
    }
}

/// Column `column` of a ClickHouse JSON row; panics naming the column (and showing the row)
/// when the row has no such column. Indexing (`row["lcp_ms"]`) reads a missing column as
/// `Null`, which an assertion that the value is NULL would pass: through `col`, `Null` means
/// the column holds NULL.
pub fn col<'a>(row: &'a Value, column: &str) -> &'a Value {
    row.as_object()
        .unwrap_or_else(|| {
            panic!("looking for column {column}: the row is not a JSON object: {row}")
        })
        .get(column)
        .unwrap_or_else(|| {
            panic!("no column {column} in the row (a missing column is not NULL): {row}")
        })
}

/// Field `key` of a JSON object (an answer, an API's document); panics naming the field (and
/// showing the object) when it is not there, as [`col`] does for rows.
pub fn field<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.as_object()
        .unwrap_or_else(|| panic!("looking for field {key}: not a JSON object: {v}"))
        .get(key)
        .unwrap_or_else(|| panic!("no field {key} in {v}"))
}

/// The metrics as `collector report` names them, their columns, and web.dev's thresholds
/// (good up to the first, poor above the second).
pub const METRICS: [(&str, &str, f64, f64); 5] = [
    ("lcp", "lcp_ms", 2500.0, 4000.0),
    ("inp", "inp_ms", 200.0, 500.0),
    ("cls", "cls", 0.1, 0.25),
    ("fcp", "fcp_ms", 1800.0, 3000.0),
    ("ttfb", "ttfb_ms", 800.0, 1800.0),
];

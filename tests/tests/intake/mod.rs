//! The whole path, beacon to ClickHouse, against real PostgreSQL and replicated ClickHouse.

use collector_tests::common;

use std::io::Write;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

mod bodies;
mod broken;
mod endpoints;
mod helpers;
mod http;
mod refusals;
mod sample_rate;

const VISIBLE: Duration = Duration::from_secs(20);

/// A request case: name, body, headers, and the expected status or count.
type Case<'a> = (&'a str, Vec<u8>, Vec<(&'a str, &'a str)>, u16);

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

fn row<'a>(rows: &'a [Value], id: &str) -> &'a Value {
    let matching: Vec<&Value> = rows.iter().filter(|r| col(r, "id") == id).collect();
    assert_eq!(matching.len(), 1, "exactly one row for {id} in {rows:?}");
    matching[0]
}

/// Column `column` of `id`'s row; panics when the row has no such column (see [`col`]: a
/// `Null` read from a missing key would pass an assertion that the value is NULL).
fn stored<'a>(rows: &'a [Value], id: &str, column: &str) -> &'a Value {
    col(row(rows, id), column)
}

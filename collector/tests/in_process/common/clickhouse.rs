//! The in-memory ClickHouse of the in-process tier: the shared fake
//! ([`fake_clickhouse::memory`]) holding the collector's `measurements` table, its rows
//! decoded with the collector's own RowBinary decoder.

use collector::measurement::{decode_all, Measurement, COLUMNS};
pub use fake_clickhouse::memory::{Fault, InsertRecord};

/// The collector's `measurements` table in the database it writes to by default
/// (`COLLECTOR_CLICKHOUSE_DATABASE`).
pub struct Measurements;

impl fake_clickhouse::memory::Table for Measurements {
    type Row = Measurement<'static>;
    const DATABASE: &'static str = "collector";
    const COLUMNS: &'static [&'static str] = COLUMNS;

    fn decode(raw: &[u8]) -> Result<Vec<Self::Row>, String> {
        decode_all(raw).map_err(|e| format!("{e:?}"))
    }

    fn url(row: &Self::Row) -> &str {
        &row.url
    }
}

/// One in-memory ClickHouse server holding [`Measurements`].
pub type ClickHouse = fake_clickhouse::memory::ClickHouse<Measurements>;

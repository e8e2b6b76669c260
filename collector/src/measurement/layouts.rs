//! Rows of earlier layouts, as earlier releases left them in their spools, read and made rows
//! of the current layout: the one function the spool is handed for that ([`upgrade`], in
//! [`super::LAYOUTS`]), and the reading of any layout for `collector spool dump`.
//!
//! - Layout 1: the JSON arrays of the first release (`CSPOOL01`), read through serde.
//! - Layout 2 (`CSPOOL02`): RowBinary rows of the table's layout-2 columns.
//! - Layout 3 (`CSPOOL03`) and after: RowBinary rows of the columns up to that layout; the
//!   columns a later layout added read as their defaults (NULL, empty, 0).
//!
//! Rows of layouts 1 and 2 lack the columns of layout 3 (`page_view_at` and the user-agent
//! columns), which intake derives: they are derived here the same way ([`complete_earlier`]).

use std::borrow::Cow;

use super::column::{Label, RowDecodeError};
use super::fields::{Measurement, LAYOUT_SECTIONS};
use super::{encode, filing, LAYOUT};
use crate::spool::Record;

/// The first layout whose rows carry the columns intake derives from the receipt and the user
/// agent; rows of earlier layouts get them from [`complete_earlier`].
pub const DERIVED_SINCE: u16 = 3;

/// How many columns a row of `layout` has (RowBinary layouts, 2 and later), or `None` for a
/// layout the table does not know.
pub fn columns_in(layout: u16) -> Option<usize> {
    let mut n = 0;
    for &(l, added) in LAYOUT_SECTIONS {
        n += added;
        if l == layout {
            return Some(n);
        }
    }
    None
}

/// Why a record's payload could not be read as rows ([`read_record`]); the message says what
/// is wrong, for people, and is what `collector spool dump` lists (it serializes as that text).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A layout-1 payload that is not a JSON array of measurements.
    #[error("not a JSON array of measurements (layout 1): {0}")]
    Json(#[source] serde_json::Error),
    /// A RowBinary row of `layout` that does not decode.
    #[error("{error} (layout {layout})")]
    Row {
        /// The record's layout.
        layout: u16,
        /// Why its row does not decode.
        #[source]
        error: RowDecodeError,
    },
}

impl serde::Serialize for ReadError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Every row of a payload of `layout`, in that layout's order, with the columns it lacks
/// defaulted or derived. Errors: [`ReadError`].
pub fn read_record(
    layout: u16,
    mut payload: &[u8],
) -> Result<Vec<Measurement<'static>>, ReadError> {
    if layout == 1 {
        let rows: Vec<Measurement> = serde_json::from_slice(payload).map_err(ReadError::Json)?;
        return Ok(rows
            .into_iter()
            .map(|m| complete_earlier(m.into_owned()))
            .collect());
    }
    let mut rows = Vec::new();
    while !payload.is_empty() {
        rows.push(
            decode_one(layout, &mut payload).map_err(|error| ReadError::Row { layout, error })?,
        );
    }
    Ok(rows)
}

/// Reads one RowBinary row of `layout` (2 or later) from the front of `input`, advancing it
/// past the row, with the columns it lacks defaulted or derived.
pub fn decode_one(layout: u16, input: &mut &[u8]) -> Result<Measurement<'static>, RowDecodeError> {
    let n = columns_in(layout).ok_or(RowDecodeError("a layout the field table does not know"))?;
    let row = Measurement::decode_prefix(input, n)?;
    Ok(if layout < DERIVED_SINCE {
        complete_earlier(row)
    } else {
        row
    })
}

/// The spool's upgrade ([`crate::spool::Layouts::upgrade`]): the rows of a payload of `layout`
/// as a record of the current layout; `None` when it does not hold whole rows of it.
pub fn upgrade(layout: u16, payload: &[u8]) -> Option<Record> {
    let rows = read_record(layout, payload).ok()?;
    let mut record = encode(&rows);
    if layout == LAYOUT {
        // Only recovery asks this of a current payload (whether it holds whole rows): its
        // bytes stay as they are.
        record.payload = payload.to_vec();
    }
    Some(record)
}

/// A row of a layout before [`DERIVED_SINCE`] with the columns intake derives set as intake
/// sets them: the page view's time ([`filing::page_view_at`]) and the parsed user agent.
pub fn complete_earlier(mut m: Measurement<'static>) -> Measurement<'static> {
    m.page_view_at = filing::page_view_at(&m.id, m.ts, i64::from(m.received_at.0) * 1000);
    let agent = crate::useragent::UserAgents::shared().get(&m.user_agent);
    m.device_type = Label(Cow::Borrowed(agent.device_type));
    m.browser = Label(Cow::Owned(agent.browser.clone()));
    m.browser_version = Label(Cow::Owned(agent.browser_version.clone()));
    m.os = Label(Cow::Owned(agent.os.clone()));
    m
}

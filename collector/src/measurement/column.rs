//! The row's one encoding, RowBinary, type by type: each Rust type of a column knows its
//! ClickHouse type and how it is written and read ([`Column`]).
//!
//! RowBinary, as ClickHouse defines it (docs: "Formats for input and output data", RowBinary):
//! rows one after another, each column in order; `String` a LEB128 length and the bytes;
//! `UInt32`, `Int64`, `Float64` and `DateTime` (a `UInt32` of Unix seconds) little-endian;
//! `UUID` its two 64-bit halves, high then low, each little-endian (as the `clickhouse` crate's
//! `serde::uuid` writes it); `Nullable(T)` a byte 1 for NULL, or 0 followed by `T`;
//! `LowCardinality(String)` as a `String`.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Why bytes are not a RowBinary row: cut short, or a length beyond the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a RowBinary measurement: {0}")]
pub struct RowDecodeError(pub(super) &'static str);

/// A Rust type that is one ClickHouse column type in RowBinary.
pub trait Column: Sized {
    /// The ClickHouse type, as the DDL spells it (`String`, `Nullable(Float64)`, ...).
    fn clickhouse_type() -> String;
    /// Appends the value's RowBinary encoding.
    fn encode(&self, out: &mut Vec<u8>);
    /// Reads one value from the front of `input`, advancing it.
    fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError>;
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], RowDecodeError> {
    if input.len() < n {
        return Err(RowDecodeError("cut short"));
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

/// Appends `n` as LEB128, as ClickHouse's `writeVarUInt` (a string's or an array's length).
fn write_length(mut n: usize, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Reads a LEB128 length from the front of `input`, advancing it.
fn read_length(input: &mut &[u8]) -> Result<usize, RowDecodeError> {
    let mut n = 0usize;
    for shift in (0..64).step_by(7) {
        let b = *take(input, 1)?.first().expect("one byte");
        n |= usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(n);
        }
    }
    Err(RowDecodeError("length beyond 64 bits"))
}

macro_rules! fixed_width {
    ($($t:ty => $name:literal),*) => {$(
        impl Column for $t {
            fn clickhouse_type() -> String {
                $name.into()
            }
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError> {
                let bytes = take(input, std::mem::size_of::<$t>())?;
                Ok(<$t>::from_le_bytes(bytes.try_into().expect("sized above")))
            }
        }
    )*};
}
fixed_width!(u32 => "UInt32", i64 => "Int64", f64 => "Float64");

/// `DateTime('UTC')`: Unix seconds, a `UInt32` in RowBinary. The column names its timezone so
/// that `toYYYYMM` and `toDate` of it (the partition and the day of the sorting key) are the
/// same on every replica whatever the server's timezone (ClickHouse #4560: without it, the
/// server's timezone decides).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DateTime(pub u32);

impl DateTime {
    /// The second a time in milliseconds since the Unix epoch falls in (clamped to the type's
    /// range, 1970 to 2106).
    pub fn from_ms(ms: i64) -> DateTime {
        DateTime((ms.max(0) / 1000).min(i64::from(u32::MAX)) as u32)
    }
}

impl Column for DateTime {
    fn clickhouse_type() -> String {
        "DateTime('UTC')".into()
    }
    fn encode(&self, out: &mut Vec<u8>) {
        self.0.encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError> {
        u32::decode(input).map(DateTime)
    }
}

impl Column for Uuid {
    fn clickhouse_type() -> String {
        "UUID".into()
    }
    fn encode(&self, out: &mut Vec<u8>) {
        let (high, low) = self.as_u64_pair();
        out.extend_from_slice(&high.to_le_bytes());
        out.extend_from_slice(&low.to_le_bytes());
    }
    fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError> {
        let bytes = take(input, 16)?;
        let high = u64::from_le_bytes(bytes[..8].try_into().expect("16 bytes"));
        let low = u64::from_le_bytes(bytes[8..].try_into().expect("16 bytes"));
        Ok(Uuid::from_u64_pair(high, low))
    }
}

impl Column for Cow<'_, str> {
    fn clickhouse_type() -> String {
        "String".into()
    }
    fn encode(&self, out: &mut Vec<u8>) {
        write_length(self.len(), out);
        out.extend_from_slice(self.as_bytes());
    }
    fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError> {
        let n = read_length(input)?;
        let bytes = take(input, n)?;
        // Every string the collector writes is UTF-8; a damaged one still decodes.
        Ok(Cow::Owned(String::from_utf8_lossy(bytes).into_owned()))
    }
}

impl<T: Column> Column for Option<T> {
    fn clickhouse_type() -> String {
        format!("Nullable({})", T::clickhouse_type())
    }
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(1),
            Some(v) => {
                out.push(0);
                v.encode(out);
            }
        }
    }
    fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError> {
        match take(input, 1)?[0] {
            0 => T::decode(input).map(Some),
            _ => Ok(None),
        }
    }
}

/// `Array(T)`: a LEB128 count, then the elements (ClickHouse docs, RowBinary: "Array is
/// represented as a varint length (unsigned LEB128), followed by successive elements").
impl<T: Column> Column for Vec<T> {
    fn clickhouse_type() -> String {
        format!("Array({})", T::clickhouse_type())
    }
    fn encode(&self, out: &mut Vec<u8>) {
        write_length(self.len(), out);
        for v in self {
            v.encode(out);
        }
    }
    fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError> {
        let n = read_length(input)?;
        // Each element takes a byte at least: a count beyond the input is damage, not a
        // reason to allocate.
        if n > input.len() {
            return Err(RowDecodeError("array length beyond the input"));
        }
        (0..n).map(|_| T::decode(input)).collect()
    }
}

/// `LowCardinality(String)`: a string of few distinct values (a device type, a browser family),
/// which ClickHouse stores as a dictionary. In RowBinary it is a `String` (ClickHouse docs,
/// "LowCardinality": the format of the inner type).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Label<'a>(pub Cow<'a, str>);

impl Column for Label<'_> {
    fn clickhouse_type() -> String {
        "LowCardinality(String)".into()
    }
    fn encode(&self, out: &mut Vec<u8>) {
        self.0.encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, RowDecodeError> {
        Cow::decode(input).map(Label)
    }
}

impl std::ops::Deref for Label<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// A column value that can let go of what it borrows.
pub trait IntoOwned {
    /// The same value, owning its data.
    type Owned;
    /// Copies what is borrowed.
    fn into_owned(self) -> Self::Owned;
}

macro_rules! owned_already {
    ($($t:ty),*) => {$(
        impl IntoOwned for $t {
            type Owned = $t;
            fn into_owned(self) -> $t {
                self
            }
        }
    )*};
}
owned_already!(u32, i64, f64, Uuid, DateTime);

impl IntoOwned for Cow<'_, str> {
    type Owned = Cow<'static, str>;
    fn into_owned(self) -> Cow<'static, str> {
        Cow::Owned(Cow::into_owned(self))
    }
}

impl IntoOwned for Label<'_> {
    type Owned = Label<'static>;
    fn into_owned(self) -> Label<'static> {
        Label(IntoOwned::into_owned(self.0))
    }
}

impl<T: IntoOwned> IntoOwned for Vec<T> {
    type Owned = Vec<T::Owned>;
    fn into_owned(self) -> Self::Owned {
        self.into_iter().map(T::into_owned).collect()
    }
}

impl<T: IntoOwned> IntoOwned for Option<T> {
    type Owned = Option<T::Owned>;
    fn into_owned(self) -> Self::Owned {
        self.map(T::into_owned)
    }
}

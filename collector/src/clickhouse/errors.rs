//! How ClickHouse failed an insert: worth retrying, or refused as bad data.

/// How an insert failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsertError {
    /// Worth retrying: network, timeout, 5xx, read-only replica, too many parts, ...
    Transient(String),
    /// ClickHouse refuses this data (e.g. code 117 INCORRECT_DATA, 53 TYPE_MISMATCH):
    /// retrying the same batch cannot succeed.
    Permanent(String),
}

/// ClickHouse error codes that mean "this data is bad", from ClickHouse's
/// `src/Common/ErrorCodes.cpp`: 6 CANNOT_PARSE_TEXT, 26 CANNOT_PARSE_QUOTED_STRING,
/// 27 CANNOT_PARSE_INPUT_ASSERTION_FAILED, 33 CANNOT_READ_ALL_DATA, 38 CANNOT_PARSE_DATE,
/// 41 CANNOT_PARSE_DATETIME, 53 TYPE_MISMATCH, 69 ARGUMENT_OUT_OF_BOUND, 70 CANNOT_CONVERT_TYPE,
/// 72 CANNOT_PARSE_NUMBER, 117 INCORRECT_DATA, 130 CANNOT_READ_ARRAY_FROM_TEXT, 469
/// VIOLATED_CONSTRAINT (a `CHECK` constraint of the table refused a row), 395
/// FUNCTION_THROW_IF_VALUE_IS_NON_ZERO (a constraint or a column default built on `throwIf`
/// threw for a row: measured on 26.9, where it otherwise held every batch behind that row).
pub const BAD_DATA_CODES: [u32; 14] = [6, 26, 27, 33, 38, 41, 53, 69, 70, 72, 117, 130, 395, 469];

/// Classifies a ClickHouse client error.
pub fn classify(error: &clickhouse::error::Error) -> InsertError {
    // One line: ClickHouse 18.16's exception texts hold newlines, which would split a log
    // line and the reason of a kept-aside file.
    let text = crate::logging::chain(error).replace('\n', " ");
    if let clickhouse::error::Error::BadResponse(body) = error {
        if let Some(code) = exception_code(body) {
            if BAD_DATA_CODES.contains(&code) {
                return InsertError::Permanent(text);
            }
        }
    }
    InsertError::Transient(text)
}

/// The `Code: N` of a ClickHouse exception text.
pub fn exception_code(text: &str) -> Option<u32> {
    let rest = &text[text.find("Code: ")? + 6..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exception_codes() {
        assert_eq!(
            exception_code("Code: 117, e.displayText() = DB::Exception: bad"),
            Some(117)
        );
        assert_eq!(
            exception_code("Code: 53. DB::Exception: Type mismatch"),
            Some(53)
        );
        assert_eq!(exception_code("connection refused"), None);
    }

    #[test]
    fn classification() {
        let bad = clickhouse::error::Error::BadResponse(
            "Code: 117. DB::Exception: Incorrect data".into(),
        );
        assert!(matches!(classify(&bad), InsertError::Permanent(_)));
        let ro = clickhouse::error::Error::BadResponse(
            "Code: 242. DB::Exception: Table is in readonly mode".into(),
        );
        assert!(matches!(classify(&ro), InsertError::Transient(_)));
        let parts = clickhouse::error::Error::BadResponse(
            "Code: 252. DB::Exception: Too many parts".into(),
        );
        assert!(matches!(classify(&parts), InsertError::Transient(_)));
        assert!(matches!(
            classify(&clickhouse::error::Error::TimedOut),
            InsertError::Transient(_)
        ));
    }
}

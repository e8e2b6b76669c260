//! Integration tests live in tests/tests/*.rs; helpers in tests/tests/common.

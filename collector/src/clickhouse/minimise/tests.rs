//! Which stored rows the rewrite writes again, in which columns, and the marks table's DDL:
//! without a server.

use super::*;
use crate::measurement::stored::Keeps;

fn sites() -> SiteRules {
    let keeps = Keeps {
        keep_query: vec!["q".into()],
        origins: vec!["https://shop.test".into()],
    };
    SiteRules::new([("shop".to_owned(), keeps, false)])
}

fn row(url: &str, agent: &str) -> Measurement<'static> {
    Measurement {
        id: uuid::Uuid::from_u128(7),
        site: "shop".into(),
        url: url.to_owned().into(),
        user_agent: agent.to_owned().into(),
        ..Default::default()
    }
}

fn encoded(m: &Measurement<'_>, columns: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    m.encode(&mut bytes);
    let mut rest = &bytes[..];
    Measurement::decode_prefix(&mut rest, columns).unwrap();
    let prefix = bytes.len() - rest.len();
    bytes.truncate(prefix);
    bytes
}

#[test]
fn a_row_held_to_the_rules_already_is_not_written_again() {
    let m = row(
        "https://shop.test/p/shoes?q=red",
        "Mozilla/5.0 Chrome/131.0.6778.135",
    );
    for columns in [COLUMNS.len(), layouts::columns_in(2).unwrap()] {
        let raw = encoded(&m, columns);
        assert_eq!(minimised(&sites(), m.clone(), &raw, columns), None);
    }
}

#[test]
fn a_leaky_row_is_written_again_minimised_in_its_tables_columns() {
    let m = row(
        "https://shop.test/u/jane@example.com?q=jane%40example.com&token=Ab3dE5f9Gh2JkL2mN0pQ7rS",
        "Mozilla/5.0 jane@example.com Chrome/131.0.6778.135",
    );
    for columns in [COLUMNS.len(), layouts::columns_in(2).unwrap()] {
        let raw = encoded(&m, columns);
        let bytes = minimised(&sites(), m.clone(), &raw, columns).expect("changed");
        let mut input = &bytes[..];
        let back = Measurement::decode_prefix(&mut input, columns).unwrap();
        assert!(input.is_empty(), "exactly the table's columns");
        assert_eq!(back.url, "https://shop.test/u/*?q=*");
        assert_eq!(back.user_agent, "Mozilla/5.0 * Chrome/131.0.6778.135");
        assert_eq!(back.id, m.id, "the key stays");
        assert_eq!(minimised(&sites(), back.clone(), &bytes, columns), None);
    }
}

#[test]
fn the_marks_table_is_one_statement_for_either_form() {
    assert!(MARKS_DDL.contains("{database}.minimised") && MARKS_DDL.contains("{engine}"));
    assert!(!MARKS_DDL.trim_end().ends_with(';'));
}

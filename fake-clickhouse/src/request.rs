//! What the servers of this crate read of a request.

/// The query parameters of `query` (a URI's query string), decoded, in order.
pub fn params(query: Option<&str>) -> Vec<(String, String)> {
    query
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .into_owned()
                .collect()
        })
        .unwrap_or_default()
}

/// The value of the first parameter `name`.
pub fn param(params: &[(String, String)], name: &str) -> Option<String> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

/// Whether the `query` parameter is an INSERT (the collector's INSERTs name the statement
/// there and send the rows as the body).
pub fn is_insert(params: &[(String, String)]) -> bool {
    param(params, "query")
        .is_some_and(|q| q.trim_start().to_ascii_uppercase().starts_with("INSERT"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_insert_is_told_by_its_query_parameter() {
        let p = params(Some(
            "database=d&query=%20insert%20INTO%20t%20FORMAT%20RowBinary&x=1",
        ));
        assert_eq!(param(&p, "database").as_deref(), Some("d"));
        assert!(is_insert(&p));
        assert!(!is_insert(&params(Some("query=SELECT%201"))));
        assert!(!is_insert(&params(None)));
    }
}

//! Forwarding a request to the real ClickHouse server behind a proxy of this crate.

use bytes::Bytes;
use hyper::http::request::Parts;

use crate::serve::{answer, Answer};

/// Headers of the connection and of the body's framing, which each hop sets itself.
fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "host" | "content-length" | "connection" | "transfer-encoding" | "keep-alive"
    )
}

/// The real server behind a proxy: its HTTP URL and a client (no gzip: bodies pass as they
/// are; each request bounded by 60 s).
#[derive(Debug, Clone)]
pub struct Upstream {
    base: String,
    client: reqwest::Client,
}

impl Upstream {
    /// The server at `url` (`http://host:port`, a trailing `/` ignored).
    pub fn new(url: &str) -> Upstream {
        Upstream {
            base: url.trim_end_matches('/').to_owned(),
            client: reqwest::Client::builder()
                .no_gzip()
                .timeout(std::time::Duration::from_secs(60))
                .build()
                .expect("a plain HTTP client"),
        }
    }

    /// Sends the request (`parts`' method, path and headers, the query `params`, `body`) and
    /// returns the server's answer: its status, its headers but the hop-by-hop ones, its body.
    /// Errors: the server could not be reached or its answer was cut (the text says which).
    pub async fn send(
        &self,
        parts: &Parts,
        params: &[(String, String)],
        body: Bytes,
    ) -> Result<Answer, String> {
        let mut url = format!("{}{}", self.base, parts.uri.path());
        if !params.is_empty() {
            let query: String = url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(params)
                .finish();
            url = format!("{url}?{query}");
        }
        let mut req = self.client.request(parts.method.clone(), url).body(body);
        for (name, value) in &parts.headers {
            if !hop_by_hop(name.as_str()) {
                req = req.header(name, value);
            }
        }
        let resp = req
            .send()
            .await
            .map_err(|e| format!("upstream {}: {e}", self.base))?;
        let status = resp.status().as_u16();
        let headers: Vec<(String, String)> = resp
            .headers()
            .iter()
            .filter(|(n, _)| !hop_by_hop(n.as_str()))
            .filter_map(|(n, v)| Some((n.to_string(), v.to_str().ok()?.to_owned())))
            .collect();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| format!("upstream body from {}: {e}", self.base))?;
        let headers: Vec<(&str, String)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        Ok(answer(status, &headers, bytes))
    }
}

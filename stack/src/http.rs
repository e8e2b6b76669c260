//! The health probes' HTTP: one blocking request with a timeout, the body on a 2xx answer.

use std::time::Duration;

/// Timeout of one probe (connect, send and read together).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// GET `url`: the body of a 2xx answer, trimmed; None on any failure or timeout.
pub fn get(url: &str) -> Option<String> {
    let answer = agent().get(url).call().ok()?;
    Some(answer.into_string().ok()?.trim().to_owned())
}

/// POST `body` to `url`: the body of a 2xx answer, trimmed; None on any failure or timeout.
pub fn post(url: &str, body: &str) -> Option<String> {
    let answer = agent().post(url).send_string(body).ok()?;
    Some(answer.into_string().ok()?.trim().to_owned())
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(PROBE_TIMEOUT).build()
}

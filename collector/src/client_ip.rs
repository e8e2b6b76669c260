//! The client's address, for per-client rate limiting only (it is never stored).
//!
//! Forwarding headers are believed only when the connecting peer is a trusted proxy
//! (`COLLECTOR_TRUSTED_PROXIES`). Then the chain of addresses from `Forwarded` (RFC 7239; its
//! `for=` parameters, all header lines in order) or, without it, `X-Forwarded-For` (the de
//! facto comma list) is walked from the right, past every trusted hop; the first address that
//! is not trusted is the client. A hop that cannot be parsed (`unknown`, an obfuscated
//! `_identifier`, garbage, empty) ends the walk: nothing left of it can be believed, so the
//! last address known good is used. Addresses are compared in canonical form (an
//! IPv4-mapped IPv6 address is its IPv4 address). A trusted peer that sends neither header
//! is logged (at most once a second): all its clients then count as one.

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;
use ipnet::IpNet;

/// Whether `ip` is in one of `trusted`.
fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|net| net.contains(&ip))
}

/// The client address of a request from `peer` with `headers`.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let peer = peer.to_canonical();
    if trusted.is_empty() || !is_trusted(peer, trusted) {
        return peer;
    }
    if !headers.contains_key("forwarded") && !headers.contains_key("x-forwarded-for") {
        // Every client of that proxy now shares its address (and its rate bucket): say why.
        crate::logging::warn_limited("trusted_proxy_without_forwarding", || {
            tracing::warn!(
                %peer,
                "a trusted proxy (COLLECTOR_TRUSTED_PROXIES) sent neither Forwarded nor \
                 X-Forwarded-For: its clients share its address for the per-client rate"
            )
        });
        return peer;
    }
    let chain: Vec<Option<IpAddr>> = if headers.contains_key("forwarded") {
        headers
            .get_all("forwarded")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(forwarded_for)
            .collect()
    } else {
        headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(parse_node)
            .collect()
    };
    let mut client = peer;
    for hop in chain.into_iter().rev() {
        match hop {
            Some(ip) => {
                client = ip;
                if !is_trusted(ip, trusted) {
                    break;
                }
            }
            None => break,
        }
    }
    client
}

/// The `for=` node of one `Forwarded` element (`for=192.0.2.60;proto=http;by=203.0.113.43`).
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        key.trim()
            .eq_ignore_ascii_case("for")
            .then(|| parse_node(value))?
    })
}

/// Parses a node: `192.0.2.1`, `192.0.2.1:8080`, `[2001:db8::1]`, `[2001:db8::1]:443`,
/// `2001:db8::1`, `::ffff:192.0.2.1`, each optionally in double quotes. `None` for anything
/// else.
pub fn parse_node(node: &str) -> Option<IpAddr> {
    let node = node.trim();
    let node = node
        .strip_prefix('"')
        .and_then(|n| n.strip_suffix('"'))
        .unwrap_or(node)
        .trim();
    if node.is_empty() {
        return None;
    }
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(sa) = node.parse::<SocketAddr>() {
        return Some(sa.ip().to_canonical());
    }
    let (inner, rest) = node.strip_prefix('[')?.split_once(']')?;
    let port_ok = rest.is_empty()
        || rest
            .strip_prefix(':')
            .is_some_and(|p| p.parse::<u16>().is_ok());
    port_ok.then(|| inner.parse::<IpAddr>().ok().map(|ip| ip.to_canonical()))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn nets(s: &[&str]) -> Vec<IpNet> {
        s.iter().map(|n| n.parse().unwrap()).collect()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn node_forms() {
        assert_eq!(parse_node("192.0.2.1"), Some(ip("192.0.2.1")));
        assert_eq!(parse_node(" 192.0.2.1:8080 "), Some(ip("192.0.2.1")));
        assert_eq!(parse_node("[2001:db8::1]:443"), Some(ip("2001:db8::1")));
        assert_eq!(parse_node("[2001:db8::1]"), Some(ip("2001:db8::1")));
        assert_eq!(parse_node("2001:db8::1"), Some(ip("2001:db8::1")));
        assert_eq!(parse_node("::ffff:192.0.2.1"), Some(ip("192.0.2.1")));
        assert_eq!(
            parse_node("\"[2001:db8:cafe::17]:4711\""),
            Some(ip("2001:db8:cafe::17"))
        );
        for garbage in [
            "unknown",
            "_hidden",
            "",
            "\"\"",
            "300.1.1.1",
            "[::1",
            "1.2.3.4:x",
            "[zz]:1",
        ] {
            assert_eq!(parse_node(garbage), None, "{garbage}");
        }
    }

    #[test]
    fn untrusted_peer_headers_are_ignored() {
        let h = headers(&[("x-forwarded-for", "203.0.113.9")]);
        assert_eq!(
            client_ip(ip("198.51.100.7"), &h, &nets(&["10.0.0.0/8"])),
            ip("198.51.100.7")
        );
        assert_eq!(
            client_ip(ip("10.0.0.1"), &h, &[]),
            ip("10.0.0.1"),
            "no trusted proxies: peer"
        );
    }

    #[test]
    fn walks_from_the_right_past_trusted_hops() {
        let trusted = nets(&["10.0.0.0/8", "127.0.0.1/32"]);
        // A client-supplied spoof on the left is not reached.
        let h = headers(&[("x-forwarded-for", "1.1.1.1, 203.0.113.9, 10.0.0.2")]);
        assert_eq!(client_ip(ip("127.0.0.1"), &h, &trusted), ip("203.0.113.9"));
        let h = headers(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "203.0.113.9"),
        ]);
        assert_eq!(
            client_ip(ip("10.0.0.3"), &h, &trusted),
            ip("203.0.113.9"),
            "several header lines"
        );
        let h = headers(&[("x-forwarded-for", "10.0.0.5, 10.0.0.2")]);
        assert_eq!(
            client_ip(ip("10.0.0.3"), &h, &trusted),
            ip("10.0.0.5"),
            "all trusted: leftmost"
        );
    }

    #[test]
    fn forwarded_header() {
        let trusted = nets(&["10.0.0.0/8"]);
        let h = headers(&[(
            "forwarded",
            "for=192.0.2.60;proto=http;by=203.0.113.43, For=\"[2001:db8:cafe::17]:4711\"",
        )]);
        assert_eq!(
            client_ip(ip("10.1.1.1"), &h, &trusted),
            ip("2001:db8:cafe::17")
        );
        let h = headers(&[
            ("forwarded", "for=192.0.2.60"),
            ("x-forwarded-for", "198.51.100.1"),
        ]);
        assert_eq!(
            client_ip(ip("10.1.1.1"), &h, &trusted),
            ip("192.0.2.60"),
            "Forwarded wins"
        );
    }

    #[test]
    fn garbage_ends_the_walk() {
        let trusted = nets(&["10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "203.0.113.9, unknown, 10.0.0.2")]);
        assert_eq!(client_ip(ip("10.0.0.3"), &h, &trusted), ip("10.0.0.2"));
        let h = headers(&[("forwarded", "for=unknown")]);
        assert_eq!(client_ip(ip("10.0.0.3"), &h, &trusted), ip("10.0.0.3"));
        let h = headers(&[("x-forwarded-for", "")]);
        assert_eq!(client_ip(ip("10.0.0.3"), &h, &trusted), ip("10.0.0.3"));
    }

    #[test]
    fn mapped_peer_is_canonical() {
        let trusted = nets(&["127.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "203.0.113.9")]);
        assert_eq!(
            client_ip(ip("::ffff:127.0.0.1"), &h, &trusted),
            ip("203.0.113.9")
        );
    }
}

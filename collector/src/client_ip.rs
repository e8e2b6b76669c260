//! The client's address, for the per-client rate and the country only (it is never stored).
//!
//! A forwarding header is believed only when the connecting peer is a trusted proxy
//! (`COLLECTOR_TRUSTED_PROXIES`), and only the one header `COLLECTOR_CLIENT_IP_HEADER` names
//! (contract v4): `X-Forwarded-For` (the de facto comma list, what HAProxy, Caddy and nginx
//! write) or `Forwarded` (RFC 7239; its `for=` parameters). The other is never read: proxies
//! pass a header they do not write through from the client unchanged, so reading it would let
//! a client choose its address. The chain of addresses (all header lines in order) is walked
//! from the right, past every trusted hop; the first address that is not trusted is the
//! client. A hop that cannot be parsed (`unknown`, an obfuscated
//! `_identifier`, garbage, empty) ends the walk: nothing left of it can be believed, so the
//! last address known good is used. Addresses are compared in canonical form (an
//! IPv4-mapped IPv6 address is its IPv4 address). A trusted peer that sends neither header
//! is logged (at most once a second): all its clients then count as one.

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;
use ipnet::IpNet;

pub use crate::config::ClientIpHeader;

/// The prefixes `client` counts under, each with its share: its subscriber's (an IPv4
/// address; an IPv6 /64, RFC 6177: a home, a site or a phone is given at least a /64) at 1 (of
/// a client's cap, [`crate::sampling::client_cap`]), and the wider blocks an operator or a
/// tunnel broker hands out (an IPv4 /24; an IPv6 /48 and /32) at 10 and 100 (of a block's,
/// [`crate::sampling::block_cap`]).
pub fn prefixes(client: IpAddr) -> [(u8, IpAddr, f32); 3] {
    let v6 = |ip: std::net::Ipv6Addr, bits: u32| {
        IpAddr::V6(std::net::Ipv6Addr::from(
            ip.to_bits() & !(u128::MAX >> bits),
        ))
    };
    match client {
        IpAddr::V4(ip) => {
            let block = IpAddr::V4(std::net::Ipv4Addr::from(ip.to_bits() & !0xff));
            // An IPv4 client has two levels; the third repeats the second.
            [(32, client, 1.0), (24, block, 10.0), (24, block, 10.0)]
        }
        IpAddr::V6(ip) => [
            (64, v6(ip, 64), 1.0),
            (48, v6(ip, 48), 10.0),
            (32, v6(ip, 32), 100.0),
        ],
    }
}

/// Whether `ip` is in one of `trusted`.
fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|net| net.contains(&ip))
}

/// The client address of a request from `peer` with `headers`, believing only `header` and
/// only from a trusted peer.
pub fn client_ip(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[IpNet],
    header: ClientIpHeader,
) -> IpAddr {
    client_ip_for(peer, headers, trusted, &[], header)
}

/// The client address of a site's measurement (contract v5 §1): as [`client_ip`], walking the
/// header from the right, a hop believed when it is in `global` (`COLLECTOR_TRUSTED_PROXIES`,
/// the operator's edge) or in `site` (the shop's own proxies, `--trusted-proxy`), so that a
/// chain of both (the edge, then the shop's proxy) names the visitor, and a shop's proxy names
/// nobody for another shop.
pub fn client_ip_for(
    peer: IpAddr,
    headers: &HeaderMap,
    global: &[IpNet],
    site: &[IpNet],
    header: ClientIpHeader,
) -> IpAddr {
    let trusted = |ip: IpAddr| is_trusted(ip, global) || is_trusted(ip, site);
    let peer = peer.to_canonical();
    if !trusted(peer) {
        return peer;
    }
    if !headers.contains_key(header.name()) {
        // Every client of that proxy now shares its address (and its rate bucket): say why.
        crate::logging::warn_limited("trusted_proxy_without_forwarding", || {
            tracing::warn!(
                header = header.name(),
                "a trusted proxy (COLLECTOR_TRUSTED_PROXIES) sent no COLLECTOR_CLIENT_IP_HEADER: \
                 its clients share its address for the per-client rate and have no country"
            )
        });
        return peer;
    }
    let lines = headers
        .get_all(header.name())
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    let chain: Vec<Option<IpAddr>> = match header {
        ClientIpHeader::Forwarded => lines.map(forwarded_for).collect(),
        ClientIpHeader::XForwardedFor => lines.map(parse_node).collect(),
    };
    let mut client = peer;
    for hop in chain.into_iter().rev() {
        match hop {
            Some(ip) => {
                client = ip;
                if !trusted(ip) {
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

    const XFF: ClientIpHeader = ClientIpHeader::XForwardedFor;
    const FWD: ClientIpHeader = ClientIpHeader::Forwarded;
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

    /// Contract v5 §1: the operator's edge (global) then a shop's proxy (its site's list):
    /// for that shop the chain names the visitor; for another shop the shop's proxy is the
    /// client, whatever it says; and a shop's proxy alone, in front of nothing the operator
    /// trusts, is believed for its own shop only.
    #[test]
    fn a_shops_proxy_is_believed_for_its_own_site_only() {
        let (edge, shop) = (nets(&["127.0.0.1/32"]), nets(&["198.51.100.0/24"]));
        let chain = headers(&[("x-forwarded-for", "192.0.2.9, 198.51.100.5")]);
        let peer = ip("127.0.0.1");
        assert_eq!(
            client_ip_for(peer, &chain, &edge, &shop, XFF),
            ip("192.0.2.9")
        );
        assert_eq!(
            client_ip_for(peer, &chain, &edge, &[], XFF),
            ip("198.51.100.5")
        );
        assert_eq!(client_ip(peer, &chain, &edge, XFF), ip("198.51.100.5"));
        let direct = headers(&[("x-forwarded-for", "192.0.2.9")]);
        let proxy = ip("198.51.100.5");
        assert_eq!(
            client_ip_for(proxy, &direct, &[], &shop, XFF),
            ip("192.0.2.9")
        );
        assert_eq!(client_ip_for(proxy, &direct, &[], &[], XFF), proxy);
        assert_eq!(client_ip_for(proxy, &direct, &edge, &[], XFF), proxy);
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
            client_ip(ip("198.51.100.7"), &h, &nets(&["10.0.0.0/8"]), XFF),
            ip("198.51.100.7")
        );
        assert_eq!(
            client_ip(ip("10.0.0.1"), &h, &[], XFF),
            ip("10.0.0.1"),
            "no trusted proxies: peer"
        );
    }

    #[test]
    fn walks_from_the_right_past_trusted_hops() {
        let trusted = nets(&["10.0.0.0/8", "127.0.0.1/32"]);
        // A client-supplied spoof on the left is not reached.
        let h = headers(&[("x-forwarded-for", "1.1.1.1, 203.0.113.9, 10.0.0.2")]);
        assert_eq!(
            client_ip(ip("127.0.0.1"), &h, &trusted, XFF),
            ip("203.0.113.9")
        );
        let h = headers(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "203.0.113.9"),
        ]);
        assert_eq!(
            client_ip(ip("10.0.0.3"), &h, &trusted, XFF),
            ip("203.0.113.9"),
            "several header lines"
        );
        let h = headers(&[("x-forwarded-for", "10.0.0.5, 10.0.0.2")]);
        assert_eq!(
            client_ip(ip("10.0.0.3"), &h, &trusted, XFF),
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
            client_ip(ip("10.1.1.1"), &h, &trusted, FWD),
            ip("2001:db8:cafe::17")
        );
        let h = headers(&[
            ("forwarded", "for=192.0.2.60"),
            ("x-forwarded-for", "198.51.100.1"),
        ]);
        assert_eq!(
            client_ip(ip("10.1.1.1"), &h, &trusted, XFF),
            ip("198.51.100.1"),
            "only the named header is read: a Forwarded the proxy passed through is not"
        );
        assert_eq!(
            client_ip(ip("10.1.1.1"), &h, &trusted, FWD),
            ip("192.0.2.60"),
            "and the other way round"
        );
    }

    #[test]
    fn garbage_ends_the_walk() {
        let trusted = nets(&["10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "203.0.113.9, unknown, 10.0.0.2")]);
        assert_eq!(client_ip(ip("10.0.0.3"), &h, &trusted, XFF), ip("10.0.0.2"));
        let h = headers(&[("forwarded", "for=unknown")]);
        assert_eq!(client_ip(ip("10.0.0.3"), &h, &trusted, FWD), ip("10.0.0.3"));
        let h = headers(&[("x-forwarded-for", "")]);
        assert_eq!(client_ip(ip("10.0.0.3"), &h, &trusted, XFF), ip("10.0.0.3"));
    }

    #[test]
    fn mapped_peer_is_canonical() {
        let trusted = nets(&["127.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "203.0.113.9")]);
        assert_eq!(
            client_ip(ip("::ffff:127.0.0.1"), &h, &trusted, XFF),
            ip("203.0.113.9")
        );
    }
}

//! The site settings' unit tests.

use super::*;

#[test]
fn origins() {
    let site = Site {
        allowed_origins: vec!["https://shop.example".into()],
        ..Site::new("s")
    };
    assert!(site.allows_origin(None));
    assert!(site.allows_origin(Some("https://shop.example")));
    assert!(!site.allows_origin(Some("https://evil.example")));
    assert!(!site.allows_origin(Some("null")));
    assert!(site.allows_page("https://shop.example/p/1?x"));
    assert!(
        site.allows_page("https://SHOP.example:8443/"),
        "the host alone counts"
    );
    assert!(!site.allows_page("https://evil.example/free-giftcard"));
    assert!(!site.allows_page("https://shop.example.evil.example/"));
    assert!(!site.allows_page("https://evil.example/?https://shop.example"));
    // Issue 39: the default port written out is the same origin; another port is not.
    assert!(site.allows_origin(Some("https://shop.example:443")));
    assert!(site.allows_origin(Some("HTTPS://Shop.Example")));
    assert!(!site.allows_origin(Some("https://shop.example:8443")));
    assert!(!site.allows_origin(Some("http://shop.example")));
    assert!(!site.allows_origin(Some("https://shop.example.evil.example")));
    let hand_written = Site {
        allowed_origins: vec!["HTTP://Shop.Example:80/".into()],
        ..site.clone()
    };
    assert!(hand_written.allows_origin(Some("http://shop.example")));
    assert!(!hand_written.allows_origin(Some("https://shop.example")));
    let open = Site {
        allowed_origins: vec![],
        ..site
    };
    assert!(open.allows_origin(Some("https://anything.example")));
    assert!(
        open.allows_page("https://anything.example/"),
        "no origins: any page"
    );
}

#[test]
fn origin_normalisation() {
    assert_eq!(
        normalise_origin("HTTPS://Shop.Example:443").unwrap(),
        "https://shop.example"
    );
    assert_eq!(
        normalise_origin("https://shop.example/").unwrap(),
        "https://shop.example"
    );
    assert_eq!(normalise_origin("https://shop.example/path"), None);
    assert_eq!(normalise_origin("https://shop.example/?q"), None);
    assert_eq!(normalise_origin("https://user@shop.example"), None);
    assert_eq!(
        normalise_origin("http://localhost:8080").unwrap(),
        "http://localhost:8080"
    );
    assert_eq!(normalise_origin("ftp://x"), None);
    assert_eq!(normalise_origin("shop.example"), None);
}

#[test]
fn placement_is_clickhouses_city_hash_64_mod_n() {
    // `SELECT cityHash64(k)` on ClickHouse 18.16 and 26.9 (the same answers on both).
    let server = [
        ("shop", 15408619487905491346u64),
        ("demo", 3896638502514342264),
        ("bench-01", 740066648267614537),
        ("", 11160318154034397263),
        (
            "a-very-long-site-key-with-more-than-sixty-four-bytes.example.com-0123456789",
            7955018348748316481,
        ),
    ];
    for (key, hash) in server {
        assert_eq!(ch_cityhash102::cityhash64(key.as_bytes()), hash, "{key:?}");
        let names = ["a", "b", "c"];
        assert_eq!(place(key, &names), names[(hash % 3) as usize], "{key:?}");
    }
}

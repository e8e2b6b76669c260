//! The configuration's unit tests: variables and flags read, checked and refused.

use super::*;
use crate::cli::Cli;
use clap::Parser;

fn raw(args: &[&str]) -> RawArgs {
    let mut v = vec!["collector"];
    v.extend_from_slice(args);
    Cli::try_parse_from(v).unwrap().args
}

#[test]
fn defaults_are_valid() {
    let s = Config::from_args(&raw(&[])).unwrap();
    assert_eq!(s.server.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(s.settings.backoff, Duration::from_secs(10));
    assert_eq!(s.clickhouse.shards.len(), 1);
    assert_eq!(s.clickhouse.shards[0].name, DEFAULT_SHARD);
    assert_eq!(s.clickhouse.urls().count(), 1);
    assert_eq!(s.clickhouse.cluster, "collector");
    assert!(s.intake.trusted_proxies.is_empty());
    assert_eq!(
        s.intake.client_rate, 0,
        "per-client rate off by default (contract v2 §1)"
    );
    assert_eq!(s.intake.site_rate, 2000, "site rates stay on");
}

#[test]
fn the_single_form_takes_one_server() {
    let two = Config::from_args(&raw(&[
        "--clickhouse-table-form",
        "single",
        "--clickhouse-urls",
        "http://a:8123,http://b:8123",
    ]))
    .unwrap_err()
    .to_string();
    assert!(
        two.contains("COLLECTOR_CLICKHOUSE_TABLE_FORM=\"single\""),
        "{two}"
    );
    assert!(two.contains("lists 2"), "{two}");
    let one = Config::from_args(&raw(&[
        "--clickhouse-table-form",
        "single",
        "--clickhouse-urls",
        "http://a:8123",
    ]))
    .unwrap();
    assert_eq!(one.clickhouse.table_form, TableForm::Single);
    assert!(Config::from_args(&raw(&["--clickhouse-table-form", "Single"])).is_err());
}

#[test]
fn every_bad_value_is_reported_at_once() {
    let err = Config::from_args(&raw(&[
        "--listen",
        "nowhere",
        "--settings-ttl",
        "soon",
        "--clickhouse-urls",
        "ftp://x",
        "--trusted-proxies",
        "10.0.0.0/8,banana",
    ]))
    .unwrap_err();
    let line = err.to_string();
    assert_eq!(err.0.len(), 4, "{line}");
    for name in [
        "LISTEN",
        "SETTINGS_TTL",
        "CLICKHOUSE_URLS",
        "TRUSTED_PROXIES",
    ] {
        assert!(line.contains(&format!("COLLECTOR_{name}=")), "{line}");
    }
    // Given as a flag or in the environment: the error names both.
    assert!(
        line.contains(r#"COLLECTOR_LISTEN="nowhere" (--listen): "#),
        "{line}"
    );
    assert!(
        line.contains(r#"COLLECTOR_TRUSTED_PROXIES="10.0.0.0/8,banana" (--trusted-proxies): "#),
        "{line}"
    );
    // A duration's fault is named by the text, not by a byte offset.
    assert!(
        line.contains(
            r#"(--settings-ttl): not a duration like 10s or 250ms: a number was expected at "soon""#
        ),
        "{line}"
    );
    assert!(!line.contains('\n'));
}

#[test]
fn zero_timeouts_and_empty_places_are_refused() {
    let err = Config::from_args(&raw(&[
        "--header-timeout",
        "0s",
        "--body-timeout",
        "0ms",
        "--settings-ttl",
        "0s",
        "--database-url",
        "",
        "--spool-dir",
        " ",
        "--spool-max-bytes",
        "1",
    ]))
    .unwrap_err();
    let mut names: Vec<&str> = err.0.iter().map(|e| e.split('=').next().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "COLLECTOR_BODY_TIMEOUT",
            "COLLECTOR_DATABASE_URL",
            "COLLECTOR_HEADER_TIMEOUT",
            "COLLECTOR_SETTINGS_TTL",
            "COLLECTOR_SPOOL_DIR",
            "COLLECTOR_SPOOL_MAX_BYTES",
        ],
        "{err:?}"
    );
}

/// A spool bound that is not a number is reported once (not also as "below 1 MiB"); a number
/// below 1 MiB once, as such.
#[test]
fn a_bad_spool_bound_is_reported_once() {
    for (value, says) in [("1GB", "whole number"), ("1000", "at least 1048576")] {
        let err = Config::from_args(&raw(&["--spool-max-bytes", value])).unwrap_err();
        let about: Vec<&String> = err
            .0
            .iter()
            .filter(|e| e.starts_with("COLLECTOR_SPOOL_MAX_BYTES"))
            .collect();
        assert_eq!(about.len(), 1, "{value}: {err:?}");
        assert!(about[0].contains(says), "{value}: {err:?}");
    }
}

#[test]
fn credentials_in_replica_urls_are_refused_and_not_echoed() {
    let err = Config::from_args(&raw(&[
        "--clickhouse-urls",
        "http://default:secret@ch1:8123",
    ]))
    .unwrap_err();
    assert_eq!(err.0.len(), 1);
    assert!(err.0[0].contains("credentials"), "{err:?}");
    assert!(!err.0[0].contains("secret"), "{err:?}");
}

/// Issue 52, 5: a placeholder password from deploy/env.example, in a file or in the
/// database URL, stops the start (exit 2) without being shown; `verify-full` with a
/// `hostaddr` and no host name is refused, as libpq refuses it.
#[test]
fn placeholder_passwords_and_unverifiable_tls_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pw");
    std::fs::write(&file, "Change-Me-clickhouse-collector\n").unwrap();
    let err = Config::from_args(&raw(&[
        "--clickhouse-password-file",
        file.to_str().unwrap(),
        "--database-url",
        "postgres://collector:change-me-collector@db:5432/collector",
    ]))
    .unwrap_err();
    assert_eq!(err.0.len(), 2, "{err}");
    assert!(err.0.iter().all(|e| e.contains("placeholder")), "{err}");
    assert!(
        !err.to_string().to_lowercase().contains("me-collector"),
        "{err}"
    );
    for url in [
        "hostaddr=192.0.2.10 port=5432 user=c dbname=c sslmode=verify-full",
        "postgres://c@/c?hostaddr=192.0.2.10&sslmode=verify-full",
    ] {
        let err = Config::from_args(&raw(&["--database-url", url])).unwrap_err();
        assert!(err.0[0].contains("verify-full"), "{url}: {err}");
    }
    for fine in [
        "host=db.example hostaddr=192.0.2.10 user=c dbname=c sslmode=verify-full",
        "hostaddr=192.0.2.10 user=c dbname=c sslmode=require",
        "postgres://c:a-real-password@db:5432/c",
    ] {
        assert!(
            Config::from_args(&raw(&["--database-url", fine])).is_ok(),
            "{fine}"
        );
    }
}

#[test]
fn replica_list_keeps_preference_order() {
    let s =
        Config::from_args(&raw(&["--clickhouse-urls", "http://b:8123, http://a:8123"])).unwrap();
    let hosts: Vec<_> = s.clickhouse.urls().map(|u| u.host_str().unwrap()).collect();
    assert_eq!(hosts, ["b", "a"]);
}

#[test]
fn durations_and_names_are_bounded_and_resolved() {
    let err = Config::from_args(&raw(&[
        "--dedup-window",
        "2000years",
        "--drain-grace",
        "8d",
    ]))
    .unwrap_err();
    assert_eq!(err.0.len(), 2, "{err}");
    let err = Config::from_args(&raw(&["--batch-max-age", "abc"])).unwrap_err();
    assert_eq!(err.0.len(), 1, "one error per bad value: {err}");
    let s = Config::from_args(&raw(&["--listen", "localhost:8080"])).unwrap();
    assert!(s.server.listen.ip().is_loopback());
}

#[test]
fn passwords_come_from_files_and_never_show() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pw");
    std::fs::write(&file, "s3cret-Pa55\n").unwrap();
    let path = file.to_str().unwrap();
    let c = Config::from_args(&raw(&[
        "--clickhouse-password-file",
        path,
        "--database-password-file",
        path,
        "--clickhouse-user",
        "writer",
    ]))
    .unwrap();
    let password = c.clickhouse.password.as_ref().unwrap();
    assert_eq!(
        password.expose(),
        "s3cret-Pa55",
        "the line, without its newline"
    );
    assert_eq!(
        c.settings.password.as_ref().unwrap().expose(),
        "s3cret-Pa55"
    );
    assert_eq!(c.clickhouse.user, "writer");
    let shown = format!("{c:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    let missing = dir.path().join("none");
    let err = Config::from_args(&raw(&[
        "--clickhouse-password-file",
        missing.to_str().unwrap(),
    ]))
    .unwrap_err();
    assert!(
        err.0[0].starts_with("COLLECTOR_CLICKHOUSE_PASSWORD_FILE="),
        "{err}"
    );
}

#[test]
fn https_replicas_get_tls_and_a_ca_file_must_read() {
    let c = Config::from_args(&raw(&["--clickhouse-urls", "http://a:8123"])).unwrap();
    assert!(c.clickhouse.tls.is_none(), "plain http needs no TLS");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("ca.pem");
    std::fs::write(&bad, "not a certificate").unwrap();
    let err = Config::from_args(&raw(&[
        "--clickhouse-urls",
        "https://a:8443",
        "--clickhouse-ca-file",
        bad.to_str().unwrap(),
    ]))
    .unwrap_err();
    assert!(
        err.0[0].starts_with("COLLECTOR_CLICKHOUSE_CA_FILE="),
        "{err}"
    );
    let err = Config::from_args(&raw(&[
        "--database-url",
        "postgres://h/db?sslmode=sometimes",
    ]))
    .unwrap_err();
    assert!(err.0[0].contains("sslmode"), "{err}");
    let ok = Config::from_args(&raw(&[
        "--database-url",
        "postgres://h/db?sslmode=verify-full",
    ]));
    assert!(ok.is_ok(), "verify-full is a mode: {:?}", ok.err());
}

#[test]
fn identifiers() {
    assert!(is_identifier("collector"));
    assert!(is_identifier("test_1"));
    assert!(!is_identifier("1x"));
    assert!(!is_identifier("a;drop"));
    assert!(!is_identifier(""));
}

#[test]
fn shards_are_read_in_order_with_their_replicas_in_preference_order() {
    let c = Config::from_args(&raw(&[
        "--clickhouse-shards",
        "b=http://r3:8123,http://r4:8123; a=http://r1:8123",
    ]))
    .unwrap()
    .clickhouse;
    let names: Vec<_> = c.shards.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["b", "a"]);
    let hosts: Vec<_> = c.shards[0]
        .urls
        .iter()
        .map(|u| u.host_str().unwrap())
        .collect();
    assert_eq!(hosts, ["r3", "r4"]);
    assert_eq!(c.shard("a").unwrap().urls.len(), 1);
    assert!(c.shard("default").is_none());
}

#[test]
fn bad_shard_lists_are_one_line_errors_naming_the_setting() {
    let cases = [
        ("a=http://r1:8123;a=http://r2:8123", "named twice"),
        ("a=http://r1:8123;b=", "no replica URL"),
        (
            "a=http://r1:8123;b=http://r1:8123",
            "both shard a and shard b",
        ),
        ("A=http://r1:8123", "shard name"),
        ("http://r1:8123", "NAME=URL"),
        (";", "at least one shard"),
        ("a=http://u:secret@r1:8123", "credentials"),
    ];
    for (value, reason) in cases {
        let err = Config::from_args(&raw(&["--clickhouse-shards", value])).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("COLLECTOR_CLICKHOUSE_SHARDS"),
            "{value}: {text}"
        );
        assert!(text.contains(reason), "{value}: {text}");
        assert!(
            !text.contains("secret") && !text.contains('\n'),
            "{value}: {text}"
        );
    }
}

#[test]
fn the_spool_bound_holds_a_mebibyte_per_shard() {
    let shards = ["--clickhouse-shards", "a=http://r1:8123;b=http://r2:8123"];
    let bound = |bytes: &str| {
        let mut args = shards.to_vec();
        args.extend(["--spool-max-bytes", bytes]);
        Config::from_args(&raw(&args)).map(|c| c.spool.max_bytes)
    };
    assert_eq!(bound("2097152").unwrap(), 2 << 20);
    let err = bound("1048576").unwrap_err().to_string();
    assert!(err.contains("per shard"), "{err}");
}

#[test]
fn shards_and_urls_together_are_refused_naming_both() {
    let err = Config::from_args(&raw(&[
        "--clickhouse-shards",
        "a=http://r1:8123",
        "--clickhouse-urls",
        "http://r1:8123",
    ]))
    .unwrap_err()
    .to_string();
    assert!(err.contains("COLLECTOR_CLICKHOUSE_SHARDS"), "{err}");
    assert!(err.contains("COLLECTOR_CLICKHOUSE_URLS"), "{err}");
}

#[test]
fn a_malformed_url_with_a_password_is_not_echoed() {
    let err = Config::from_args(&raw(&["--clickhouse-urls", "http://u:secret@[bad:8123"]))
        .unwrap_err()
        .to_string();
    assert!(!err.contains("secret"), "{err}");
}

/// ClickHouse reads `?user=...&password=...` from a URL: refused as userinfo is, and a
/// malformed URL with a query is not echoed either.
#[test]
fn a_password_in_a_urls_query_is_refused_and_not_echoed() {
    for (flag, value) in [
        (
            "--clickhouse-urls",
            "http://ch1:8123/?user=u&password=secret",
        ),
        ("--clickhouse-urls", "http://ch1:99999/?password=secret"),
        ("--clickhouse-shards", "a=http://ch1:99999/?password=secret"),
        ("--clickhouse-shards", "a=http://ch1:8123?password=secret"),
    ] {
        let err = Config::from_args(&raw(&[flag, value]))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("secret"), "{err}");
    }
    let err = Config::from_args(&raw(&["--clickhouse-urls", "http://ch1:8123/?password=x"]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("a query is not supported"), "{err}");
}

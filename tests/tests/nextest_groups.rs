//! `.config/nextest.toml` keeps apart the tests that share a stack they break (nextest runs
//! each test in a process of its own, so the in-process turns cannot): every test that uses the
//! failover stack (`Stack::failover()`, `FAILOVER_TURN`) is in the test group `failover-stack`,
//! every one that uses the shard stack (`Stack::sharded()`) in `shard-stack`. A test added
//! without its group would break the others; this test names it.

use collector_tests::common;

use std::collections::BTreeSet;

/// Where `needles` appear in `text` (a file of tests/tests/ or of a module's folder there): the test functions whose own body
/// holds one, and whether anything else (a helper, an `impl`) holds one too.
fn holders(text: &str, needles: &[&str]) -> (BTreeSet<String>, bool) {
    let mut tests = BTreeSet::new();
    let mut elsewhere = false;
    let mut test_attr = false;
    // The top-level item the line is in: its name when it is a test function.
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line.starts_with("#[") {
            test_attr |= line.starts_with("#[tokio::test") || line.starts_with("#[test]");
            continue;
        }
        let top_level = !(line.is_empty()
            || line.starts_with(' ')
            || line.starts_with("//")
            || line.starts_with('}')
            || line.starts_with(')'));
        if top_level {
            current = match line.split_once("fn ") {
                Some((_, rest)) if test_attr => {
                    Some(rest.split(['(', '<']).next().unwrap_or("").to_string())
                }
                _ => None,
            };
            test_attr = false;
        }
        if line.trim_start().starts_with("//") || !needles.iter().any(|n| line.contains(n)) {
            continue;
        }
        match &current {
            Some(name) => {
                tests.insert(name.clone());
            }
            None => elsewhere = true,
        }
    }
    (tests, elsewhere)
}

/// The filter of the override of `.config/nextest.toml` that puts tests in `group`.
fn group_filter(config: &str, group: &str) -> String {
    config
        .split("[[profile.default.overrides]]")
        .find(|block| block.contains(&format!("test-group = \"{group}\"")))
        .unwrap_or_else(|| panic!(".config/nextest.toml has no override for group {group}"))
        .to_string()
}

/// The files of the test modules under `dir` (tests/tests/, or a module's folder), each with
/// its module path (`shards`, `shards::sites`: a folder's `mod.rs` is the folder's module) and
/// the top-level module it is in (`shards`).
fn module_files(
    dir: &std::path::Path,
    parent: Option<(&str, &str)>,
) -> Vec<(String, String, std::path::PathBuf)> {
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let (module, top) = match parent {
            Some((p, top)) if stem == "mod" => (p.to_owned(), top.to_owned()),
            Some((p, top)) => (format!("{p}::{stem}"), top.to_owned()),
            None => (stem.to_owned(), stem.to_owned()),
        };
        // Not modules of the integration binary: itself, this check, and the binary of its own
        // (`containers_engine`, a file or a folder).
        if parent.is_none()
            && ["integration", "nextest_groups", "containers_engine"].contains(&stem)
        {
            continue;
        }
        if path.is_dir() {
            files.extend(module_files(&path, Some((&module, &top))));
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        files.push((module, top, path));
    }
    files
}

fn check(group: &str, needles: &[&str]) {
    let root = common::root();
    let config = std::fs::read_to_string(root.join(".config/nextest.toml")).unwrap();
    let filter = group_filter(&config, group);
    let mut missing = vec![];
    let mut users = 0;
    for (module, top, path) in module_files(&root.join("tests/tests"), None) {
        let text = std::fs::read_to_string(&path).unwrap();
        let (tests, elsewhere) = holders(&text, needles);
        let whole_file = filter.contains(&format!("test(/^{top}::/)"))
            || filter.contains(&format!("test(/^{module}::/)"));
        if elsewhere && !whole_file {
            missing.push(format!(
                "{module}: a helper uses the stack, so every test of the file: test(/^{module}::/)"
            ));
        }
        for t in &tests {
            users += 1;
            if !whole_file && !filter.contains(&format!("test(={module}::{t})")) {
                missing.push(format!("test(={module}::{t})"));
            }
        }
        users += usize::from(elsewhere);
    }
    assert!(
        users > 0,
        "no test uses {needles:?}: is the check still right?"
    );
    assert!(
        missing.is_empty(),
        "these use {needles:?} but are not in the nextest test group {group} \
         (.config/nextest.toml); under nextest they would run beside its other tests:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_test_of_the_failover_stack_is_in_its_nextest_group() {
    check("failover-stack", &["Stack::failover()", "FAILOVER_TURN"]);
}

#[test]
fn every_test_of_the_shard_stack_is_in_its_nextest_group() {
    check("shard-stack", &["Stack::sharded()"]);
}

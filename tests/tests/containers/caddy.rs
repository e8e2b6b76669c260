//! The Caddyfile: valid, formatted, balancing `/perf/` over the collectors, run as a user.

use super::*;

#[test]
fn caddyfile_validates() {
    let dir = tempfile::tempdir().unwrap();
    // Caddy wants somewhere to keep its state: not the caller's home.
    run_ok(
        Command::new("caddy")
            .args(["validate", "--adapter", "caddyfile", "--config"])
            .arg(root().join("deploy/caddy/Caddyfile"))
            .env("XDG_DATA_HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path())
            .env("HOME", dir.path()),
    );
}

#[test]
fn caddyfile_is_formatted() {
    let path = root().join("deploy/caddy/Caddyfile");
    let formatted = run_ok(Command::new("caddy").arg("fmt").arg(&path));
    let text = std::fs::read_to_string(&path).unwrap();
    if formatted != text {
        let first = text
            .lines()
            .zip(formatted.lines())
            .position(|(a, b)| a != b)
            .map_or(text.lines().count().min(formatted.lines().count()), |i| i);
        panic!(
            "deploy/caddy/Caddyfile is not as `caddy fmt` writes it: from line {}:\n  file: {:?}\n  fmt:  {:?}",
            first + 1,
            text.lines().nth(first),
            formatted.lines().nth(first)
        );
    }
}

#[test]
fn caddy_balances_perf_over_the_collectors_with_health_checks_demo_root_mounted() {
    let mut problems = vec![];
    let raw = std::fs::read_to_string(root().join("deploy/caddy/Caddyfile")).unwrap();
    let body: String = raw
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let block = regex::Regex::new(
        r"(?s)handle\s+@collector\s*\{\s*uri\s+strip_prefix\s+/perf\s.*?reverse_proxy\s+([^{\n]+)\{(.*?)\}",
    )
    .unwrap();
    let m = block
        .captures(&body)
        .expect("no `handle @collector` that strips /perf with a reverse_proxy block");
    let matcher = regex::Regex::new(r"@collector\s+path_regexp\s+(\S+)")
        .unwrap()
        .captures(&body);
    if !matcher.is_some_and(|m| !m[1].contains("metrics") && m[1].contains("script")) {
        problems.push("the @collector matcher does not name only the public paths".into());
    }
    if !regex::Regex::new(r"(?s)handle\s+/perf/\*\s*\{\s*respond\s+\S.*?404")
        .unwrap()
        .is_match(&body)
    {
        problems.push("the rest of /perf/* is not answered 404".into());
    }
    let upstreams = sorted(m[1].split_whitespace().map(str::to_owned).collect());
    let want: Vec<String> = c().collectors.iter().map(|n| format!("{n}:8080")).collect();
    if upstreams != want {
        problems.push(format!(
            "upstreams {upstreams:?} are not the collectors {want:?}"
        ));
    }
    if !regex::Regex::new(r"(?m)^\s*health_uri\s+/readyz\s*$")
        .unwrap()
        .is_match(&m[2])
    {
        problems.push("no active health check `health_uri /readyz`".into());
    }
    let targets = c().get("caddy").expect("no caddy service").binds();
    if targets.get("/etc/caddy/Caddyfile").map(String::as_str) != Some("deploy/caddy/Caddyfile") {
        problems.push("caddy does not mount deploy/caddy/Caddyfile at /etc/caddy/Caddyfile".into());
    }
    let root_dir = regex::Regex::new(r"root\s+\*\s+(\S+)")
        .unwrap()
        .captures(&body);
    if root_dir.is_none_or(|r| targets.get(&r[1]).map(String::as_str) != Some("deploy/demo")) {
        problems.push("the file_server root is not deploy/demo mounted into caddy".into());
    }
    assert_no_problems(problems);
}

/// The uid and gid of a compose `user: UID:GID`, when both are numbers.
fn uid_gid(user: &str) -> Option<(u32, u32)> {
    let (u, g) = user.split_once(':')?;
    Some((u.parse().ok()?, g.parse().ok()?))
}

/// Issue 52, 5: Caddy runs as a user that is not root, with no capability (a port above
/// 1024: the Caddyfile's site and the port compose publishes to), a read-only root and
/// no-new-privileges; its volumes are handed to that user first by `caddy-volumes` (chown,
/// no network, CHOWN and DAC_READ_SEARCH only), which it waits for.
#[test]
fn caddy_runs_as_a_user_not_root_on_a_port_above_1024_without_capabilities() {
    let mut problems = vec![];
    let caddy = c().service("caddy");
    let user = caddy.str("user").unwrap_or("");
    let ids = uid_gid(user);
    if ids.is_none_or(|(u, g)| u == 0 || g == 0) {
        problems.push(format!("caddy: user {user:?}, want UID:GID, not root"));
    }
    if caddy.list("cap_drop") != ["ALL"] || !caddy.list("cap_add").is_empty() {
        problems.push(format!(
            "caddy: cap_drop {:?} cap_add {:?}, want ALL and none",
            caddy.list("cap_drop"),
            caddy.list("cap_add")
        ));
    }
    if !caddy
        .list("security_opt")
        .contains(&"no-new-privileges:true".to_owned())
    {
        problems.push("caddy: no no-new-privileges:true".into());
    }
    if caddy.get("read_only").and_then(serde_yaml::Value::as_bool) != Some(true) {
        problems.push("caddy: its root is not read-only".into());
    }
    let raw = std::fs::read_to_string(root().join("deploy/caddy/Caddyfile")).unwrap();
    let sites: Vec<u16> = raw
        .lines()
        .filter_map(|l| l.strip_prefix(':')?.strip_suffix(" {")?.parse().ok())
        .collect();
    let targets: Vec<u64> = caddy
        .get("ports")
        .and_then(serde_yaml::Value::as_sequence)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("target").and_then(serde_yaml::Value::as_u64))
        .collect();
    if sites.is_empty() || sites.iter().any(|p| *p <= 1024) {
        problems.push(format!(
            "the Caddyfile's sites listen on {sites:?}: want ports above 1024"
        ));
    }
    if targets.is_empty()
        || targets
            .iter()
            .any(|t| !sites.iter().any(|s| u64::from(*s) == *t))
    {
        problems.push(format!(
            "caddy publishes to {targets:?}, not to its sites' {sites:?}"
        ));
    }
    problems.extend(caddy_volumes_problems(caddy, user));
    assert_no_problems(problems);
}

/// `caddy-volumes` hands Caddy's named volumes to `user` and Caddy waits for it.
fn caddy_volumes_problems(caddy: Service, user: &str) -> Vec<String> {
    let mut problems = vec![];
    let Some(init) = c().get("caddy-volumes") else {
        return vec!["no service caddy-volumes".into()];
    };
    if caddy.depends_condition("caddy-volumes") != Some("service_completed_successfully") {
        problems.push("caddy: does not wait for caddy-volumes to complete successfully".into());
    }
    let named = |s: Service| -> BTreeMap<String, String> {
        s.mounts()
            .into_iter()
            .filter(|m| m.kind == "volume")
            .map(|m| (m.source, m.target))
            .collect()
    };
    let (volumes, chowned) = (named(caddy), named(init));
    let entry = init.list("entrypoint");
    let targets: BTreeSet<&String> = volumes.values().collect();
    let paths: BTreeSet<&String> = entry.iter().skip(3).collect();
    if volumes.is_empty()
        || volumes != chowned
        || entry.get(..3) != Some(&["chown".to_owned(), "-R".to_owned(), user.to_owned()][..])
        || paths != targets
    {
        problems.push(format!(
            "caddy-volumes: {entry:?} on {chowned:?}, want chown -R {user} of caddy's {volumes:?}"
        ));
    }
    let caps = init.list("cap_add");
    if init.str("network_mode") != Some("none")
        || init.list("cap_drop") != ["ALL"]
        || caps != ["CHOWN", "DAC_READ_SEARCH"]
    {
        problems.push(format!(
            "caddy-volumes: network {:?}, capabilities {caps:?}: want none, ALL dropped, CHOWN and DAC_READ_SEARCH",
            init.str("network_mode")
        ));
    }
    problems
}

#[test]
fn deploy_demo_is_demo_with_the_script_under_perf() {
    let mut problems = vec![];
    let mut names: Vec<_> = std::fs::read_dir(root().join("demo"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for f in names {
        let f = f.to_string_lossy();
        let Ok(b) = std::fs::read(root().join("deploy/demo").join(&*f)) else {
            problems.push(format!("deploy/demo/{f} is missing (copy of demo/{f})"));
            continue;
        };
        let mut a = std::fs::read(root().join("demo").join(&*f)).unwrap();
        if f == "index.html" {
            a = String::from_utf8(a)
                .unwrap()
                .replace("src=\"__COLLECTOR__/", "src=\"/perf/")
                .into_bytes();
        }
        if a != b {
            let beyond = if f == "index.html" {
                " (beyond __COLLECTOR__ -> /perf)"
            } else {
                ""
            };
            problems.push(format!("deploy/demo/{f} differs from demo/{f}{beyond}"));
        }
    }
    let index = std::fs::read_to_string(root().join("deploy/demo/index.html")).unwrap();
    if index.contains("__COLLECTOR__") {
        problems.push("deploy/demo/index.html still has the __COLLECTOR__ placeholder".into());
    }
    assert_no_problems(problems);
}

//! The `Dockerfile` and `.dockerignore`: stages, licence notices, the build context and the
//! dependency layer.

use super::*;

/// The licence notices in the image: the project's LICENSE and the generated third-party
/// file, copied from the build context by the runtime stage.
const LICENSE_FILES: [&str; 2] = ["LICENSE", "collector/THIRD-PARTY-LICENSES"];
const LICENSE_DIR: &str = "/usr/share/doc/collector/";

#[test]
fn image_gets_the_licence_notices_in_usr_share_doc_collector() {
    let mut problems = vec![];
    let stages = dockerfile::stages();
    let ignore = Dockerignore::read();
    let mut copied = BTreeMap::new();
    for (i, a) in &stages.last().expect("a stage").ins {
        if i == "COPY" && !a.contains("--from") {
            let words = copy_words(a);
            for src in &words[..words.len() - 1] {
                copied.insert(src.to_string(), words[words.len() - 1].to_owned());
            }
        }
    }
    for f in LICENSE_FILES {
        let base = f.rsplit('/').next().unwrap();
        match copied.get(f) {
            None => problems.push(format!(
                "the runtime stage does not COPY {f} (licence notices)"
            )),
            Some(dst) if dst != LICENSE_DIR && *dst != format!("{LICENSE_DIR}{base}") => {
                problems.push(format!("{f} is copied to {dst}, want {LICENSE_DIR}"))
            }
            Some(_) if !dockerfile::exists(f) => problems.push(format!("{f} does not exist")),
            Some(_) if ignore.excluded(f) => problems.push(format!(
                "{f} is left out of the build context by .dockerignore"
            )),
            Some(_) => {}
        }
    }
    if let Ok(body) = std::fs::read_to_string(root().join("collector/THIRD-PARTY-LICENSES")) {
        for folder in ["crawler-user-agents", "uap-core"] {
            if !body.contains(&format!("collector/assets/{folder}/LICENSE")) {
                problems.push(format!(
                    "collector/THIRD-PARTY-LICENSES lacks the licence of collector/assets/{folder}"
                ));
            }
        }
    }
    assert_no_problems(problems);
}

#[test]
fn third_party_licenses_file_is_current() {
    run_ok(
        Command::new("python3")
            .arg(root().join("scripts/third-party-licenses.py"))
            .arg("--check")
            .current_dir(root()),
    );
}

/// With a Docker engine (`docker info` answers), the Dockerfile is built (once per run) and
/// the static Dockerfile checks give way to that; returns whether it was built.
fn built_by_docker() -> bool {
    static BUILT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BUILT.get_or_init(|| {
        if !docker_engine_answers() {
            eprintln!("note: no container engine answers (docker info): the Dockerfile is checked statically");
            return false;
        }
        run_ok(Command::new("docker").args(["build", "-t", "collector:check"]).arg(root()));
        true
    })
}

fn runtime_problems(fi: &[(String, String)]) -> Vec<String> {
    let mut problems = vec![];
    let of = |name: &str| -> Vec<&str> {
        fi.iter()
            .filter(|(i, _)| i == name)
            .map(|(_, a)| a.as_str())
            .collect()
    };
    let user = of("USER")
        .last()
        .map(|u| u.split(':').next().unwrap_or("").to_owned());
    match user.as_deref() {
        None | Some("root" | "0") => {
            problems.push(format!("runtime USER {user:?}: must be a non-root user"))
        }
        Some(u) if !u.chars().all(|c| c.is_ascii_digit()) => problems.push(format!(
            "runtime USER {u}: use a fixed numeric uid (volumes are chowned by number)"
        )),
        _ => {}
    }
    let hc = of("HEALTHCHECK")
        .last()
        .map(|h| h.split_once("CMD").map_or("", |(_, c)| c.trim()).to_owned());
    let probe: Option<Vec<String>> = hc.as_deref().and_then(|c| serde_json::from_str(c).ok());
    if probe != Some(vec!["/usr/local/bin/collector".into(), "probe".into()]) {
        problems.push(format!(
            "HEALTHCHECK {hc:?}: want CMD [\"/usr/local/bin/collector\", \"probe\"]"
        ));
    }
    if of("STOPSIGNAL") != ["SIGTERM"] {
        problems.push("STOPSIGNAL SIGTERM is missing".into());
    }
    let env: BTreeMap<String, String> = of("ENV")
        .into_iter()
        .flat_map(dockerfile::env_pairs)
        .collect();
    let spool = env.get("COLLECTOR_SPOOL_DIR");
    let vols: Vec<String> = of("VOLUME")
        .into_iter()
        .flat_map(|a| {
            serde_json::from_str::<Vec<String>>(a)
                .unwrap_or_else(|_| a.split_whitespace().map(str::to_owned).collect())
        })
        .collect();
    if !spool.is_some_and(|s| vols.contains(s)) {
        problems.push(format!(
            "no VOLUME for the spool (COLLECTOR_SPOOL_DIR={spool:?}, VOLUME {vols:?})"
        ));
    }
    // The operations listener is private (issue 52, 5): the image binds it to loopback and
    // does not EXPOSE it; compose.yaml opens it on its own network for Prometheus.
    for (var, want) in [
        ("COLLECTOR_LISTEN", "0.0.0.0:8080"),
        ("COLLECTOR_ADMIN_LISTEN", "127.0.0.1:9464"),
    ] {
        if env.get(var).map(String::as_str) != Some(want) {
            problems.push(format!("{var}={:?}, want {want}", env.get(var)));
        }
    }
    let exposed: Vec<&str> = of("EXPOSE")
        .into_iter()
        .flat_map(|a| a.split_whitespace())
        .collect();
    if exposed != ["8080"] {
        problems.push(format!(
            "EXPOSE {exposed:?}, want 8080 only (never the operations listener)"
        ));
    }
    if !of("COPY")
        .iter()
        .any(|a| a.contains("--from=builder") && a.contains("/usr/local/bin/collector"))
    {
        problems.push(
            "the runtime does not COPY --from=builder the binary to /usr/local/bin/collector"
                .into(),
        );
    }
    problems
}

#[test]
fn dockerfile_multi_stage_non_root_probe_healthcheck_stopsignal_spool_volume() {
    if built_by_docker() {
        return;
    }
    let stages = dockerfile::stages();
    assert!(
        stages.len() >= 2,
        "want a multi-stage build, found {} stage(s)",
        stages.len()
    );
    let (builder, last) = (&stages[0], &stages[stages.len() - 1]);
    let mut problems = vec![];
    if builder.alias.as_deref() != Some("builder") || !builder.from.starts_with("rust:") {
        problems.push(format!(
            "first stage is FROM {} AS {:?}, want a rust image AS builder",
            builder.from, builder.alias
        ));
    }
    if !builder
        .ins
        .iter()
        .any(|(i, a)| i == "RUN" && a.contains("cargo build --release -p collector --locked"))
    {
        problems
            .push("the builder never runs `cargo build --release -p collector --locked`".into());
    }
    if !(last.from.starts_with("debian:bookworm-slim") || last.from.contains("distroless/cc")) {
        problems.push(format!(
            "runtime stage FROM {}: want debian:bookworm-slim or distroless cc",
            last.from
        ));
    }
    problems.extend(runtime_problems(&last.ins));
    // Cache-friendly order: only manifests are copied before the first cargo build.
    let mut before = vec![];
    for (i, a) in &builder.ins {
        if i == "RUN" && a.contains("cargo build") {
            break;
        }
        if i == "COPY" {
            let words = copy_words(a);
            before.extend(words[..words.len() - 1].iter().map(|w| w.to_string()));
        }
    }
    // Besides manifests, the field table's derive (`field-table/`, a proc-macro crate): a
    // build of the dependencies compiles it, so it comes whole; it changes with the field
    // table's shape, not with every source change.
    let stray: Vec<&String> = before
        .iter()
        .filter(|p| !matches!(p.rsplit('/').next(), Some("Cargo.toml" | "Cargo.lock")))
        .filter(|p| p.as_str() != "field-table")
        .collect();
    if before.is_empty() || !stray.is_empty() {
        problems.push(format!(
            "the first cargo build should see only manifests (dependency layer), but it sees {stray:?} of {before:?}"
        ));
    }
    assert_no_problems(problems);
}

#[test]
fn dockerfile_copy_sources_and_compiled_in_files_are_in_the_build_context() {
    if built_by_docker() {
        return;
    }
    let mut problems = vec![];
    let ignore = Dockerignore::read();
    for must_go in ["target", ".stack", ".git", "spool", ".env", "deploy"] {
        if !ignore.excluded(&format!("{must_go}/x")) && !ignore.excluded(must_go) {
            problems.push(format!(
                ".dockerignore lets {must_go} into the build context"
            ));
        }
    }
    let mut sources = vec![];
    for (i, a) in &dockerfile::stages()[0].ins {
        if i == "COPY" && !a.contains("--from") {
            let words: Vec<&str> = a.split_whitespace().collect();
            sources.extend(
                words[..words.len() - 1]
                    .iter()
                    .filter(|w| !w.starts_with("--"))
                    .map(|w| w.to_string()),
            );
        }
    }
    for s in &sources {
        if !dockerfile::exists(s) {
            problems.push(format!("COPY {s}: does not exist"));
        } else if files_under(s).iter().all(|f| ignore.excluded(f)) {
            // A folder counts as sent when some file in it is (an allow-list re-includes parts).
            problems.push(format!(
                "COPY {s}: left out of the build context by .dockerignore"
            ));
        }
    }
    let in_builder = |rel: &str| {
        sources
            .iter()
            .any(|s| rel == s || rel.starts_with(&format!("{}/", s.trim_end_matches('/'))))
    };
    let include = regex::Regex::new(r#"include_(?:str|bytes)!\(\s*"([^"]+)""#).unwrap();
    let mut found = 0;
    for file in files_under("collector/src")
        .into_iter()
        .filter(|f| f.ends_with(".rs"))
    {
        let body = std::fs::read_to_string(root().join(&file)).unwrap();
        let dir = file.rsplit_once('/').map_or("", |(d, _)| d);
        for m in include.captures_iter(&body) {
            found += 1;
            let rel = rel_to_root(&format!("{dir}/{}", &m[1]));
            if !dockerfile::exists(&rel) {
                problems.push(format!("{file} includes {rel}, which does not exist"));
            } else if ignore.excluded(&rel) {
                problems.push(format!("{rel} (compiled in) is left out by .dockerignore"));
            } else if !in_builder(&rel) {
                problems.push(format!(
                    "{rel} (compiled in) is not copied into the builder"
                ));
            }
        }
    }
    if found == 0 {
        problems.push("no include_str! found in collector/src (expected the schema files)".into());
    }
    assert_no_problems(problems);
}

/// `from` (a file, or a folder and everything under it) copied to `to`, as a COPY line does.
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    if from.is_dir() {
        for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("COPY {from:?}: {e}")) {
            let entry = entry.unwrap();
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("COPY {from:?}: {e}"));
    }
}

#[test]
fn dockerfile_dependency_layer_loads_the_workspace_from_the_manifests() {
    if built_by_docker() {
        return;
    }
    // The builder's first `cargo build` RUN replayed in a copy of what the COPY lines before
    // it bring in, with `cargo` standing for `cargo metadata --locked`: the stand-in sources
    // must let Cargo load the workspace, and Cargo.lock must fit the manifests.
    let dir = tempfile::tempdir().unwrap();
    let (src, bin) = (dir.path().join("src"), dir.path().join("bin"));
    std::fs::create_dir_all(&bin).unwrap();
    let mut run = None;
    for (i, a) in &dockerfile::stages()[0].ins {
        if i == "COPY" {
            let words = copy_words(a);
            let dst = words[words.len() - 1];
            for s in &words[..words.len() - 1] {
                let to = if dst == "." || dst.ends_with('/') {
                    format!(
                        "{}/{}",
                        dst.trim_end_matches('/'),
                        s.rsplit('/').next().unwrap()
                    )
                } else {
                    dst.to_owned()
                };
                copy_tree(&root().join(s), &src.join(to));
            }
        } else if i == "RUN" && a.contains("cargo build") {
            run = Some(a.clone());
            break;
        }
    }
    let run = run.expect("no RUN with cargo build in the builder stage");
    // An absolute path: the shim below comes first on PATH and is itself named `cargo` (a bare
    // name would run the shim again and again).
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| {
        let which = run_ok(Command::new("sh").args(["-c", "command -v cargo"]));
        let path = which.trim().to_owned();
        assert!(
            path.starts_with('/'),
            "cargo is not on PATH as a file: {path:?}"
        );
        path
    });
    let err = dir.path().join("meta.err");
    // Stands for "cargo build": load the workspace with the lock file as it is (offline when
    // the registry index is cached).
    let shim = format!(
        "#!/bin/sh\n\"{cargo}\" metadata --format-version 1 --locked --offline >/dev/null 2>\"{e}\" && exit 0\n\
         grep -q offline \"{e}\" || {{ cat \"{e}\" >&2; exit 1; }}\n\
         exec \"{cargo}\" metadata --format-version 1 --locked >/dev/null\n",
        e = err.display()
    );
    std::fs::write(bin.join("cargo"), shim).unwrap();
    run_ok(Command::new("chmod").arg("755").arg(bin.join("cargo")));
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    run_ok(
        Command::new("sh")
            .args(["-ec", &run])
            .current_dir(&src)
            .env("PATH", path),
    );
}

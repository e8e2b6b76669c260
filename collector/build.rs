//! Sets `COLLECTOR_REVISION` (the `revision` label of `collector_build_info`): the value of
//! the `COLLECTOR_REVISION` environment variable when set (for builds without a git checkout,
//! such as a container build from a source archive), else the commit of the checkout
//! (`git rev-parse HEAD`), else `unknown`.
//! A handful of lines of our own rather than a build-info crate: nothing else is needed.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-env-changed=COLLECTOR_REVISION");
    let revision = match std::env::var("COLLECTOR_REVISION") {
        Ok(r) if !r.trim().is_empty() => r.trim().to_owned(),
        _ => match git(&["rev-parse", "HEAD"]) {
            Some(commit) => {
                // Rebuild when the commit moves: HEAD itself, the branch it names, packed refs.
                for path in ["HEAD", "packed-refs"] {
                    if let Some(p) = git(&["rev-parse", "--git-path", path]) {
                        println!("cargo:rerun-if-changed={p}");
                    }
                }
                if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    if let Some(p) = git(&["rev-parse", "--git-path", &branch]) {
                        println!("cargo:rerun-if-changed={p}");
                    }
                }
                commit
            }
            None => "unknown".to_owned(),
        },
    };
    println!("cargo:rustc-env=COLLECTOR_REVISION={revision}");
}

//! The Containerfile: builds as `cargo xtask setup` prepares a machine (same nightly,
//! bpf-linker, LLVM prefix) and installs the binary the DaemonSet runs.

use super::*;

/// `const NAME: &str = "value";` in Rust source.
pub(super) fn rust_const<'a>(source: &'a str, name: &str) -> Option<&'a str> {
    let line = source.lines().find(|l| {
        l.trim_start()
            .starts_with(&format!("const {name}: &str = "))
    })?;
    line.split('"').nth(1)
}

/// `ARG NAME=value` in a Containerfile.
pub(super) fn containerfile_arg<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("ARG {name}=")))
        .map(str::trim)
}

pub(super) fn containerfile_errors(d: &Deploy) -> Vec<String> {
    let Some(text) = d.files.get("Containerfile") else {
        return vec!["deploy/Containerfile is missing".to_string()];
    };
    let mut e = Vec::new();
    for name in ["BPF_LINKER_VERSION", "LLVM_PREFIX"] {
        let xtask = rust_const(&d.xtask, name);
        let ours = containerfile_arg(text, name);
        if xtask.is_none() || xtask != ours {
            e.push(format!(
                "deploy/Containerfile: ARG {name}={ours:?}, but xtask setup uses {xtask:?}"
            ));
        }
    }
    // The nightly is the one `cargo xtask setup` and CI use: read from the same file.
    match rust_const(&d.xtask, "NIGHTLY_FILE") {
        Some(file) if text.lines().any(|l| l.starts_with(&format!("COPY {file} "))) => {}
        file => e.push(format!(
            "deploy/Containerfile: does not read the pinned nightly from {file:?} as xtask setup does"
        )),
    }
    if !text.contains("--component rust-src") {
        e.push("deploy/Containerfile: the nightly needs rust-src (-Z build-std=core)".into());
    }
    let stages = text.lines().filter(|l| l.starts_with("FROM ")).count();
    if stages < 2 {
        e.push("deploy/Containerfile: a build stage and a runtime stage are expected".into());
    }
    // The runtime stage's last COPY puts the binary where the DaemonSet runs it.
    let installed = text
        .lines()
        .rfind(|l| l.starts_with("COPY --from="))
        .and_then(|l| l.split_whitespace().last());
    if let Some((doc, ds)) = d.daemonset() {
        let commands: Vec<Option<String>> = ds
            .spec
            .template
            .spec
            .map(|p| p.containers)
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.command.and_then(|c| c.into_iter().next()))
            .collect();
        for command in commands {
            if command.as_deref() != installed {
                e.push(format!(
                    "{}: runs {command:?}, but the Containerfile installs {installed:?}",
                    doc.at()
                ));
            }
        }
    }
    e
}

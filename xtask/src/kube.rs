//! Kubernetes' own control-plane binaries for the tests against a real API server:
//! etcd, kube-apiserver and kube-controller-manager, built with Go from the wrapper
//! modules in `xtask/kube/` at the versions pinned in `kube-toolchain`, into
//! `target/kube/bin` (envtest's layout: usable as `KUBEBUILDER_ASSETS`).
//!
//! Built once: a binary that already reports the pinned version is kept. The first
//! build downloads about 1 GB of modules and compiles for about 11 CPU-minutes (up to
//! half an hour on 2 busy cores); Go's build cache (`~/.cache/go-build`) makes a
//! rebuild a matter of linking.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::{output, run, workspace_root};

/// The file at the workspace root that pins the Kubernetes and etcd releases.
const VERSIONS_FILE: &str = "kube-toolchain";

/// The pinned releases.
struct Versions {
    /// `vX.Y.Z` of k8s.io/kubernetes.
    kubernetes: String,
    /// `vX.Y.Z` of go.etcd.io/etcd/server/v3.
    etcd: String,
}

/// Where the binaries go.
pub fn bin_dir() -> PathBuf {
    workspace_root().join("target/kube/bin")
}

/// Builds the binaries that do not yet report the pinned versions.
pub fn build_binaries() -> Result<()> {
    let versions = pinned()?;
    let modules = workspace_root().join("xtask/kube");
    let control_plane = modules.join("control-plane");
    let etcd_module = modules.join("etcd");
    check_go_mod(&control_plane, "k8s.io/kubernetes", &versions.kubernetes)?;
    check_staging(&control_plane, &versions.kubernetes)?;
    check_go_mod(&etcd_module, "go.etcd.io/etcd/server/v3", &versions.etcd)?;
    let bin = bin_dir();
    let kube_version = format!("Kubernetes {}", versions.kubernetes);
    let kube_ok = ["kube-apiserver", "kube-controller-manager"]
        .iter()
        .all(|b| reports(&bin.join(b), &kube_version));
    let etcd_version = format!("etcd Version: {}", versions.etcd.trim_start_matches('v'));
    let etcd_ok = reports(&bin.join("etcd"), &etcd_version);
    if kube_ok && etcd_ok {
        return Ok(());
    }
    let go = go()?;
    std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    if !etcd_ok {
        eprintln!(
            "setup: building etcd {} into {} (Go; minutes the first time)",
            versions.etcd,
            bin.display()
        );
        // The server module's root is etcd's main package.
        let out = bin.join("etcd");
        run(go_build(&go, &etcd_module, &out, "-s -w").arg("go.etcd.io/etcd/server/v3"))?;
    }
    if !kube_ok {
        eprintln!(
            "setup: building kube-apiserver and kube-controller-manager {} into {} \
             (Go; about 11 CPU-minutes the first time)",
            versions.kubernetes,
            bin.display()
        );
        run(go_build(
            &go,
            &control_plane,
            &dir_of(&bin),
            &kube_ldflags(&versions.kubernetes)?,
        )
        .args([
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
        ]))?;
    }
    for (b, want) in [
        ("etcd", &etcd_version),
        ("kube-apiserver", &kube_version),
        ("kube-controller-manager", &kube_version),
    ] {
        if !reports(&bin.join(b), want) {
            bail!("{b} was built but does not report {want:?}");
        }
    }
    Ok(())
}

/// `dir` as `go build -o` takes a directory for several packages: with a slash.
fn dir_of(dir: &Path) -> PathBuf {
    let mut s = dir.as_os_str().to_owned();
    s.push("/");
    PathBuf::from(s)
}

/// `go build -o out` in `module` (niced: it shares the machine with the tests).
fn go_build(go: &Path, module: &Path, out: &Path, ldflags: &str) -> Command {
    let mut cmd = Command::new("nice");
    cmd.arg(go)
        .current_dir(module)
        // The module says `go 1.26.0`; never download another toolchain for it.
        .env("GOTOOLCHAIN", "local")
        // go.mod and go.sum are committed: a build must not change them.
        .env("GOFLAGS", "-mod=readonly")
        .args(["build", "-ldflags", ldflags, "-o"])
        .arg(out);
    cmd
}

/// The version stamps Kubernetes' own build sets (hack/lib/version.sh), so that
/// `--version` and the API server's `/version` say the release.
fn kube_ldflags(version: &str) -> Result<String> {
    let mut parts = version.trim_start_matches('v').split('.');
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        bail!("{VERSIONS_FILE}: kubernetes {version:?} is not vX.Y.Z");
    };
    let mut flags = String::from("-s -w");
    for package in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        for (var, value) in [
            ("gitVersion", version),
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
        ] {
            flags.push_str(&format!(" -X {package}.{var}={value}"));
        }
    }
    Ok(flags)
}

/// Whether `binary --version` prints `want` (on its first line).
fn reports(binary: &Path, want: &str) -> bool {
    Command::new(binary)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| String::from_utf8_lossy(&o.stdout).lines().next() == Some(want))
}

/// The Go toolchain: `go` on PATH, else the official tarball's place.
fn go() -> Result<PathBuf> {
    for candidate in [PathBuf::from("go"), PathBuf::from("/usr/local/go/bin/go")] {
        if let Ok(v) = output(Command::new(&candidate).arg("version")) {
            eprintln!("setup: {}", v.trim());
            return Ok(candidate);
        }
    }
    bail!(
        "Go is needed to build Kubernetes' binaries for the tests ({VERSIONS_FILE}), and \
         neither `go` on PATH nor /usr/local/go/bin/go runs: install Go 1.26 or later \
         (https://go.dev/dl/) and put it on PATH"
    )
}

/// The versions in `VERSIONS_FILE`: lines `kubernetes vX.Y.Z` and `etcd vX.Y.Z`.
fn pinned() -> Result<Versions> {
    let path = workspace_root().join(VERSIONS_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let find = |name: &str| {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .map(|v| v.trim().to_string())
            .with_context(|| format!("{} has no line `{name} vX.Y.Z`", path.display()))
    };
    Ok(Versions {
        kubernetes: find("kubernetes")?,
        etcd: find("etcd")?,
    })
}

/// Fails unless `module`'s go.mod requires `path` at `version`.
fn check_go_mod(module: &Path, path: &str, version: &str) -> Result<()> {
    let go_mod = module.join("go.mod");
    let text = std::fs::read_to_string(&go_mod)
        .with_context(|| format!("reading {}", go_mod.display()))?;
    let want = format!("require {path} {version}");
    if !text.lines().any(|l| l.trim() == want) {
        bail!(
            "{} does not say `{want}` as {VERSIONS_FILE} pins it: change both together",
            go_mod.display()
        );
    }
    Ok(())
}

/// Fails unless every `k8s.io/X => k8s.io/X v0.Y.Z` replace of the control-plane
/// module names the staging release of Kubernetes `version` (vY.Z → v0.Y.Z).
fn check_staging(module: &Path, version: &str) -> Result<()> {
    let go_mod = module.join("go.mod");
    let text = std::fs::read_to_string(&go_mod)
        .with_context(|| format!("reading {}", go_mod.display()))?;
    let staging = format!("v0.{}", version.trim_start_matches("v1."));
    let wrong: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("k8s.io/") && l.contains("=>"))
        .filter(|l| l.split_whitespace().last() != Some(staging.as_str()))
        .collect();
    if !wrong.is_empty() {
        bail!(
            "{}: replaces not at {staging} (Kubernetes {version}): {}",
            go_mod.display(),
            wrong.join("; ")
        );
    }
    Ok(())
}

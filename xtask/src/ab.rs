//! `bench datapath-ab <git-rev>`: the datapath bench comparing this build's kernel
//! program with `<git-rev>`'s in one process (`BERTH_BENCH_AB`, see the top of
//! `tests/src/bin/berth-bench-datapath/main.rs`).
//!
//! `<git-rev>`'s object is built in a temporary git worktree (`<target>/ab/worktree`,
//! removed afterwards, also on failure) with a target directory of its own that is
//! kept (`<target>/ab/target`: the next comparison rebuilds only what changed), and
//! copied to `<target>/ab/gateway-<commit>.o`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::{output, run, workspace_root};

/// Builds `rev`'s gateway object, then runs the datapath bench against it.
pub fn bench(rev: &str) -> Result<()> {
    let object = build_object(rev)?;
    eprintln!("datapath-ab: B = {rev} ({})", object.display());
    // `BERTH_BENCH_CASES`, if set, goes through with the environment.
    crate::run_bin_env(
        "berth-bench-datapath",
        &[("BERTH_BENCH_AB", object.as_os_str())],
    )
}

/// The target directory of this workspace's builds.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

fn git() -> Command {
    let mut cmd = Command::new("git");
    cmd.current_dir(workspace_root());
    cmd
}

/// A git worktree, removed on drop.
struct Worktree(PathBuf);

impl Worktree {
    /// Checks `commit` out in a new worktree at `path` (an earlier one left there by a
    /// killed run is removed first).
    fn add(path: &Path, commit: &str) -> Result<Self> {
        if path.exists() {
            Worktree(path.to_path_buf()).remove();
        }
        run(git()
            .args(["worktree", "add", "--detach", "--quiet"])
            .arg(path)
            .arg(commit))?;
        Ok(Worktree(path.to_path_buf()))
    }

    fn remove(&self) {
        let removed = git()
            .args(["worktree", "remove", "--force"])
            .arg(&self.0)
            .status();
        if !removed.is_ok_and(|s| s.success()) {
            eprintln!(
                "datapath-ab: could not remove the worktree {}",
                self.0.display()
            );
        }
    }
}

impl Drop for Worktree {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Builds the gateway object of `rev` and returns where it was copied.
fn build_object(rev: &str) -> Result<PathBuf> {
    let commit = output(git().args(["rev-parse", "--verify", &format!("{rev}^{{commit}}")]))
        .with_context(|| format!("{rev} is no commit"))?
        .trim()
        .to_string();
    let short = &commit[..12];
    let dir = target_dir().join("ab");
    // One path for every revision: its build's outputs are reused by the next.
    let worktree = Worktree::add(&dir.join("worktree"), &commit)?;
    eprintln!(
        "datapath-ab: building {rev} ({short}) in {}",
        worktree.0.display()
    );
    // The build script builds the kernel program (always optimised) into
    // `$OUT_DIR/gateway`, and cargo names that directory in its messages. A check runs
    // the build script as a build does, without compiling the daemon.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let build = Command::new(cargo)
        .current_dir(&worktree.0)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .args(["check", "--release", "-p", "gateway-daemon", "--lib"])
        .arg("--message-format=json")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("starting cargo build")?;
    if !build.status.success() {
        bail!("building {rev}'s gateway-daemon failed ({})", build.status);
    }
    let built = out_dir(&String::from_utf8_lossy(&build.stdout))?.join("gateway");
    let object = dir.join(format!("gateway-{short}.o"));
    std::fs::copy(&built, &object)
        .with_context(|| format!("copying {} to {}", built.display(), object.display()))?;
    Ok(object)
}

/// The `out_dir` of gateway-daemon's build script in cargo's JSON `messages`.
fn out_dir(messages: &str) -> Result<PathBuf> {
    messages
        .lines()
        .filter(|l| l.contains(r#""reason":"build-script-executed""#))
        .filter(|l| l.contains("/gateway-daemon#") || l.contains(r#""gateway-daemon "#))
        .find_map(|l| {
            let (_, rest) = l.split_once(r#""out_dir":""#)?;
            Some(PathBuf::from(rest.split_once('"')?.0))
        })
        .context("cargo reported no build script run of gateway-daemon")
}

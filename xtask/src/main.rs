//! Project tasks: `cargo xtask setup|test|demo|bench
//! datapath|datapath-ab|planner|health|control-plane|e2e|fuzz datapath`.
//!
//! `setup` installs what a fresh machine lacks and is idempotent: Debian packages the
//! tests and demo use, the nightly toolchain pinned in `ebpf-toolchain` (if no nightly
//! is installed) with `rust-src`, and `bpf-linker` built against the nightly's own
//! libLLVM, and Kubernetes' control-plane binaries at the versions pinned in
//! `kube-toolchain` (built with Go, see `kube.rs`). Every other task runs it first. This crate
//! depends on nothing that needs the eBPF toolchain, so it builds on a fresh machine.

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{bail, Context as _, Result};

mod ab;
mod kube;

/// Debian packages and the command each provides (checked before installing).
const PACKAGES: &[(&str, &str)] = &[
    ("iproute2", "ip"),
    ("ethtool", "ethtool"),
    ("nginx-light", "nginx"),
    ("dnsmasq-base", "dnsmasq"),
    ("bind9-dnsutils", "dig"),
    ("curl", "curl"),
    // The routing daemons of the gateway tier test (tests/tests/tier.rs).
    ("bird2", "bird"),
    ("frr", "vtysh"),
    // The end-to-end benchmark's kernel NAT baselines.
    ("iptables", "iptables-legacy"),
    ("nftables", "nft"),
    // The monitoring test: deploy/monitoring's rules and dashboard queries against a
    // real Prometheus scraping a daemon (tests/tests/monitoring.rs).
    ("prometheus", "promtool"),
    // The packet monitor's test reads the pcap `berth monitor` writes
    // (tests/tests/packet_monitor.rs).
    ("tshark", "tshark"),
];

/// The file at the workspace root that names the pinned nightly (`nightly-YYYY-MM-DD`),
/// read here, by `.ci/run` and by `deploy/Containerfile`.
const NIGHTLY_FILE: &str = "ebpf-toolchain";

const BPF_LINKER_VERSION: &str = "0.13.0";
/// Where the nightly's libLLVM is linked for bpf-linker (its path is baked in as rpath).
const LLVM_PREFIX: &str = "/usr/local/lib/berth-llvm";

const USAGE: &str =
    "usage: cargo xtask <setup | test | demo | bench datapath|datapath-ab|planner|health|control-plane|e2e | fuzz datapath>
  setup            install what this machine lacks (idempotent; needs root), and build
                   Kubernetes' binaries for the tests (kube-toolchain; needs Go)
  test             setup, then fmt and clippy checks and every test (needs root)
  demo             setup, then berth run on the examples in network namespaces (needs root)
  bench datapath   setup, then ns/packet of the XDP program under BPF_PROG_TEST_RUN
  bench datapath-ab <git-rev>  setup, then the same, this build's XDP program and
                   <git-rev>'s (built in a worktree under target/ab) in turn in one
                   process: each one's medians and their ratios per case
  bench planner    setup, then planning time for 1k, 10k and 100k routes
  bench health     setup, then the health checker's CPU for 10,000 endpoints checked
                   every 5 s (TCP, loopback in a namespace; [--endpoints N] [--interval D])
  bench control-plane  setup, then berth run with 1k, 10k and 100k routes ([--routes N]...):
                   cold start, change latency, idle CPU, memory, get routes and /metrics
  bench e2e        setup, then two UDP loads (16 long flows; a new 5-tuple every packet)
                   through the gateway by Berth's XDP, iptables, nftables (IPVS if the
                   kernel has it) and plain routing, and Berth's SNAT mode beside
                   iptables DNAT + MASQUERADE: delivered pps, loss, gateway CPU per
                   packet, with the backends on XDP-sink veths, on plain veths and on a
                   bridge (the last two take no XDP frames, as pods' interfaces), over
                   IPv4 and with --family 6|both IPv6 too (IPv6 against IPv4 per mode);
                   tables, target/bench/e2e.svg, a JSON line (arguments go to it: [--load
                   xdp-live-frames|sendmmsg] [--flows long|new|both]
                   [--backends xdp|veth|bridge|all] [--family 4|6|both] [MODE...])
  fuzz datapath    setup, then random and mutated packets through the XDP and TC programs
                   under BPF_PROG_TEST_RUN, invariants checked on every output; reports
                   verdicts, translations, violations, packets/s ([--packets N] [--seed S],
                   default 10^6 packets, a seed from the clock)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["setup"] => setup(),
        ["test"] => setup().and_then(|()| test()),
        ["demo"] => setup().and_then(|()| demo()),
        ["bench", "datapath"] => setup().and_then(|()| run_bin("berth-bench-datapath")),
        ["bench", "datapath-ab", rev] => setup().and_then(|()| ab::bench(rev)),
        ["bench", "planner"] => setup().and_then(|()| run_bin("berth-bench-planner")),
        ["bench", "health", rest @ ..] => {
            setup().and_then(|()| run_bin_with("berth-bench-health", rest))
        }
        ["bench", "control-plane", rest @ ..] => setup().and_then(|()| {
            build_berth()?;
            run_bin_with("berth-bench-control-plane", rest)
        }),
        ["bench", "e2e", rest @ ..] => setup().and_then(|()| {
            build_berth()?;
            // The SNAT row applies its state with the loader.
            build_release("berth-tests", "berth-dp-loader")?;
            run_bin_with("berth-bench-e2e", rest)
        }),
        ["fuzz", "datapath", rest @ ..] => {
            setup().and_then(|()| run_bin_with("berth-fuzz-datapath", rest))
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Runs a command, failing with its name if it does not succeed.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

pub(crate) fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn is_root() -> bool {
    output(Command::new("id").arg("-u"))
        .map(|u| u.trim() == "0")
        .unwrap_or(false)
}

fn require_root(what: &str) -> Result<()> {
    if !is_root() {
        bail!(
            "{what} needs root (XDP, BPF maps and network namespaces): run it with sudo or as root"
        );
    }
    Ok(())
}

fn setup() -> Result<()> {
    require_root("setup")?;
    install_packages()?;
    install_nightly()?;
    install_nightly_components()?;
    install_bpf_linker()?;
    kube::build_binaries()?;
    Ok(())
}

fn install_packages() -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(pkg, _)| {
            let status = output(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]));
            !matches!(status, Ok(s) if s.contains("install ok installed"))
        })
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("setup: installing Debian packages: {}", missing.join(" "));
    run(Command::new("apt-get").arg("update").arg("-q"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    for (pkg, bin) in PACKAGES {
        if !succeeds(Command::new("sh").args(["-c", &format!("command -v {bin}")])) {
            bail!("package {pkg} installed but {bin} is not on PATH");
        }
    }
    Ok(())
}

/// The pinned nightly, from `NIGHTLY_FILE` (its first line that is not a comment).
fn pinned_nightly() -> Result<String> {
    let path = workspace_root().join(NIGHTLY_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .with_context(|| format!("{} names no toolchain", path.display()))
}

/// Installs the pinned nightly under the name `nightly` (which the eBPF build asks
/// rustup for) when no nightly is installed; an installed nightly of another date is
/// kept, with a note (nothing is downloaded for it).
fn install_nightly() -> Result<()> {
    let pinned = pinned_nightly()?;
    let date = pinned
        .strip_prefix("nightly-")
        .with_context(|| format!("{NIGHTLY_FILE}: {pinned:?} is not nightly-YYYY-MM-DD"))?;
    let verbose = output(Command::new("rustc").arg("-vV"))?;
    let host = verbose
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .context("rustc does not report its host")?
        .trim()
        .to_string();
    let rustup_home = std::env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".rustup")))
        .context("neither RUSTUP_HOME nor HOME is set")?;
    let toolchains = rustup_home.join("toolchains");
    let nightly = toolchains.join(format!("nightly-{host}"));
    if nightly.exists() {
        // The channel manifest's date is the nightly's (rustc's commit date is a day
        // earlier).
        let manifest = nightly.join("lib/rustlib/multirust-channel-manifest.toml");
        let installed = std::fs::read_to_string(&manifest)
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("date = "))
                    .map(|d| d.trim().trim_matches('"').to_string())
            })
            .unwrap_or_else(|| "an unknown date".into());
        if installed != date {
            eprintln!(
                "setup: the installed nightly is of {installed}, {NIGHTLY_FILE} pins {pinned}: \
                 building with the installed one"
            );
        }
        return Ok(());
    }
    eprintln!("setup: installing {pinned} as the nightly toolchain");
    run(Command::new("rustup").args([
        "toolchain",
        "install",
        &pinned,
        "--profile",
        "minimal",
        "--component",
        "rust-src",
        "--component",
        "clippy",
    ]))?;
    std::os::unix::fs::symlink(format!("{pinned}-{host}"), &nightly)
        .with_context(|| format!("linking {} to {pinned}", nightly.display()))
}

fn install_nightly_components() -> Result<()> {
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))
    .context("the nightly toolchain is needed to build the XDP program")?;
    // rust-src for -Z build-std=core; clippy to lint the kernel program.
    for component in ["rust-src", "clippy"] {
        if installed.lines().any(|l| l.starts_with(component)) {
            continue;
        }
        eprintln!("setup: adding {component} to the nightly toolchain");
        run(Command::new("rustup").args([
            "component",
            "add",
            component,
            "--toolchain",
            "nightly",
        ]))?;
    }
    Ok(())
}

/// Builds bpf-linker against the nightly's own libLLVM, so both agree on the LLVM
/// major version (no prebuilt binary can be downloaded here).
fn install_bpf_linker() -> Result<()> {
    if succeeds(Command::new("bpf-linker").arg("--version")) {
        return Ok(());
    }
    let sysroot = output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?;
    let libdir = Path::new(sysroot.trim()).join("lib");
    let verbose = output(Command::new("rustc").args(["+nightly", "--version", "--verbose"]))?;
    let major = verbose
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("the nightly rustc does not report its LLVM version")?
        .to_string();
    let prefix_lib = Path::new(LLVM_PREFIX).join("lib");
    std::fs::create_dir_all(&prefix_lib)
        .with_context(|| format!("creating {}", prefix_lib.display()))?;
    let mut found = false;
    for entry in
        std::fs::read_dir(&libdir).with_context(|| format!("reading {}", libdir.display()))?
    {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("libLLVM") && name.contains(".so") {
            found = true;
            link(&entry.path(), &prefix_lib.join(&name))?;
            link(&entry.path(), &prefix_lib.join("libLLVM.so"))?;
        }
    }
    if !found {
        bail!("no libLLVM in {}", libdir.display());
    }
    eprintln!(
        "setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM {major} (a few minutes)"
    );
    run(Command::new("cargo")
        .args([
            "+nightly",
            "install",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
        ])
        .args([
            "--no-default-features",
            "--features",
            &format!("llvm-{major}"),
        ])
        .env("LLVM_PREFIX", LLVM_PREFIX))?;
    if !succeeds(Command::new("bpf-linker").arg("--version")) {
        bail!("bpf-linker was built but does not run (is ~/.cargo/bin on PATH?)");
    }
    Ok(())
}

fn link(target: &Path, link: &Path) -> Result<()> {
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("linking {} -> {}", link.display(), target.display()))
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

fn test() -> Result<()> {
    remove_leftovers()?;
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
    // The kernel program is not a default member: lint it for its own target.
    run(Command::new("rustup")
        .current_dir(workspace_root().join("gateway-ebpf"))
        .env_remove("RUSTC")
        .args([
            "run",
            "nightly",
            "cargo",
            "clippy",
            "--release",
            "--target",
            "bpfel-unknown-none",
        ])
        .args(["-Z", "build-std=core", "--", "-D", "warnings"]))?;
    run(cargo().args(["test"]))
}

/// Removes namespaces and pins that a test run killed before its cleanup left behind
/// (tests name everything they create `berth-<tag><pid>x<n>` and
/// `/sys/fs/bpf/berth-test-...`, `<pid>` being their process id modulo 100,000). Names
/// of a process still running are left alone: another suite (another checkout) may be
/// running its tests on this machine right now.
fn remove_leftovers() -> Result<()> {
    let running = running_pids();
    let left_behind = |name: &str| owner(name).is_none_or(|pid| !running.contains(&pid));
    let list = output(Command::new("ip").args(["netns", "list"]))?;
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        if name.starts_with("berth-") && left_behind(name) {
            eprintln!("test: removing namespace {name} left by an earlier run");
            run(Command::new("ip").args(["netns", "del", name]))?;
        }
    }
    if let Ok(entries) = std::fs::read_dir("/sys/fs/bpf") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("berth-test-") && left_behind(&name) {
                eprintln!(
                    "test: removing pins {} left by an earlier run",
                    entry.path().display()
                );
                std::fs::remove_dir_all(entry.path())?;
            }
        }
    }
    Ok(())
}

/// The process id (modulo 100,000) in a test's name `...<letters><pid>x<n>[-suffix]`.
fn owner(name: &str) -> Option<u32> {
    let (head, _) = name.rsplit_once('x')?;
    let digits = head.len() - head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    head[head.len() - digits..].parse().ok()
}

/// The ids (modulo 100,000, as tests write them) of the processes running now.
fn running_pids() -> std::collections::HashSet<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .map(|pid| pid % 100_000)
        .collect()
}

/// Runs one of the `berth-tests` binaries, optimised.
fn run_bin(name: &str) -> Result<()> {
    run_bin_with(name, &[])
}

/// Runs one of the `berth-tests` binaries, optimised, with arguments.
fn run_bin_with(name: &str, args: &[&str]) -> Result<()> {
    run(&mut bin_command(name, args))
}

/// Runs one of the `berth-tests` binaries, optimised, with these environment variables.
pub(crate) fn run_bin_env(name: &str, envs: &[(&str, &std::ffi::OsStr)]) -> Result<()> {
    run(bin_command(name, &[]).envs(envs.iter().copied()))
}

/// The command running one of the `berth-tests` binaries, optimised, with arguments.
fn bin_command(name: &str, args: &[&str]) -> Command {
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--quiet",
        "--release",
        "-p",
        "berth-tests",
        "--bin",
        name,
        "--",
    ])
    .args(args);
    cmd
}

/// Builds binary `bin` of `package`, optimised, for the demo or a benchmark to start.
fn build_release(package: &str, bin: &str) -> Result<()> {
    run(cargo().args(["build", "--quiet", "--release", "-p", package, "--bin", bin]))
}

/// Builds the optimised `berth` binary, which the demo and a benchmark start.
fn build_berth() -> Result<()> {
    build_release("gateway-daemon", "berth")
}

fn demo() -> Result<()> {
    build_berth()?;
    run_bin("berth-demo")
}

#[cfg(test)]
mod leftover_tests {
    use super::owner;

    #[test]
    fn a_test_names_owner_is_the_process_id_before_the_last_x() {
        assert_eq!(owner("berth-fx8908x1"), Some(8908));
        assert_eq!(owner("berth-kr26107x0"), Some(26107));
        assert_eq!(owner("berth-test-berth-kr26107x0-1"), Some(26107));
        assert_eq!(owner("berth-test-dp12x3"), Some(12));
        assert_eq!(owner("berth0"), None);
        assert_eq!(owner("berth-handmade"), None);
    }
}

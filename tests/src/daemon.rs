//! Running the real `berth` binary in a test network: `berth run` inside the gateway
//! namespace on a copy of the example manifests, with its own state and pin
//! directories, all removed on drop.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use berth::admin::RouteRow;

use crate::{
    netns::{unique, wait_until, Netns},
    topo::Topology,
};

/// The `berth` binary built next to the running test (`target/<profile>/berth`).
pub fn berth_binary() -> PathBuf {
    sibling_binary("berth", "cargo build -p gateway-daemon")
}

/// The binary `name` built next to the running test (`target/<profile>/name`); the
/// panic when it is missing says to build it with `build`.
pub fn sibling_binary(name: &str, build: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    let dir = exe
        .parent()
        .map(|d| {
            if d.ends_with("deps") {
                d.parent().unwrap_or(d)
            } else {
                d
            }
        })
        .expect("target dir");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: build it with `{build}` (cargo test at the root does)",
        bin.display()
    );
    bin
}

/// `berth-dp-loader` joined to a namespace: the datapath, pinned in a fresh directory,
/// attached to the given interfaces with a desired state applied by the daemon's own
/// API. Dropping it kills the loader, then removes its pins and state file.
pub struct Loader {
    proc: Option<crate::netns::Proc>,
    /// Dropped after the loader is killed.
    _pins: crate::loader::Pins,
}

impl Loader {
    /// Starts the loader (built next to this binary) in `ns` on `interfaces` with
    /// `state` and the `extra` arguments, and waits until it has applied the state.
    pub fn start(
        ns: &Netns,
        interfaces: &[impl AsRef<str>],
        state: &berth::datapath::DesiredState,
        extra: &[&str],
    ) -> Self {
        let pins = crate::loader::Pins::new();
        pins.write_state(state);
        let bin = sibling_binary("berth-dp-loader", "cargo build -p berth-tests --bins");
        let (proc, _report) = crate::loader::spawn(bin, &ns.name, interfaces, &pins, extra);
        Loader {
            proc: Some(proc),
            _pins: pins,
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        drop(self.proc.take());
    }
}

/// Directories of one daemon, removed on drop.
pub struct Dirs {
    /// The `--manifests` directory the daemon watches.
    pub manifests: PathBuf,
    /// The `--state-dir`, where claims and first-seen times are kept.
    pub state: PathBuf,
    /// The `--pin-dir` under bpffs where the datapath pins its maps and links.
    pub pins: PathBuf,
    _on_signal: crate::cleanup::OnSignal,
}

impl Dirs {
    /// Fresh directories; the manifests are a copy of `examples/`.
    pub fn with_examples() -> Self {
        Self::with_example_files(&["gateway.yaml", "team-a.yaml", "team-b.yaml"])
    }

    /// Fresh directories; the manifests are copies of the named files of `examples/`
    /// (add more files to `manifests` as needed).
    pub fn with_example_files(files: &[&str]) -> Self {
        let id = unique("e");
        let tmp = std::env::temp_dir();
        let (manifests, state) = (
            tmp.join(format!("berth-e2e-manifests-{id}")),
            tmp.join(format!("berth-e2e-state-{id}")),
        );
        let pins = PathBuf::from(format!("/sys/fs/bpf/berth-test-{id}"));
        let (m, s, p) = (manifests.clone(), state.clone(), pins.clone());
        let d = Dirs {
            manifests,
            state,
            pins,
            _on_signal: crate::cleanup::on_signal(move || remove_dirs(&m, &s, &p)),
        };
        std::fs::create_dir_all(&d.manifests).expect("manifest dir");
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        for f in files {
            std::fs::copy(examples.join(f), d.manifests.join(f)).expect("copy example");
        }
        d
    }

    /// Replaces `from` with `to` in the manifest `file`; panics if `from` is not in it.
    pub fn edit_manifest(&self, file: &str, from: &str, to: &str) {
        let path = self.manifests.join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        assert!(text.contains(from), "{file} has no {from:?} to replace");
        std::fs::write(&path, text.replace(from, to))
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    /// `berth run` in `gateway` on these directories, not started; add the
    /// `--interface`s and other arguments.
    pub fn berth_run(&self, gateway: &Netns) -> Command {
        self.berth_run_from(&berth_binary(), gateway)
    }

    /// `berth run` in `topo`'s gateway on all its interfaces with `extra`, on a second
    /// admin address, expected to refuse to start: its stderr, once it has exited
    /// unsuccessfully within 20 s (it is killed, and the test fails, otherwise).
    pub fn refused_start(&self, topo: &Topology, extra: &[&str]) -> String {
        let mut run = self
            .berth_run(&topo.gateway)
            .args(extra)
            .args(["--admin-addr", "127.0.0.1:9479"])
            .args(topo.gateway_ifaces.iter().flat_map(|i| ["--interface", i]))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start berth run");
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(status) = run.try_wait().expect("wait for berth run") {
                break status;
            }
            if started.elapsed() > Duration::from_secs(20) {
                let _ = run.kill();
                let _ = run.wait();
                panic!("berth run {extra:?} did not exit");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut run.stderr.take().expect("stderr"), &mut stderr)
            .expect("read stderr");
        assert!(!status.success(), "berth run {extra:?} started: {stderr}");
        stderr
    }

    /// `berth_run` of the binary `berth` (another build).
    pub fn berth_run_from(&self, berth: &Path, gateway: &Netns) -> Command {
        let mut cmd = gateway.command(berth);
        cmd.arg("run")
            .arg("--manifests")
            .arg(&self.manifests)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--pin-dir")
            .arg(&self.pins);
        cmd
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        remove_dirs(&self.manifests, &self.state, &self.pins);
    }
}

/// Removes a daemon's manifest and state directories and its pins.
fn remove_dirs(manifests: &Path, state: &Path, pins: &Path) {
    let _ = std::fs::remove_dir_all(manifests);
    let _ = std::fs::remove_dir_all(state);
    let _ = berth::datapath::remove_pins(pins);
}

/// A running `berth run`, killed (by PID) on drop.
pub struct Daemon {
    child: Option<Child>,
    berth: PathBuf,
    gateway: String,
    /// Killed first if a signal stops the test (before its directories go).
    _on_signal: Option<crate::cleanup::OnSignal>,
}

impl Daemon {
    /// Starts `berth run` in the gateway namespace of `topo`, attached to all its
    /// interfaces, and waits until it serves.
    pub fn start(topo: &Topology, dirs: &Dirs) -> Self {
        Self::start_on(&topo.gateway, &topo.gateway_ifaces, dirs)
    }

    /// Starts `berth run` in `gateway`, attached to `interfaces`, and waits until it
    /// serves.
    pub fn start_on(gateway: &Netns, interfaces: &[impl AsRef<str>], dirs: &Dirs) -> Self {
        Self::start_with(gateway, interfaces, dirs, &[])
    }

    /// `start_on` with more arguments for `berth run`.
    pub fn start_with(
        gateway: &Netns,
        interfaces: &[impl AsRef<str>],
        dirs: &Dirs,
        extra: &[&str],
    ) -> Self {
        Self::start_binary(&berth_binary(), gateway, interfaces, dirs, extra)
    }

    /// `start_with` of the binary `berth` (another build).
    pub fn start_binary(
        berth: &Path,
        gateway: &Netns,
        interfaces: &[impl AsRef<str>],
        dirs: &Dirs,
        extra: &[&str],
    ) -> Self {
        let berth = berth.to_path_buf();
        let mut cmd = dirs.berth_run_from(&berth, gateway);
        // A removed route file takes effect after half a second, not the default 5 s
        // (the settle time itself is tested in gateway-daemon/tests/standalone.rs).
        cmd.args(["--manifest-settle", "500ms"]);
        for iface in interfaces {
            cmd.args(["--interface", iface.as_ref()]);
        }
        cmd.args(extra);
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start berth run");
        let mut d = Daemon {
            _on_signal: crate::cleanup::kill_on_signal(child.id()),
            child: Some(child),
            berth,
            gateway: gateway.name.clone(),
        };
        wait_until("berth run to serve", Duration::from_secs(20), || {
            d.assert_running();
            d.try_routes(gateway).is_some()
        });
        d
    }

    /// Panics if the daemon exited.
    fn assert_running(&mut self) {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                panic!("berth run exited with {status} (its log is above)");
            }
        }
    }

    /// `berth get routes -o json` as JSON values: for fields this crate's `RouteRow`
    /// may not have yet.
    pub fn route_values(&self, gateway: &Netns) -> Vec<serde_json::Value> {
        assert_eq!(gateway.name, self.gateway);
        let out = gateway
            .command(&self.berth)
            .args(["get", "routes", "-o", "json"])
            .output()
            .expect("berth get routes");
        assert!(
            out.status.success(),
            "berth get routes: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("berth get routes -o json")
    }

    fn try_routes(&self, gateway: &Netns) -> Option<Vec<RouteRow>> {
        assert_eq!(gateway.name, self.gateway);
        routes_in(gateway, &self.berth)
    }

    /// `berth get routes` from the daemon.
    pub fn routes(&self, gateway: &Netns) -> Vec<RouteRow> {
        self.try_routes(gateway).expect("berth get routes")
    }

    /// Sends SIGTERM (as Kubernetes stops a pod), without waiting.
    pub fn terminate(&self) {
        let pid = self.child.as_ref().map(Child::id).expect("the daemon runs");
        let pid = libc::pid_t::try_from(pid).expect("a pid");
        // SAFETY: kill(2) with the pid of our own child, not yet reaped.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(
            rc,
            0,
            "kill -TERM {pid}: {}",
            std::io::Error::last_os_error()
        );
    }

    /// The daemon's exit status if it has exited (it is reaped then), else `None`.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().expect("waitpid")?;
        self.child = None;
        Some(status)
    }

    /// Kills the daemon with SIGKILL (no cleanup of any kind) and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `berth get routes -o json` (binary `berth`) from the daemon in `ns` on the default
/// admin address; None while it does not answer.
pub fn routes_in(ns: &Netns, berth: &Path) -> Option<Vec<RouteRow>> {
    routes_at(ns, berth, "127.0.0.1:9470")
}

/// `routes_in` from the daemon whose admin endpoint is `admin`.
pub fn routes_at(ns: &Netns, berth: &Path, admin: &str) -> Option<Vec<RouteRow>> {
    let out = ns
        .command(berth)
        .args(["get", "routes", "-o", "json", "--admin-addr", admin])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// The daemon's `/metrics` (its admin endpoint inside `gateway`).
pub fn metrics(gateway: &Netns) -> String {
    gateway
        .enter(|| berth::admin::get("127.0.0.1:9470", "/metrics"))
        .expect("GET /metrics")
}

/// The value of the sample `name{labels}` (exactly as written) in `metrics`, if any.
pub fn sample(metrics: &str, series: &str) -> Option<u64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Runs `berth uninstall --pin-dir PINS` in `gateway`; panics if it fails.
pub fn uninstall(gateway: &Netns, dirs: &Dirs) {
    let out = gateway
        .command(&berth_binary())
        .arg("uninstall")
        .arg("--pin-dir")
        .arg(&dirs.pins)
        .output()
        .expect("start berth uninstall");
    assert!(
        out.status.success(),
        "berth uninstall failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A policy's status in the state document of the daemon in `gateway`
/// (`/api/v1/state`): per target, the (status, reason, message) of its condition of
/// type `condition`. `None` until the document lists the policy.
pub fn policy_conditions(
    gateway: &Netns,
    kind: &str,
    name: &str,
    condition: &str,
) -> Option<Vec<(String, String, String)>> {
    let text = gateway
        .enter(|| berth::admin::get("127.0.0.1:9470", "/api/v1/state"))
        .ok()?;
    let doc: serde_json::Value = serde_json::from_str(&text).ok()?;
    let policy = doc["policies"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name && p["kind"] == kind)?
        .clone();
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    policy["status"]["ancestors"]
        .as_array()?
        .iter()
        .map(|a| {
            let c = a["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == condition)?;
            Some((text(&c["status"]), text(&c["reason"]), text(&c["message"])))
        })
        .collect()
}

//! Running the real `berth` binary in a test network: `berth run` inside the gateway
//! namespace on a copy of the example manifests, with its own state and pin
//! directories, all removed on drop.

use std::{
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::Duration,
};

use berth::admin::RouteRow;

use crate::{
    netns::{unique, wait_until, Netns},
    topo::Topology,
};

/// The `berth` binary built next to the running test (`target/<profile>/berth`).
pub fn berth_binary() -> PathBuf {
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
    let berth = dir.join("berth");
    assert!(berth.exists(), "{} is missing: build it with `cargo build -p gateway-daemon` (cargo test at the root does)", berth.display());
    berth
}

/// Directories of one daemon, removed on drop.
pub struct Dirs {
    pub manifests: PathBuf,
    pub state: PathBuf,
    pub pins: PathBuf,
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
        let d = Dirs {
            manifests: tmp.join(format!("berth-e2e-manifests-{id}")),
            state: tmp.join(format!("berth-e2e-state-{id}")),
            pins: PathBuf::from(format!("/sys/fs/bpf/berth-test-{id}")),
        };
        std::fs::create_dir_all(&d.manifests).expect("manifest dir");
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        for f in files {
            std::fs::copy(examples.join(f), d.manifests.join(f)).expect("copy example");
        }
        d
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.manifests);
        let _ = std::fs::remove_dir_all(&self.state);
        let _ = berth::datapath::remove_pins(&self.pins);
    }
}

/// A running `berth run`, killed (by PID) on drop.
pub struct Daemon {
    child: Option<Child>,
    berth: PathBuf,
    gateway: String,
}

impl Daemon {
    /// Starts `berth run` in the gateway namespace of `topo`, attached to all its
    /// interfaces, and waits until it serves.
    pub fn start(topo: &Topology, dirs: &Dirs) -> Self {
        let berth = berth_binary();
        let mut cmd = topo.gateway.command(&berth);
        cmd.arg("run")
            .arg("--manifests")
            .arg(&dirs.manifests)
            .arg("--state-dir")
            .arg(&dirs.state)
            .arg("--pin-dir")
            .arg(&dirs.pins);
        for iface in &topo.gateway_ifaces {
            cmd.args(["--interface", iface]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start berth run");
        let d = Daemon {
            child: Some(child),
            berth,
            gateway: topo.gateway.name.clone(),
        };
        wait_until("berth run to serve", Duration::from_secs(20), || {
            d.try_routes(&topo.gateway).is_some()
        });
        d
    }

    fn try_routes(&self, gateway: &Netns) -> Option<Vec<RouteRow>> {
        assert_eq!(gateway.name, self.gateway);
        let out = gateway
            .command(&self.berth)
            .args(["get", "routes", "-o", "json"])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// `berth get routes` from the daemon.
    pub fn routes(&self, gateway: &Netns) -> Vec<RouteRow> {
        self.try_routes(gateway).expect("berth get routes")
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

//! `berth-dp-loader` run by a test: started in a namespace on a pin directory and a
//! state file, killed by PID on drop; the pins and the state file are removed when the
//! test's `Pins` guard drops, also when the test fails.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use berth::datapath::DesiredState;
use gateway_common::{map_names, Counter};

use crate::{
    netns::{unique, Proc},
    topo::Topology,
};

/// A pin directory and a state file of one test, removed on drop.
pub struct Pins {
    /// Where the loader pins the maps, programs and links.
    pub dir: PathBuf,
    /// The desired state the loader applies (JSON).
    pub state: PathBuf,
    _on_signal: crate::cleanup::OnSignal,
}

impl Pins {
    /// Fresh, unused paths.
    pub fn new() -> Self {
        let dir = PathBuf::from(format!("/sys/fs/bpf/berth-test-{}", unique("rs")));
        let state = std::env::temp_dir().join(format!("berth-state-{}.json", unique("st")));
        let (d, s) = (dir.clone(), state.clone());
        Pins {
            dir,
            state,
            _on_signal: crate::cleanup::on_signal(move || remove(&d, &s)),
        }
    }

    /// Writes `state` to the state file (the loader applies it when it starts).
    pub fn write_state(&self, state: &DesiredState) {
        std::fs::write(
            &self.state,
            serde_json::to_vec(state).expect("state as json"),
        )
        .unwrap_or_else(|e| panic!("writing {}: {e}", self.state.display()));
    }

    /// A datapath counter summed over CPUs, read from the pinned counter map (the
    /// loader keeps no socket to ask it).
    pub fn counter(&self, c: Counter) -> u64 {
        let path = self.dir.join(map_names::COUNTERS);
        let map = aya::maps::MapData::from_pin(&path)
            .and_then(aya::maps::Map::from_map_data)
            .and_then(aya::maps::PerCpuArray::<_, u64>::try_from)
            .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        let values = map
            .get(&(c as u32), 0)
            .unwrap_or_else(|e| panic!("reading counter {}: {e}", c.name()));
        values.iter().sum()
    }
}

impl Default for Pins {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        remove(&self.dir, &self.state);
    }
}

/// Removes the pins under `dir` and the state file `state`.
fn remove(dir: &Path, state: &Path) {
    let _ = berth::datapath::remove_pins(dir);
    let _ = std::fs::remove_file(state);
}

/// Starts the loader binary `bin` (the test's `env!("CARGO_BIN_EXE_berth-dp-loader")`)
/// joined to `topo`'s gateway namespace, attached to the gateway's interfaces, on
/// `pins` (see `spawn`).
pub fn start(bin: &str, topo: &Topology, pins: &Pins) -> (Proc, String) {
    spawn(bin, &topo.gateway.name, &topo.gateway_ifaces, pins, &[])
}

/// Starts the loader binary `bin` joined to namespace `netns` (not with `ip netns
/// exec`: that also gives the process its own /sys, hence a private bpffs whose pins
/// die with it), attached to `interfaces`, on `pins`, with `extra` arguments. Returns
/// once it is ready, with its one-line JSON report.
pub fn spawn(
    bin: impl AsRef<std::ffi::OsStr>,
    netns: &str,
    interfaces: &[impl AsRef<str>],
    pins: &Pins,
    extra: &[&str],
) -> (Proc, String) {
    let mut cmd = Command::new(bin.as_ref());
    cmd.args(["--netns", netns, "--pin-dir"])
        .arg(&pins.dir)
        .arg("--state")
        .arg(&pins.state);
    for iface in interfaces {
        cmd.args(["--interface", iface.as_ref()]);
    }
    let mut child = cmd
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting berth-dp-loader: {e}"));
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let report = lines.next().and_then(Result::ok).unwrap_or_default();
    let ready = lines.next().and_then(Result::ok).unwrap_or_default();
    let proc = Proc::from_child(child, "berth-dp-loader");
    assert_eq!(ready, "ready", "loader did not come up (report: {report})");
    (proc, report)
}

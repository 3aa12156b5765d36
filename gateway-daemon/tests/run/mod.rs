//! Shared by the tests that drive `berth run` as a user does (`standalone`,
//! `manifest_rewrites`, `full_disk`...): start it on a manifest and a state directory
//! with its own admin port, read its endpoint (state, ports, plans), wait for it, kill
//! it (by PID) when the test ends; and a small
//! tmpfs to put its state directory on, to fill up.

#![allow(
    dead_code,
    reason = "each test crate that includes this module uses a part of it"
)]

use std::{
    fs::OpenOptions,
    io::{Read, Write},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

/// A running `berth run`, killed on drop.
pub struct Daemon {
    pub child: Child,
    /// Its admin endpoint.
    pub admin: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// Starts `berth run --manifests MANIFESTS --state-dir STATE` on a free admin port,
    /// without waiting; its stderr is piped (read it with `exit`) or dropped.
    pub fn spawn(manifests: &Path, state: &Path, keep_stderr: bool) -> Daemon {
        Daemon::spawn_with(manifests, state, keep_stderr, &[])
    }

    /// `spawn` with more arguments for `berth run`.
    pub fn spawn_with(manifests: &Path, state: &Path, keep_stderr: bool, args: &[&str]) -> Daemon {
        let admin = {
            let l = TcpListener::bind("127.0.0.1:0").expect("free port");
            l.local_addr().expect("addr").to_string()
        };
        let child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["run", "--manifests"])
            .arg(manifests)
            .arg("--state-dir")
            .arg(state)
            .args(["--admin-addr", &admin])
            .args(args)
            .stdout(Stdio::null())
            .stderr(if keep_stderr {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("start berth run");
        Daemon { child, admin }
    }

    /// `spawn`, then waits until it is ready.
    pub fn start(manifests: &Path, state: &Path) -> Daemon {
        Daemon::start_with(manifests, state, &[])
    }

    /// `spawn_with`, then waits until it is ready.
    pub fn start_with(manifests: &Path, state: &Path, args: &[&str]) -> Daemon {
        let d = Daemon::spawn_with(manifests, state, false, args);
        wait_for("readiness", || d.readyz().is_some_and(|(ok, _)| ok));
        d
    }

    /// `/readyz`: whether it answered 200, and its body; None if it did not answer.
    pub fn readyz(&self) -> Option<(bool, String)> {
        let mut s = std::net::TcpStream::connect(&self.admin).ok()?;
        write!(s, "GET /readyz HTTP/1.0\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        Some((head.starts_with("HTTP/1.0 200"), body.to_string()))
    }

    /// Waits up to 10 s for the process to exit by itself; its status and what it
    /// wrote to stderr (if piped). Panics with `what` if it keeps running.
    pub fn exit(&mut self, what: &str) -> (ExitStatus, String) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        (status, err)
    }
}

/// The value in KiB of `field` (`VmRSS`, `VmHWM`, ...) of `/proc/PID/status`.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Polls `cond` every 20 ms for up to 15 s; panics with `what`.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A fresh, empty directory `berth-TAG-PID` under the temp directory, removed on drop
/// (also when the test fails). It is a `Path`.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("berth-{tag}-{}", std::process::id()));
        // Left by an earlier run of this test that was killed.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TempDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tmpfs of `kib` KiB mounted on a fresh directory; unmounted and removed on drop.
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    pub fn new(tag: &str, kib: u32) -> Self {
        let dir = std::env::temp_dir().join(format!("berth-full-{tag}-{}", std::process::id()));
        // Left mounted by an earlier run of this test that was killed.
        let _ = Command::new("umount")
            .arg(&dir)
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(&dir)
            .status()
            .expect("mount");
        assert!(status.success(), "mounting a tmpfs on {}", dir.display());
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Fills the filesystem of `dir` with a file, then frees `leave` bytes of it again.
pub fn fill(dir: &Path, leave: u64) -> PathBuf {
    let path = dir.join("filler");
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .expect("filler");
    let chunk = vec![0x5au8; 4096];
    while f.write_all(&chunk).is_ok() {}
    let len = f.metadata().expect("filler size").len();
    f.set_len(len.saturating_sub(leave)).expect("free some");
    path
}

/// The state document (`/api/v1/state`) of a running daemon.
pub fn state(d: &Daemon) -> serde_json::Value {
    serde_json::from_str(&berth::admin::get(&d.admin, "/api/v1/state").expect("state"))
        .expect("json")
}

/// The port in route `name`'s status for its first parent, if accepted.
pub fn port_of(state: &serde_json::Value, name: &str) -> Option<u64> {
    let r = state["routes"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == name)?;
    let p = &r["status"]["parents"][0];
    let accepted = p["conditions"]
        .as_array()?
        .iter()
        .any(|c| c["type"] == "Accepted" && c["status"] == "True");
    accepted.then(|| p["parentRef"]["port"].as_u64()).flatten()
}

/// `berth_plans_total`: how many plans the daemon has made (0 if unanswered).
pub fn plans_total(d: &Daemon) -> u64 {
    berth::admin::get(&d.admin, "/metrics")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("berth_plans_total "))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

//! Network namespaces, links and processes that a test creates and always removes.

use std::{
    fs::File,
    os::fd::AsRawFd,
    process::{Child, Command, Output, Stdio},
    sync::atomic::{AtomicU32, Ordering},
};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A name unique to this process and call, short enough for an interface (15 bytes).
pub fn unique(tag: &str) -> String {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("{tag}{}x{n}", std::process::id() % 100_000);
    assert!(name.len() <= 15, "name {name} too long for an interface");
    name
}

/// Runs a command and panics with its output if it fails.
pub fn run(cmd: &[&str]) -> Output {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A network namespace, deleted (with its interfaces) on drop.
pub struct Netns {
    /// The name `ip netns` knows it by (`berth-` + `unique(tag)`).
    pub name: String,
    _on_signal: crate::cleanup::OnSignal,
}

impl Netns {
    /// Creates a namespace named `berth-<tag>...` with loopback up.
    pub fn new(tag: &str) -> Self {
        let name = format!("berth-{}", unique(tag));
        run(&["ip", "netns", "add", &name]);
        let removal = name.clone();
        let ns = Netns {
            name,
            _on_signal: crate::cleanup::on_signal(move || remove_netns(&removal)),
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n NS args...`.
    pub fn ip(&self, args: &[&str]) -> Output {
        let mut cmd = vec!["ip", "-n", &self.name];
        cmd.extend(args);
        run(&cmd)
    }

    /// Whether the namespace has a link named `name`.
    pub fn has_link(&self, name: &str) -> bool {
        Command::new("ip")
            .args(["-n", &self.name, "link", "show", "dev", name])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// Runs a command inside the namespace and panics if it fails.
    pub fn exec(&self, cmd: &[&str]) -> Output {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend(cmd);
        run(&full)
    }

    /// Runs a command inside the namespace, returning its output whatever the status.
    pub fn try_exec(&self, cmd: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(cmd)
            .output()
            .unwrap_or_else(|e| panic!("running {cmd:?} in {}: {e}", self.name))
    }

    /// Starts a long-running command inside the namespace; it is killed on drop.
    pub fn spawn(&self, cmd: &[&str]) -> Proc {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?} in {}: {e}", self.name));
        Proc::from_child(child, &format!("{cmd:?}"))
    }

    /// A command that will run inside the namespace, started without `ip netns exec`
    /// (which would also give it a private /sys, hence a private bpffs whose pins die
    /// with it).
    pub fn command(&self, program: &std::path::Path) -> Command {
        use std::os::unix::process::CommandExt as _;
        let path = format!("/run/netns/{}", self.name);
        let mut cmd = Command::new(program);
        // SAFETY: only async-signal-safe calls between fork and exec: open, setns.
        unsafe {
            cmd.pre_exec(move || {
                let f = File::open(&path)?;
                if libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }

    /// Sets a sysctl inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) {
        self.exec(&["sysctl", "-qw", &format!("{key}={value}")]);
    }

    /// Runs `f` on a thread that has entered this namespace: sockets and
    /// `BPF_PROG_TEST_RUN` calls made there see its interfaces and routes.
    pub fn enter<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let (path, file) = self.open();
        std::thread::scope(|s| {
            s.spawn(|| {
                join_netns(&path, &file);
                f()
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }

    /// Like `enter`, but returns at once: `f` runs on a new thread inside the namespace
    /// (for work that goes on while the caller does other things; join it).
    pub fn spawn_thread<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> std::thread::JoinHandle<R> {
        let (path, file) = self.open();
        std::thread::spawn(move || {
            join_netns(&path, &file);
            f()
        })
    }

    fn open(&self) -> (String, File) {
        let path = format!("/run/netns/{}", self.name);
        let file = File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
        (path, file)
    }

    /// The index of an interface inside the namespace.
    pub fn ifindex(&self, iface: &str) -> u32 {
        let out = self.exec(&["cat", &format!("/sys/class/net/{iface}/ifindex")]);
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("ifindex")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// On a signal: kills what still runs in namespace `name` (all of it started by this
/// process), then deletes the namespace.
fn remove_netns(name: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(pid) = pid.parse::<libc::pid_t>() {
                // SAFETY: kill(2) of a process in this process's own namespace.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    let _ = Command::new("ip").args(["netns", "del", name]).status();
}

/// Moves the calling thread into the network namespace open as `file`.
fn join_netns(path: &str, file: &File) {
    // SAFETY: setns on this thread only, with a valid namespace descriptor.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
}

/// A process started by a test, killed (by PID) on drop.
pub struct Proc {
    child: Option<Child>,
    what: String,
    _on_signal: Option<crate::cleanup::OnSignal>,
}

impl Proc {
    /// Takes charge of a process started elsewhere.
    pub fn from_child(child: Child, what: &str) -> Self {
        Proc {
            _on_signal: crate::cleanup::kill_on_signal(child.id()),
            child: Some(child),
            what: what.to_string(),
        }
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The PID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or_default()
    }

    /// Whether the process has exited (it is reaped then); a killed one has.
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            None => true,
            Some(c) => matches!(c.try_wait(), Ok(Some(_))),
        }
    }

    /// Panics if the process already exited, showing what it printed.
    pub fn assert_running(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        if let Ok(Some(status)) = child.try_wait() {
            let out = self.child.take().map(|c| c.wait_with_output());
            let text = match out {
                Some(Ok(o)) => format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ),
                _ => String::new(),
            };
            panic!("{} exited with {status}: {text}", self.what);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `cond` every 10 ms until it holds or `timeout` passes; panics with `what`.
pub fn wait_until(what: &str, timeout: std::time::Duration, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Polls `check` every `every` until it returns `Ok`, or `timeout` passes; then panics
/// with `why` of its last `Err`. The message is built only then (it may read logs), so
/// each attempt costs only the check.
pub fn settle<T, E>(
    timeout: std::time::Duration,
    every: std::time::Duration,
    mut check: impl FnMut() -> Result<T, E>,
    why: impl FnOnce(E) -> String,
) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match check() {
            Ok(v) => return v,
            Err(e) if std::time::Instant::now() >= deadline => panic!("{}", why(e)),
            Err(_) => std::thread::sleep(every),
        }
    }
}

/// Polls `f` every 10 ms until it returns `Ok` or `timeout` passes; then panics with
/// `what` and the last error.
pub fn poll<T>(
    what: &str,
    timeout: std::time::Duration,
    mut f: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if std::time::Instant::now() >= deadline => {
                panic!("{what}: still failing after {timeout:?}: {e}")
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
}
